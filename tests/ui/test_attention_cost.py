"""The quadratic term, measured (ui/services/learn/cost.py): the exponents fitted from a measurement's medians over
its longest lengths, an absent or damaged file, the words the cost lesson and the Inside tab state, and the
measurement the repository ships (bench/variants/attention_cost.py --publish), which must show the n² term."""

from __future__ import annotations

import json
import math

import pytest
from tiny_app_model import build_tiny_llama

from core import load_model
from ui.services.learn import cost as inside
from ui.services.learn import generation
from ui.views.learn.cost import cost_markdown

LENGTHS = (256, 512, 1024, 2048, 4096, 8192)


def write_measurement(path, time_power=(2.0, 2.0, 2.0), peak_power=(2.0, 1.0, 1.0), model=True):
    """A file as bench/variants/attention_cost.py writes it, with seconds ∝ n^k exactly (the repeats around the
    median)."""
    def repeats(value):
        return [value * 0.9, value, value * 1.2]
    layer = []
    for n in LENGTHS:
        row = {"n": n}
        for m, tk, pk in zip(inside.COST_METHODS, time_power, peak_power):
            row[m] = {"seconds": repeats(1e-9 * n ** tk), "added": repeats(1024.0 * n ** pk)}
        layer.append(row)
    raw = {"date": "2026-01-01", "machine": "test", "command": "python bench/variants/attention_cost.py --publish",
           "threads": 1, "heads": 9, "d_head": 64, "block": 256, "repeats": 3, "fit_top": 3, "layer": layer,
           "model": None if not model else {"name": "m", "layers": 30, "heads": 9, "d_head": 64, "rows": [
               {"n": n, "seconds": repeats(0.5 + 1e-3 * n), "attention_seconds": repeats(1e-8 * n ** 2)}
               for n in (256, 512, 1024, 2048)]}}
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
