"""The quadratic term, measured (ui/services/learn/cost.py): the bench fits the exponents of a measurement's medians
over its longest lengths and writes them into its JSON (bench/variants/attention_cost.py, --refit from the saved rows),
the page reads them from there and fits nothing; an absent or damaged file, the words the cost lesson and the Inside
tab state, and the measurement the repository ships, which must show the n² term."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from tiny_app_model import build_tiny_llama

from core import load_model
from ui.services.learn import cost as inside
from ui.services.learn import generation
from ui.views.learn import cost as cost_view
from ui.views.learn.cost import cost_markdown

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import common  # noqa: E402
from variants import attention_cost as bench  # noqa: E402

LENGTHS = (256, 512, 1024, 2048, 4096, 8192)


def measurement(time_power=(2.0, 2.0, 2.0), peak_power=(2.0, 1.0, 1.0), model=True) -> dict:
    """A run's rows as bench/variants/attention_cost.py saves them, with seconds ∝ n^k exactly (the repeats around the
    median), before the bench fits its exponents."""
    def repeats(value):
        return [value * 0.9, value, value * 1.2]
    layer = []
    for n in LENGTHS:
        row = {"n": n}
        for m, tk, pk in zip(inside.COST_METHODS, time_power, peak_power):
            row[m] = {"seconds": repeats(1e-9 * n ** tk), "added": repeats(1024.0 * n ** pk)}
        layer.append(row)
    raw = {"date": "2026-01-01", "machine": "test", "command": "python bench/variants/attention_cost.py --publish",
           "threads": 1, "heads": 9, "d_head": 64, "block": 256, "repeats": 3, "peak_repeats": 3, "fit_top": 3,
           "layer": layer,
           "model": None if not model else {"name": "m", "layers": 30, "heads": 9, "kv_heads": 3, "d_head": 64,
                                            "rows": [
               {"n": n, "seconds": repeats(0.5 + 1e-3 * n), "attention_seconds": repeats(1e-8 * n ** 2)}
               for n in (256, 512, 1024, 2048)]}}
    return raw


def write_measurement(path, time_power=(2.0, 2.0, 2.0), peak_power=(2.0, 1.0, 1.0), model=True):
    """The file as the bench writes it: the rows and the exponents it fitted."""
    raw = measurement(time_power, peak_power, model)
    raw["fits"] = bench.fits(raw)
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


def test_the_exponents_are_fitted_over_the_longest_lengths(tmp_path):
    cost = inside.attention_cost(write_measurement(tmp_path / "c.json", time_power=(2.0, 1.9, 1.5)))
    assert cost.fit_lengths == (2048, 4096, 8192)
    for method, k in zip(inside.COST_METHODS, (2.0, 1.9, 1.5)):
        assert cost.layer[method].time_exponent == pytest.approx(k, abs=1e-9)
        assert cost.layer[method].fastest_exponent == pytest.approx(k, abs=1e-9)
    assert cost.layer["dense"].peak_exponent == pytest.approx(2.0, abs=1e-9)
    assert cost.layer["online"].peak_exponent == pytest.approx(1.0, abs=1e-9)
    # the whole pass: a fixed cost and a linear one, so its exponent lies well below 1 at these lengths
    assert 0 < cost.model.exponent < 1
    # the attention layers' share: one layer's kernel × the layers over the pass, growing with the length
    assert cost.model.attention_share[0] == pytest.approx(1e-8 * 256 ** 2 * 30 / (0.5 + 1e-3 * 256))
    assert cost.model.attention_share[-1] > cost.model.attention_share[0]


def test_the_page_states_the_exponents_the_json_holds_and_fits_none(tmp_path, monkeypatch):
    """Exponents written into the file unlike its rows' (as no fit of those rows would give): the page's numbers,
    words and table say the file's."""
    raw = measurement()
    raw["fits"] = bench.fits(raw)
    raw["fits"]["layer"]["dense"]["fastest"]["exponent"] = 1.234
    raw["fits"]["layer"]["online"]["time"]["exponent"] = 0.777
    raw["fits"]["layer"]["dense"]["peak"]["exponent"] = 3.21
    raw["fits"]["model"]["pass"]["exponent"] = 0.432
    path = tmp_path / "c.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    cost = inside.attention_cost(path)
    assert (cost.layer["dense"].fastest_exponent, cost.layer["online"].time_exponent) == (1.234, 0.777)
    assert cost.layer["fused"].time_exponent == pytest.approx(2.0, abs=1e-9)      # as the bench fitted it
    assert cost.model.exponent == 0.432
    words = inside.cost_sentence(cost)
    for k in ("n^1.23 on the dense path", "n^0.78 and", "peak grows as n^3.21", "grew as n^0.43"):
        assert k in words, k
    monkeypatch.setattr(cost_view, "attention_cost", lambda: cost)
    assert words in cost_view.cost_markdown()
    del raw["fits"]                                                   # a file the bench did not fit is refused
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(ValueError, match="bench/variants/attention_cost.py --publish"):
        inside.attention_cost(path)


def test_the_bench_fits_once_and_refit_writes_the_exponents_into_the_saved_file(tmp_path, monkeypatch, capsys):
    """--refit: the saved rows' exponents fitted again (core.machine.growth) and written into the file; its table states them
    and names the peaks the floor left out; the doc is left alone where it states other figures."""
    raw = measurement(time_power=(2.0, 1.9, 1.5), peak_power=(2.0, 1.0, 1.0))
    for row in raw["layer"][:5]:                                      # fused peaks under 1 MiB up to 4,096 tokens
        row["fused"]["added"] = [1000.0, 2000.0, 3000.0]
    raw["layer"][3]["online"]["added"] = [1000.0, 2000.0, 3000.0]     # and the online one's at 2,048
    path, doc = tmp_path / "attention_cost.json", tmp_path / "benchmarks.md"
    path.write_text(json.dumps(raw), encoding="utf-8")
    doc.write_text("<!-- bench:attention-cost start -->\n_old_\n\nold figures\n<!-- bench:attention-cost end -->\n")
    monkeypatch.setattr(bench, "ASSET", path)
    monkeypatch.setattr(common, "DOC", doc)
    bench.refit(publish_again=False)
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["layer"] == raw["layer"] and saved["fits"] == bench.fits(raw)
    fused = saved["fits"]["layer"]["fused"]["peak"]
    assert fused["exponent"] is None and fused["left_out"] == [2048, 4096] and fused["lengths"] == [8192]
    online = saved["fits"]["layer"]["online"]["peak"]
    assert online["exponent"] == pytest.approx(1.0, abs=1e-9) and online["left_out"] == [2048]
    assert saved["fits"]["layer"]["online"]["time"]["exponent"] == pytest.approx(1.9, abs=1e-9)
    out = capsys.readouterr().out
    for k in ("online: time ∝ n^1.90", "fused: time ∝ n^1.50", "peak ∝ – (a peak under 1 MiB)",
              "peak ∝ n^1.00 (over 4,096, 8,192 tokens: at 2,048 a peak under 1 MiB, left out)"):
        assert k in out, k
    assert "differs from the saved run's table" in out and "old figures" in doc.read_text()
    cost = inside.attention_cost(path)
    words = inside.cost_sentence(cost)
    assert "the fused kernel's too little to fit a growth to (a peak under 1.0 MiB)" in words
    assert "the online one's as n^1.00 (at 2,048 tokens a peak under 1.0 MiB, left out)" in words


def test_a_peak_too_small_to_fit_gets_no_exponent(tmp_path):
    cost = inside.attention_cost(write_measurement(tmp_path / "c.json", peak_power=(2.0, 1.0, 0.1)))
    assert math.isnan(cost.layer["fused"].peak_exponent)
    assert "too little to fit" in inside.cost_sentence(cost)


def test_the_sentence_states_what_was_measured_and_its_exponents(tmp_path):
    cost = inside.attention_cost(write_measurement(tmp_path / "c.json", time_power=(2.0, 1.9, 1.5)))
    words = inside.cost_sentence(cost)
    for k in ("n^2.00", "n^1.90", "n^1.50", "fastest of the 3 runs", "2,048–8,192 tokens", "9 heads of 64", "one thread", "256–8,192",
              "python bench/variants/attention_cost.py --publish", "linear in n", "share grows with the text",
              f"{cost.model.attention_share[0]:.0%} of the pass", f"{cost.model.attention_share[-1]:.0%}"):
        assert k in words, k
    assert "bench/" not in inside.cost_sentence(cost, command=False)


def test_an_absent_file_is_none_and_a_damaged_one_names_the_command(tmp_path):
    assert inside.attention_cost(tmp_path / "absent.json") is None
    (tmp_path / "bad.json").write_text('{"layer": []}', encoding="utf-8")
    with pytest.raises(ValueError, match="bench/variants/attention_cost.py --publish"):
        inside.attention_cost(tmp_path / "bad.json")


@pytest.fixture(scope="module")
def shipped():
    cost = inside.attention_cost()
    assert cost is not None, f"the shipped measurement is missing: `{inside.COST_BENCH} --publish` makes it"
    return cost


def test_the_shipped_measurement_shows_the_quadratic_term(shipped):
    """At the longest lengths the layer alone grows near n² in time, every method (on the fastest runs: within 0.3 of
    2; the medians, on a loaded 2-core machine, within 0.5), and the dense path's memory too, the online softmax's far
    less; in the whole pass the attention layers are a minority at the shortest length, their share rising."""
    assert shipped.fit_lengths[-1] >= 8192
    for method, layer in shipped.layer.items():   # the medians move by tenths with a shared machine's load
        assert 1.7 <= layer.fastest_exponent <= 2.3, (method, layer.fastest_exponent)
        assert 1.5 <= layer.time_exponent <= 2.5, (method, layer.time_exponent)
    assert 1.7 <= shipped.layer["dense"].peak_exponent <= 2.3
    assert shipped.layer["online"].peak[-1] < shipped.layer["dense"].peak[-1] / 4
    model = shipped.model
    assert model.attention_share[0] < 0.5                # the linear parts are most of the short pass
    assert model.attention_share[-1] > model.attention_share[0]


def test_the_inside_tab_and_the_cost_lesson_state_the_shipped_exponents(shipped, tmp_path):
    table = cost_markdown()
    assert inside.cost_sentence(shipped) in table and shipped.command in table
    for n in shipped.layer["dense"].lengths:
        assert f"| {n:,} |" in table
    model = load_model(str(build_tiny_llama(tmp_path / "llama")), device="cpu")
    measured = generation.measure_cost(model)
    assert inside.cost_sentence(shipped, command=False) in measured.why
    assert "bench/" not in measured.why
    values = measured.values["layer_cost"]
    assert values["methods"]["dense"]["time_exponent"] == shipped.layer["dense"].time_exponent


def test_the_shipped_file_holds_the_exponents_its_rows_give():
    """The exponents the page reads are the bench's one fit of the saved rows (`--refit` writes them again)."""
    raw = json.loads(inside.COST_MEASURED.read_text(encoding="utf-8"))
    assert raw["fits"] == bench.fits(raw), f"stale exponents: `python {inside.COST_BENCH} --refit` fits them again"
    cost = inside.attention_cost()
    assert cost.layer["dense"].fastest_exponent == raw["fits"]["layer"]["dense"]["fastest"]["exponent"]
    assert cost.model.exponent == raw["fits"]["model"]["pass"]["exponent"]
