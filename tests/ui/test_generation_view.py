"""The Generate tab's step view and KV panel without Gradio (ui/services/generation/,
ui/views/generate.py, ui/plots/generation.py): traces of
tiny random models, their messages, the cap and the export's pooling; then the real SmolLM2: a generated token's
row equals a full capture's row at that position, and the cache the core allocates is the formula's size."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from core import load_model
from core.machine.growth import growth
from tiny_app_model import build_tiny_llama, build_tiny_marian
from ui.plots import generation as plots_generation
from ui.plots import text as plots_text
from ui.plots.base import CHOSEN_COLOR
from ui.services import generation
from ui.services.generation import kv_cache, trace as traces
from ui.services.checks import UserError
from ui.services.kept import KeptStore, nbytes_of
from ui.views import generate as generate_views

KEPT = KeptStore(budget_bytes=10**9)  # the server-wide store these traces keep their rows in

PROMPT = "The lighthouse keeper rowed out to the rocks"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load_model(build_tiny_llama(tmp_path_factory.mktemp("gen-view") / "llama"))


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    return load_model(build_tiny_marian(tmp_path_factory.mktemp("gen-view") / "marian"))


def trace_of(model, prompt=PROMPT, n=8, temperature=0.0, seed=0, kept=KEPT):
    updates = list(generation.stream_trace(model, "tiny", prompt, False, n, temperature, 0, 1.0, seed, kept))
    assert updates, "nothing was streamed"
    return updates[-1][1]


def test_the_modules_import_neither_gradio_nor_torch_in_the_plots():
    code = ("import sys, ui.services.generation, ui.services.generation.trace, ui.services.generation.kv_cache, ui.views.generate, "
            "ui.plots.generation; print('gradio' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    code = "import sys, ui.plots.generation, ui.plots.text; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_trace_keeps_each_tokens_row_and_top10(llama):
    trace = trace_of(llama)
    cfg = llama.config
    assert trace.done and len(trace.tokens) == len(trace.rows(KEPT)) == len(trace.top_probs) > 0
    for i, rows in enumerate(trace.rows(KEPT)):
        assert rows.dtype == np.float16 and rows.shape == (cfg.n_layers, cfg.n_heads, len(trace.prompt_ids) + i)
        np.testing.assert_allclose(rows.astype(np.float32).sum(-1), 1.0, atol=2e-3)
        assert np.all(np.diff(trace.top_probs[i]) <= 0) and len(trace.top_ids[i]) == generation.TOP_PROBS
        assert trace.chosen_rank[i] == 1 and trace.top_ids[i][0] == trace.tokens[i]  # greedy


def test_the_picked_tokens_rank_and_probability_follow_the_full_distribution(llama):
    trace = trace_of(llama, n=20, temperature=2.0, seed=3)
    assert any(r > 1 for r in trace.chosen_rank)
    for i, token in enumerate(trace.tokens):  # recompute each step's distribution from a full forward pass
        ids = torch.tensor([trace.prompt_ids + trace.tokens[:i]])
        probs = torch.softmax(llama(ids).logits[0, -1].float(), -1)
        assert trace.chosen_prob[i] == pytest.approx(float(probs[token]), abs=1e-5)
        assert trace.chosen_rank[i] == int((probs > probs[token]).sum()) + 1
        if trace.chosen_rank[i] > 1:
            view = traces.step_view(llama, trace, i, 0, 0, KEPT)
            assert f"the {traces.ordinal(trace.chosen_rank[i])} most likely" in view.sentence


def test_marian_keeps_a_cross_attention_row_over_the_source(marian):
    trace = trace_of(marian)
    cfg = marian.config
    assert trace.seq2seq and trace.prompt_ids == [cfg.decoder_start_token_id]
    for i, (rows, cross) in enumerate(zip(trace.rows(KEPT), trace.cross_rows(KEPT))):
        assert rows.shape == (cfg.n_layers, cfg.n_heads, 1 + i)
        assert cross.shape == (cfg.n_layers, cfg.n_heads, len(trace.source_ids))
        np.testing.assert_allclose(cross.astype(np.float32).sum(-1), 1.0, atol=2e-3)
    view = traces.step_view(marian, trace, 1, 1, 2, KEPT)
    assert len(view.keys) == 2 and len(view.source_keys) == len(trace.source_ids)
    assert view.numbers()["cross_head_row"] == pytest.approx(trace.cross_rows(KEPT)[1][1, 2].astype(float).tolist())


def test_the_step_view_checks_its_settings(llama):
    with pytest.raises(UserError, match="Generate something first"):
        traces.step_view(llama, None, 0, 0, 0, KEPT)
    trace = trace_of(llama, n=4)
    for args, message in (((4, 0, 0), "Step must be between 0 and 3"), ((0, 2, 0), "Layer must be between 0 and 1"),
                          ((0, 0, -1), "Head must be between 0 and 3"), (("x", 0, 0), "Step must be .*0 to 3")):
        with pytest.raises(UserError, match=message):
            traces.step_view(llama, trace, *args, KEPT)
    with pytest.raises(UserError, match="prompt is empty"):
        trace_of(llama, prompt=" ")


def test_rows_past_the_cap_are_dropped_and_the_page_says_so(llama, monkeypatch):
    full = trace_of(llama, n=6)
    per_token = full.rows(KEPT)[0].nbytes
    monkeypatch.setattr(generation, "MAX_TRACE_BYTES", 3 * per_token + per_token // 2)
    trace = trace_of(llama, n=6)
    assert trace.rows_kept(KEPT) == 3 and trace.rows(KEPT)[3] is None and len(trace.top_probs) == 6
    assert trace.row_bytes <= generation.MAX_TRACE_BYTES
    view = traces.step_view(llama, trace, 5, 0, 0, KEPT)
    assert view.rows is None and "first 3 of 6 tokens" in view.note
    assert view.top_probs.shape == (generation.TOP_PROBS,)


def test_rows_live_in_the_servers_kept_budget_and_a_sessions_next_trace_replaces_them(llama, monkeypatch):
    kept = KeptStore(budget_bytes=10**9)
    first = trace_of(llama, n=4, kept=kept)
    # the whole trace is kept and counted: its rows, its probabilities and its texts
    assert kept.nbytes == nbytes_of(kept.find(first.ref())) > first.row_bytes > 0 and first.rows_kept(kept) == 4
    updates = list(generation.stream_trace(llama, "tiny", PROMPT, False, 3, 0.0, 0, 1.0, 0, kept, previous=first))
    second = updates[-1][1]
    assert second.ticket == first.ticket and len(kept) == 1  # the session's one entry, now the new trace's
    assert kept.nbytes == nbytes_of(kept.find(second.ref())) and first.rows_kept(kept) == 0
    assert second.rows_kept(kept) == 3
    with pytest.raises(UserError, match="Temperature"):  # a refused call takes nothing from the session's trace
        list(generation.stream_trace(llama, "tiny", PROMPT, False, 3, 9.0, 0, 1.0, 0, kept, previous=second))
    assert second.rows_kept(kept) == 3 and not second.rows_dropped(kept)
    kept.put("another session", ("x",), None, kept.budget_bytes)  # someone else needs the whole budget
    assert second.rows_kept(kept) == 0 and second.rows_dropped(kept) and len(second.top_probs) == 3
    view = traces.step_view(llama, second, 1, 0, 0, kept)
    assert view.rows is None and "dropped to keep the server's memory within its budget" in view.note


def test_a_finished_trace_is_reused_for_the_same_settings(llama):
    first = generation.run_trace(llama, "tiny", None, PROMPT, False, 4, 0.0, 0, 1.0, 0, KEPT)
    assert generation.run_trace(llama, "tiny", first, PROMPT, False, 4, 0.0, 0, 1.0, 0, KEPT) is first
    assert generation.run_trace(llama, "tiny", first, PROMPT, False, 5, 0.0, 0, 1.0, 0, KEPT) is not first


def test_the_export_pools_when_the_rows_would_not_fit(llama, tmp_path, monkeypatch):
    trace = trace_of(llama)
    path, note = generate_views.export_trace(llama, trace, KEPT, tmp_path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["attention"]["layout"] == "per head" and "pooled" not in note
    np.testing.assert_allclose(np.array(data["attention"]["self"][2]), trace.rows(KEPT)[2].astype(np.float32), atol=1e-5)
    full_size = path.stat().st_size
    monkeypatch.setattr(generate_views, "MAX_EXPORT_BYTES", full_size - 1)
    path, note = generate_views.export_trace(llama, trace, KEPT, tmp_path / "..")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["attention"]["layout"] == "mean over heads" and "pooled: each layer's heads averaged" in note
    np.testing.assert_allclose(np.array(data["attention"]["self"][2]), trace.rows(KEPT)[2].astype(np.float32).mean(1),
                               atol=1e-5)
    monkeypatch.setattr(generate_views, "MAX_EXPORT_BYTES", 100)
    path, note = generate_views.export_trace(llama, trace, KEPT, tmp_path)
    assert json.loads(path.read_text(encoding="utf-8"))["attention"]["self"][0] is None and "left out" in note


def test_kv_sizes_follow_the_formula_for_a_decoder_and_an_encoder_decoder(llama, marian):
    cfg = llama.config
    sizes = kv_cache.kv_sizes(llama, [], list(range(5, 25)))
    assert sizes.allocated == sizes.formula_allocated == 2 * cfg.n_layers * 20 * cfg.n_kv_heads * cfg.head_dim * 4
    full = sizes.numbers["lengths"]["full context"]
    assert full["mqa"]["bfloat16"] == kv_cache.kv_bytes(cfg.n_layers, cfg.max_positions, 1, cfg.head_dim, 2)
    assert full["no_gqa"]["float32"] == full["model"]["float32"] * cfg.n_heads // cfg.n_kv_heads
    m = marian.config
    sizes = kv_cache.kv_sizes(marian, list(range(5, 17)), [m.decoder_start_token_id, 7, 8])
    per_token = 2 * m.n_layers * m.n_kv_heads * m.head_dim * 4
    assert sizes.allocated == sizes.formula_allocated == per_token * (3 + 12)  # self (3) + cross (12 source)


def test_kv_timing_writes_the_same_tokens_and_fits_exponents(llama, monkeypatch):
    report = kv_cache.kv_report(llama, PROMPT)
    t = report.timing
    assert t.same_tokens and t.new_tokens == len(t.cached_steps) == len(t.uncached_steps)
    assert t.lengths == list(kv_cache.KV_LENGTHS) and np.isfinite(t.uncached_exponent)
    assert f"{report.sizes.allocated:,} bytes" in report.note
    with pytest.raises(UserError, match="prompt is empty"):
        kv_cache.kv_report(llama, "")
    # the exponents are core.machine.growth's one fit of the steps timed here
    assert t.uncached_exponent == growth(t.lengths, t.uncached_at).exponent
    assert t.cached_exponent == growth(t.lengths, t.cached_at).exponent


def test_the_step_figures_and_html():
    fig = plots_generation.top_probs_figure(["a", "b", "<c>"], np.array([0.5, 0.3, 0.1]), 1, "top 3")
    assert list(fig.data[0].marker.color) == [plots_generation.OTHER_COLOR, CHOSEN_COLOR,
                                              plots_generation.OTHER_COLOR]
    html = plots_text.shaded_text_html(["<b>", " x", " y", " z"], np.array([0.2, 0.8]), 2, "cap & <t>")
    assert "&lt;b&gt;" in html and "cap &amp; &lt;t&gt;" in html and "<b>" not in html.replace("<b>source", "")
    assert html.count("data-weight") == 2 and 'class="tok current" data-pos="2"' in html and "tok later" in html
    overview = plots_generation.step_overview_figure(np.ones((6, 3)) / 3, ["0 a", "1 b", "2 c"], 3, "t")
    assert list(overview.data[0].y) == ["L0 H0", "L0 H1", "L0 H2", "L1 H0", "L1 H1", "L1 H2"]
    with pytest.raises(ValueError, match="3 keys for rows of 2"):
        plots_generation.step_rows_figure(["a", "b", "c"], np.ones(2), np.ones(2), 0, "t")


# ---------------------------------------------------------------- the real SmolLM2


@pytest.fixture(scope="module")
def smollm():
    from core.store import WeightsUnavailable

    try:
        return load_model("smollm2-135m-instruct", device="cpu")
    except WeightsUnavailable as error:
        pytest.skip(f"smollm2-135m-instruct: no weight source reachable:\n{error}")


@pytest.mark.real_weights
def test_smollm2_step_rows_equal_a_full_capture_and_the_cache_is_the_formulas_size(smollm):
    trace = trace_of(smollm, prompt="The keeper climbed the stairs and", n=8)
    ids = torch.tensor([trace.prompt_ids + trace.tokens])
    with torch.inference_mode():
        full = torch.stack(smollm(ids, capture_attention=True).attentions)[:, 0].float().numpy()  # [L, H, T, T]
    start = len(trace.prompt_ids)
    for step in range(len(trace.tokens)):
        context = start + step
        for layer in (0, 14, 29):
            view = traces.step_view(smollm, trace, step, layer, 4, KEPT)
            reference = full[:, :, context - 1, :context]  # the query that wrote the token: the one before it
            # ≤ 1e-4 apart, on top of the float16 the rows are kept in (relative rounding 2^-11)
            np.testing.assert_allclose(view.rows, reference, atol=1e-4, rtol=2**-11)
            np.testing.assert_allclose(view.mean_row, reference[layer].mean(0), atol=1e-4, rtol=2**-11)
    cfg = smollm.config
    sizes = kv_cache.kv_sizes(smollm, [], trace.prompt_ids + trace.tokens)
    formula = 2 * cfg.n_layers * ids.shape[1] * cfg.n_kv_heads * cfg.head_dim * 4
    assert sizes.allocated == sizes.formula_allocated == formula
