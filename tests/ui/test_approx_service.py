"""The approximate-attention service on tiny models: every input it is given is checked and refused in words (model,
text, method, budget, layers, a text over the cap, what a model's stack cannot take), its numbers are
core.analysis.approx.approximation's on the same input with NaN where a head is not approximated, the published cost
run is read in the bench's documented structure (and its absence said in words), the live timing times every method
beside SDPA, and the figures hold those numbers."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from core.analysis.approx import approximation
from core.approx import Approx
from tiny_app_model import build_tiny_bert, build_tiny_llama
from ui.plots.approx import NOT_APPROXIMATED, cost_figure, error_map
from ui.services.approx import approximation_run, bytes_words, change_words
from ui.services.approx import cost as approx_cost
from ui.services.checks import UserError
from ui.services.models import ModelStore

TEXT = ("The lighthouse keeper rowed out to the rocks at dawn. When the storm passed, she climbed the stairs and lit "
        "the lamp again.")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("approx-service")
    llama, bert = str(build_tiny_llama(root / "llama")), str(build_tiny_bert(root / "bert"))
    return dict(llama=llama, bert=bert, store=ModelStore(extra_names=[llama, bert]))


def run(tiny, text=TEXT, method="topk", budget=None, layers="all", model="llama", **kw):
    return approximation_run(tiny["store"], tiny[model], text, method, budget, layers, **kw)


@pytest.mark.parametrize("args, words", [
    (dict(text=""), "The text is empty"),
    (dict(text=None), "The text is empty"),
    (dict(text=42), "The text must be a string, got a int"),
    (dict(text="x" * 2000, cap_bytes=1000), "the limit for typed and uploaded text is 0.001 MB"),
    (dict(method="sparse"), "Method must be one of topk, bigbird, performer, linformer, lowrank_kv"),
    (dict(method=["topk"]), "Method must be one of"),
    (dict(budget={"k": 0}), "Budget k (keys each query keeps) must be between 1 and 1024, got 0"),
    (dict(budget={"k": 2.5}), "Budget k (keys each query keeps) must be a whole number from 1 to 1024, got 2.5"),
    (dict(budget={"k": "many"}), "Budget k (keys each query keeps) must be a number from 1 to 1024, got 'many'"),
    (dict(budget={"k": float("nan")}), "(it must be finite)"),
    (dict(budget={"rank": 8}), "top-k takes the budget k; not rank"),
    (dict(budget=[32]), "The budget must be a JSON object such as {\"k\": 64}, got a list"),
    (dict(budget="{k: 3"), "The budget must be a JSON object such as"),
    (dict(method="performer", budget={"features": 100_000}), "Budget features (random features) must be between"),
    (dict(method="linformer", budget={"fit": "learned"}), "Linformer's fit must be one of random, fitted"),
    (dict(layers=2), "Layer must be between 0 and 1, got 2. Layers are 'all', one layer (3) or a list (0, 2, 5)"),
    (dict(layers="0, x"), "Layer must be a number from 0 to 1, got 'x'"),
    (dict(layers=[0] * 5000), "5,000 layers were given; this model has 2"),
    (dict(layers={"a": 1}), "Layer must be a number from 0 to 1, got a dict"),
    (dict(text=TEXT * 3, max_tokens=40), "tokens; the approximation reads at most 40 (this section's cap) and never "
                                         "cuts a text"),
    (dict(text="a"), "the approximation needs at least 2"),
    (dict(method="linformer"), "a causal model would read its future"),
    (dict(method="lowrank_kv", budget={"rank": 200}), "Rank 200 is above [W_K; W_V]'s full rank 32 (32 × 32)."),
    (dict(method="linformer", budget={"fit": "fitted", "rank": 999}, model="bert"),
     "A fitted Linformer keeps at most as many rows as the text has tokens"),
])
def test_bad_input_is_refused_in_words(tiny, args, words):
    with pytest.raises(UserError) as refused:
        run(tiny, **args)
    assert words in str(refused.value)


def test_an_unknown_model_is_refused_in_words(tiny):
    with pytest.raises(UserError, match="not a model name or folder|cannot be loaded"):
        approximation_run(tiny["store"], "no/such-model\x00", TEXT, "topk")
    with pytest.raises(UserError, match="Choose a model first"):
        approximation_run(tiny["store"], "", TEXT, "topk")


def test_a_text_over_the_cap_says_its_token_count(tiny):
    model = tiny["store"].get(tiny["llama"])
    n = len(model.tokenizer(TEXT * 3)["input_ids"])
    with pytest.raises(UserError, match=f"The text is {n} tokens"):
        run(tiny, text=TEXT * 3, max_tokens=n - 1)
    assert run(tiny, text=TEXT * 3, max_tokens=n).tokens == n       # at the cap: every token read


def test_the_numbers_are_the_cores_on_the_same_input(tiny):
    model = tiny["store"].get(tiny["llama"])
    ids = torch.tensor(model.tokenizer(TEXT)["input_ids"])
    got = run(tiny, budget={"k": 4}, layers="1")
    expected = approximation(model, ids, Approx("topk", [1], k=4))
    assert got.tokens == expected.tokens == len(ids)
    np.testing.assert_array_equal(got.tv, expected.tv.numpy())        # NaN where the core has NaN
    np.testing.assert_array_equal(got.z_error, expected.z_error.numpy())
    assert (got.exact, got.approximate, got.change) == (expected.exact, expected.approximate, expected.change)
    assert (got.bytes_exact, got.bytes_approx) == (expected.cache_bytes_exact, expected.cache_bytes_approx)
    # layer 0 is left exact: its row is NaN; layer 1's four heads are measured, and k = 4 changes them
    assert np.isnan(got.tv[0]).all() and np.isnan(got.z_error[0]).all()
    assert np.isfinite(got.tv[1]).all() and (got.tv[1] > 0).all() and got.layers == (1,)
    assert got.description == "top-k (k = 4)" and got.measure == "perplexity"
    answer = got.as_json()
    assert answer["tv"][0] == [None] * 4 and answer["tv"][1] == pytest.approx(got.tv[1].tolist())
    assert answer["layers"] == [1] and answer["bytes_per_token"] == {"exact": got.bytes_exact,
                                                                     "approximate": got.bytes_approx}
    json.dumps(answer, allow_nan=False)      # valid JSON: no NaN left
    words = change_words(got)
    assert f"{got.exact:,.2f} with exact attention → {got.approximate:,.2f}" in words and "on layer 1" in words


def test_layers_are_read_as_all_one_or_a_list(tiny):
    assert run(tiny, budget={"k": 4}, layers=None).layers is None
    assert run(tiny, budget={"k": 4}, layers=" ALL ").layers is None
    assert run(tiny, budget={"k": 4}, layers=[1, "0", 1]).layers == (0, 1)
    assert run(tiny, budget={"k": 4}, layers="1; 0").layers == (0, 1)


def test_a_budget_covering_every_key_is_said_to_be_exact(tiny):
    got = run(tiny, budget={"k": 1024})
    assert np.nanmax(got.z_error) < 1e-6 and "matches exact attention on this text" in change_words(got)


def test_an_encoder_under_a_fitted_linformer(tiny):
    got = run(tiny, method="linformer", budget='{"rank": 8, "fit": "fitted"}', model="bert")
    assert got.tv is None and got.measure == "cosine" and got.fitted and np.isfinite(got.z_error).all()
    assert -1 <= got.approximate <= 1 and got.change == pytest.approx(1 - got.approximate)
    assert got.as_json()["tv"] is None and "fitted to this text" in change_words(got)


# ---- the published cost run ----

def published(rows=(256, 512, 1024), device="cpu") -> dict:
    """A small run in the structure bench/variants/approx_cost.py documents and writes."""
    causal, bidirectional = ["eager", "sdpa", "topk", "bigbird", "performer"], ["sdpa_bi", "linformer"]
    base = {"eager": 2.0, "sdpa": 1.0, "topk": 3.0, "bigbird": 4.0, "performer": 5.0, "sdpa_bi": 1.0, "linformer": 2.0}
    grow = {"bigbird": 1, "performer": 1, "linformer": 1}
    out = []
    for n in rows:
        scale = n / 256
        methods = {m: {"seconds": [base[m] * 1e-3 * scale ** grow.get(m, 2) * f for f in (1.0, 1.1, 0.9)],
                       "peaks": [1000, 1000], "error": None if m in ("eager", "sdpa", "sdpa_bi") else 0.1,
                       "head_errors": None} for m in causal + bidirectional}
        out.append({"n": n, "methods": methods, "skipped": {}})
    crossover = [{"method": "bigbird", "reference": "sdpa", "n": 1024, "interpolated_n": 1000.0, "ratio": 0.5,
                  "error": 0.1, "up_to": 1024, "stays_below": True, "words": "1,024 (≈ 1,000 interpolated on log-log)"},
                 {"method": "topk", "reference": "sdpa", "n": None, "interpolated_n": None, "ratio": None,
                  "error": None, "up_to": 1024, "stays_below": False, "words": "none up to 1,024"}]
    return {"date": "2026-12-07", "machine": "a test CPU", "command": approx_cost.COST_COMMAND, "device": device,
            "threads": 1, "load_average": [1.0, 1.0], "load": "load average 1.00 → 1.00",
            "shape": {"heads": 9, "kv_heads": 3, "d_head": 64, "d_model": 576, "dtype": "float32"},
            "budgets": {"topk": {"k": 16}, "bigbird": {"block": 8, "global_blocks": 1, "random_blocks": 1},
                        "performer": {"features": 32}, "lowrank_kv": {"rank": 16}, "linformer": {"rank": 16},
                        "online": {"block": 256}},
            "repeats": 3, "peak_repeats": 2, "decode_repeats": 2, "methods": {m: f"{m} words" for m in base},
            "causal": causal, "bidirectional": bidirectional, "rule": {}, "rows": out, "fits": {},
            "crossover": crossover, "decode": {"contexts": [], "rows": []}}


def write(tmp_path, data) -> object:
    path = tmp_path / "approx_cost.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_the_published_run_is_read_in_the_benchs_structure(tmp_path):
    cost = approx_cost.published_cost(write(tmp_path, published()))
    assert list(cost.methods) == ["eager", "sdpa", "topk", "bigbird", "performer", "sdpa_bi", "linformer"]
    topk = cost.methods["topk"]
    assert topk.lengths == (256, 512, 1024) and topk.seconds == pytest.approx((3e-3, 12e-3, 48e-3))
    assert topk.low == pytest.approx((2.7e-3, 10.8e-3, 43.2e-3)) and topk.causal and not cost.methods["linformer"].causal
    words = approx_cost.published_words(cost)
    assert ("bigbird is faster than sdpa from 1,024 (≈ 1,000 interpolated on log-log), its output's relative error "
            "there 0.1; topk is not faster than sdpa up to 1,024 tokens") in words
    assert "What a GPU would change is not measured here" in words and "a test CPU, 1 thread." in words
    gpu = approx_cost.published_words(approx_cost.published_cost(write(tmp_path, published(device="cuda"))))
    assert "Measured on a GPU" in gpu and "not measured here" not in gpu
    table = approx_cost.published_table(cost)
    assert table["methods"]["bigbird"]["median_seconds"] == pytest.approx([4e-3, 8e-3, 16e-3])


def test_an_absent_or_damaged_run_is_said_in_words(tmp_path):
    assert approx_cost.published_cost(tmp_path / "none.json") is None
    assert "has not been published yet" in approx_cost.published_words(None)
    assert approx_cost.COST_COMMAND in approx_cost.published_words(None)
    broken = published()
    del broken["rows"]
    with pytest.raises(UserError, match="is not the run .* writes .*KeyError"):
        approx_cost.published_cost(write(tmp_path, broken))


@pytest.mark.parametrize("model, methods", [("llama", ["eager", "sdpa", "topk", "bigbird", "performer"]),
                                            ("bert", ["eager", "sdpa", "topk", "bigbird", "performer", "linformer"])])
def test_the_live_timing_times_every_method_beside_sdpa(tiny, tmp_path, model, methods):
    loaded = tiny["store"].get(tiny[model])
    budgets = approx_cost.live_budgets(approx_cost.published_cost(write(tmp_path, published())))
    live = approx_cost.live_cost(loaded, "tiny", budgets, lengths=(16, 32), repeats=2)
    assert list(live.seconds) == methods and live.causal == (model == "llama")
    assert all(len(runs) == 2 and all(len(r) == 2 and min(r) > 0 for r in runs) for runs in live.seconds.values())
    assert live.ratio("sdpa") == [1.0, 1.0] and live.budgets["topk"] == {"k": 16}
    cfg = loaded.config
    assert (live.heads, live.kv_heads, live.d_head) == (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)
    words = approx_cost.live_words(live)
    assert words.startswith("**Live, this machine, short lengths only**") and "top-k (k = 16)" in words
    assert approx_cost.live_table(live)["methods"]["topk"]["median_seconds"] == live.median("topk")


# ---- the figures ----

def test_the_error_map_holds_the_values_and_names_the_cells_left_exact():
    values = np.array([[np.nan, np.nan, np.nan], [0.1, 0.2, 0.3]])
    fig = error_map(values, "total variation", "title")
    heat = fig.data[0]
    z = np.asarray(heat.z, dtype=float)
    assert z.shape == (3, 2) and np.isnan(z[:, 0]).all() and z[:, 1].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert heat.text[2][0] == f"L0 H2: {NOT_APPROXIMATED}" and heat.text[1][1] == "L1 H1: total variation 0.2"
    assert heat.colorbar.title.text == "total variation"


def test_the_cost_figure_draws_each_method_and_stars_its_crossing(tmp_path):
    cost = approx_cost.published_cost(write(tmp_path, published()))
    methods = cost.methods.values()
    fig = cost_figure({m.method: m.lengths for m in methods}, {m.method: m.seconds for m in methods},
                      {m.method: m.method for m in methods}, {"bigbird": 1024}, "t")
    assert [t.meta for t in fig.data] == list(cost.methods)
    bigbird = next(t for t in fig.data if t.meta == "bigbird")
    assert list(bigbird.marker.symbol) == ["circle", "circle", "star"] and list(bigbird.y) == pytest.approx([4, 8, 16])
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert not math.isnan(fig.layout.yaxis.range[0])


# ---- the page's views ----

def test_the_page_says_a_refusal_in_its_note_and_draws_a_run(tiny, tmp_path, monkeypatch):
    from ui.services import Services
    from ui.settings import AppSettings
    from ui.views.approx import approx_view, cost_view

    services = Services.create(AppSettings(), tiny["store"])
    fields = (3, 16, 1, 1, 64, 32, "random", 0)
    note, *figures, words = approx_view(services, tiny["llama"], TEXT, "sparse", *fields, "all")
    assert note.startswith("⚠️ The approximation did not run: Method must be one of") and words == ""
    assert all(f.layout.annotations[0].text == "Not computed: the note says why." for f in figures)
    note, tv, z, change, words = approx_view(services, tiny["llama"], TEXT, "topk", *fields, "0")
    expected = run(tiny, budget={"k": 3}, layers="0")
    assert note.startswith(f"All {expected.tokens} tokens of the text read") and "on layer 0" in note
    shown = np.asarray(tv.data[0].z, dtype=float)
    np.testing.assert_allclose(shown.T[0], expected.tv[0], rtol=1e-6)
    assert shown.shape == (4, 2) and np.isnan(shown[:, 1]).all()          # [heads, layers]: layer 1 left exact
    assert list(change.data[0].y) == pytest.approx([expected.exact, expected.approximate])
    assert list(change.data[1].y) == [expected.bytes_exact, expected.bytes_approx]
    assert words == change_words(expected) + "\n\n" + bytes_words(expected)
    monkeypatch.setattr(approx_cost, "COST_MEASURED", tmp_path / "absent.json")
    figure, cost_words = cost_view(services, tiny["llama"])
    assert "has not been published yet" in figure.layout.annotations[0].text
    assert "has not been published yet" in cost_words and "**Live, this machine, short lengths only**" in cost_words


def test_the_shipped_run_is_read_or_said_to_be_missing():
    """assets/measured/approx_cost.json as the bench shipped it: every method with a row is read, each crossover
    names an approximation; before it is published the words say so and give the command."""
    shipped = approx_cost.COST_MEASURED
    if not shipped.is_file():
        assert approx_cost.published_cost() is None
        assert approx_cost.published_words(None).startswith("The cost figure has not been published yet")
        return
    raw = json.loads(shipped.read_text(encoding="utf-8"))
    cost = approx_cost.published_cost()
    assert list(cost.methods) == [m for m in raw["causal"] + raw["bidirectional"]
                                  if any(m in r["methods"] for r in raw["rows"])]
    assert {c["method"] for c in cost.crossovers} <= set(approx_cost.METHODS)
    assert ("What a GPU would change is not measured here" in approx_cost.published_words(cost)) != cost.on_gpu
