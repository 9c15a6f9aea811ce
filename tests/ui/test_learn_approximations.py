"""The approximations lesson (ui/services/learn/efficient.py): its answer is the published bench run's first
crossover of a sparse or linear approximation (read from the run as bench/variants/approx_cost.py writes it, never
worked out again), its words read their numbers from that run and from this model's measurement, and its live part
is core.analysis.approx.approximation through the model's own switch, each sequence budget scaled to the lesson's
text. Before Reveal its set-up states nothing of the answer; without the run it says the run is not published and
still measures the model. On a tiny decoder and encoder, with a run built here in the bench's documented structure
(its rows, then its own fits and crossovers), and on the real MiniLM."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from learn_checks import carries, numbers
from tiny import OneModel
from tiny_app_model import build_tiny_bert, build_tiny_llama

from core import load_model
from core.analysis.approx import approximation
from core.approx import Approx
from ui.services import learn
from ui.services.approx import cost as approx_cost
from ui.services.learn import course as syllabus
from ui.services.learn import efficient
from ui.views.learn import course as views
from ui.views.learn import setup
from ui.views.learn.cost import CROSSOVER

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from variants import approx_cost as bench  # noqa: E402

LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
NAME = "approximations"


def seconds_at(method: str, n: int) -> float:
    """A machine where exact attention grows as n² and BigBird, Performer and Linformer as n: BigBird passes the fused
    kernel at 2,500 tokens, Linformer its bidirectional one at 4,000, Performer at 6,000; top-k never (it scores
    every key); the low-rank projection is cheaper than the full one at every length."""
    return {"sdpa": 1e-9 * n * n, "eager": 2e-9 * n * n, "online": 1.5e-9 * n * n, "topk": 1.3e-9 * n * n,
            "bigbird": 2.5e-6 * n, "performer": 6e-6 * n, "sdpa_kv": 1e-9 * n * n + 1e-6 * n,
            "lowrank_kv": 1e-9 * n * n + 0.3e-6 * n, "sdpa_bi": 2e-9 * n * n, "linformer": 8e-6 * n}[method]


def run(device: str = "cpu") -> dict:
    """A run as the bench writes it (its docstring's keys), its fits and crossovers made by the bench's own
    functions from its rows."""
    setup_ = bench.Setup(heads=9, kv_heads=3, d_head=64, d_model=576)
    rows = []
    for n in LENGTHS:
        methods = {}
        for m in bench.METHODS:
            t = seconds_at(m, n)
            methods[m] = {"seconds": [t * 0.95, t, t * 1.1], "peaks": [1e6 * n, 1.1e6 * n, 1.2e6 * n],
                          "error": None if m not in bench.REFERENCE or m in ("eager", "online") else 0.05 + n * 1e-6,
                          "head_errors": None}
        rows.append({"n": n, "methods": methods, "skipped": {}})
    return {"date": "2026-01-02", "machine": "a test CPU, 2 cores", "command": "python bench/variants/approx_cost.py",
            "device": device, "threads": 1, "load_average": [0.5, 0.6], "load": "load average 0.50 → 0.60",
            "shape": {"heads": 9, "kv_heads": 3, "d_head": 64, "d_model": 576, "dtype": "float32"},
            "budgets": setup_.budgets(), "repeats": 3, "peak_repeats": 3, "decode_repeats": 3,
            "methods": {m: bench.WORDS[m] for m in bench.METHODS}, "causal": list(bench.CAUSAL),
            "bidirectional": list(bench.BIDIRECTIONAL), "rule": {}, "rows": rows, "fits": bench.fits(rows, 2048),
            "crossover": bench.crossovers(rows), "decode": {"contexts": [], "rows": []}}


def publish(tmp_path, monkeypatch, raw: dict | None) -> None:
    path = tmp_path / "approx_cost.json"
    if raw is not None:
        path.write_text(json.dumps(raw), encoding="utf-8")
    monkeypatch.setattr(approx_cost, "COST_MEASURED", path)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learn-approximations")
    return {"tiny-llama": load_model(str(build_tiny_llama(folder / "llama")), device="cpu"),
            "tiny-bert": load_model(str(build_tiny_bert(folder / "bert")), device="cpu")}


def services_for(model):
    return SimpleNamespace(models=OneModel(model), lessons=syllabus.LessonCache())


def strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in strings(item)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in strings(item)]
    return []


def test_the_lesson_follows_the_cost_lesson_and_keeps_the_others_names():
    names = syllabus.names()
    assert names.index(NAME) == names.index("cost") + 1 and len(names) == 14
    assert names[-3:] == ["sinks", "not-explanations", "composition"]
    assert syllabus.position(NAME) == (11, 14)


def test_the_answer_is_the_runs_first_sparse_or_linear_crossover(tmp_path, monkeypatch):
    """The bench's own crossovers: BigBird first (2,500 on the line between 2,048 and 4,096), not the low-rank
    projection, which is faster from the first length but is no sparse or linear attention."""
    raw = run()
    publish(tmp_path, monkeypatch, raw)
    cost = efficient.published()
    crossing = {c["method"]: c for c in raw["crossover"]}
    first = efficient.first_crossover(cost)
    assert first == crossing["bigbird"] and first["n"] == 4096
    assert efficient.crossing_length(first) == pytest.approx(2500, rel=1e-9)
    assert crossing["lowrank_kv"]["n"] == 256 and crossing["topk"]["n"] is None
    assert efficient.crossing_length(crossing["linformer"]) == pytest.approx(4000, rel=1e-9)


def test_the_words_read_the_run_and_the_model(tmp_path, monkeypatch, tiny_models):
    """Numbers written into the run unlike what its rows would give (the interpolated length, the ratio, the error):
    the answer and its words say the run's; the live numbers are approximation() through the model's switch at the
    budgets scaled to the text (k = 256 of 4,096 keys → the same share of the text's tokens)."""
    raw = run()
    bigbird = next(c for c in raw["crossover"] if c["method"] == "bigbird")
    bigbird.update(interpolated_n=2345.6, ratio=0.777, error=0.0321)
    publish(tmp_path, monkeypatch, raw)
    model = tiny_models["tiny-llama"]
    measured = efficient.measure_efficient(model)
    assert measured.answer == 2345.6
    words = measured.answer_text
    assert "≈2,346 tokens" in words and "0.78×" in words and "relative error there 0.032" in words
    assert "≈2,346" in measured.alt
    for c in raw["crossover"]:   # every other approximation's crossover, in the run's own words
        if c["method"] != "bigbird":
            assert c["words"] in words, c["method"]
    assert "a test CPU, 2 cores" in measured.why and "2026-01-02" in measured.why
    assert "What a GPU would change is not measured here" in measured.why
    tokens = measured.values["tokens"]
    assert tokens == len(model.tokenizer(efficient.EFFICIENT_SAMPLE)["input_ids"])
    live = {r["method"]: r for r in measured.values["live"]}
    k = round(256 * tokens / 8192)      # top-k was never faster: the share it kept at the longest length timed
    direct = approximation(model, efficient.sample_ids(model), Approx("topk", k=k))
    assert live["topk"]["described"] == f"top-k (k = {k})"
    assert live["topk"]["approximate"] == pytest.approx(direct.approximate, rel=1e-6)
    assert live["topk"]["exact"] == pytest.approx(direct.exact, rel=1e-6)
    assert f"{learn.number(direct.approximate)} with top-k (k = {k})" in words
    assert live["linformer"]["refused"] and "Linformer was not run" in words   # a decoder reads no mixed rows
    # BigBird: the share it kept where it first ran faster (4,096); Performer's features count no keys
    assert live["bigbird"]["described"].startswith(f"BigBird (block = {round(64 * tokens / 4096)}")
    assert live["performer"]["described"] == "Performer (features = 256)"
    assert "top-k's k = 256 of 8,192, BigBird's block = 64 of 4,096, Linformer's rank = 256 of 4,096" in words


def test_a_gpu_run_is_not_said_to_be_missing(tmp_path, monkeypatch, tiny_models):
    publish(tmp_path, monkeypatch, run(device="cuda"))
    measured = efficient.measure_efficient(tiny_models["tiny-bert"])
    assert "not measured here" not in measured.why and "on a GPU" in measured.why


def test_the_set_up_holds_no_answer_and_reveal_draws_the_run(tmp_path, monkeypatch, tiny_models):
    """Before Reveal: axes without traces, labelled at the decades (not at the run's lengths), nothing stating the
    answer or the line; on Reveal the run's medians per method, the crossover at the answer, the guess as a line
    across the time panel, and this model's bars."""
    raw = run()
    publish(tmp_path, monkeypatch, raw)
    for name, model in tiny_models.items():
        services = services_for(model)
        page = views.lesson_page(services, name, NAME)
        result = views.measured(services, name, syllabus.find(NAME))
        figure = page.figure.to_plotly_json()
        before = "\n".join([page.place, page.text, page.question, *strings(figure)])
        assert not page.figure.data and page.figure.layout.hovermode is False
        assert learn.number(result.answer) not in before and result.alt not in before
        axes = [v for key, axis in figure["layout"].items() if key.startswith(("xaxis", "yaxis"))
                for v in [*axis.get("range", []), *axis.get("tickvals", [])]]
        assert not carries(axes, result.answer)
        assert not set(LENGTHS) & set(numbers(page.figure.layout.xaxis.tickvals)), "a length timed is named"
        words, whole, line = views.revealed(services, name, NAME, "1500")
        assert line == result.alt and f"Your guess: 1,500 tokens; measured: {learn.number(result.answer)}" in words
        drawn = {t.name: t for t in whole.data}
        sdpa = drawn["exact, fused"]
        rows = {r["n"]: r for r in raw["rows"]}
        assert list(sdpa.x) == list(LENGTHS)
        assert list(sdpa.y) == pytest.approx([1e3 * sorted(rows[n]["methods"]["sdpa"]["seconds"])[1] for n in LENGTHS])
        (cross,) = [t for t in whole.data if t.name and t.name.startswith(CROSSOVER)]
        assert list(cross.x) == [result.answer] * 2
        (guess,) = [t for t in whole.data if t.name == setup.GUESS]
        assert list(guess.x) == [1500.0, 1500.0] and guess.xaxis in (None, "x")
        bars = [t for t in whole.data if t.type == "bar"]
        assert len(bars) == 1 and list(bars[0].y) == [r["shown"] for r in result.values["live"] if not r["refused"]]


def test_without_the_run_the_lesson_says_so_and_still_measures_the_model(tmp_path, monkeypatch, tiny_models):
    publish(tmp_path, monkeypatch, None)
    model = tiny_models["tiny-bert"]
    services = services_for(model)
    result = views.measured(services, "tiny-bert", syllabus.find(NAME))
    assert result.answer == "not published" and "not published" in result.answer_text
    assert result.values["bench"] is None
    words, whole, _ = views.revealed(services, "tiny-bert", NAME, "1500")
    assert "Measured: nothing (not published)" in words
    assert [t.type for t in whole.data] == ["bar"]                        # the model's bars alone; no guess to mark
    live = {r["method"]: r for r in result.values["live"]}
    assert live["linformer"]["refused"] == ""                            # an encoder takes Linformer
    direct = approximation(model, efficient.sample_ids(model), Approx("linformer", rank=32))
    assert live["linformer"]["approximate"] == pytest.approx(direct.approximate, rel=1e-6)
    page = views.lesson_page(services, "tiny-bert", NAME)
    assert not page.figure.data and [str(t) for t in page.figure.layout.xaxis.ticktext] == [
        r["short"] for r in result.values["live"] if not r["refused"]]


def test_a_damaged_run_is_named_with_the_command_that_remakes_it(tmp_path, monkeypatch):
    raw = run()
    del raw["rows"]
    publish(tmp_path, monkeypatch, raw)
    with pytest.raises(Exception, match="approx_cost.json is not the run"):
        efficient.published()


def test_the_encoder_is_measured_by_its_embedding_on_minilm(tmp_path, monkeypatch):
    """MiniLM with the bench's run: every approximation runs (Linformer too), each leaves the embedding's cosine
    below 1, and the live panel's bars are those cosines."""
    from core.store import WeightsUnavailable, ensure

    try:
        folder = ensure("minilm-l6")
    except WeightsUnavailable as error:
        pytest.skip(f"minilm-l6 is not installed here: {error}")
    publish(tmp_path, monkeypatch, run())
    measured = efficient.measure_efficient(load_model(folder, device="cpu"))
    assert measured.values["measure"] == "cosine"
    live = measured.values["live"]
    assert [r["method"] for r in live] == list(efficient.LIVE) and not any(r["refused"] for r in live)
    assert all(-1 <= r["shown"] < 1 and math.isfinite(r["tv"] if r["tv"] is not None else 0) for r in live)
    assert f"{live[0]['approximate']:.3f} with {live[0]['described']}" in measured.answer_text
