"""Every log axis the app draws names whole numbers only: its decades (or the lengths a lesson measured), each
label the number it stands at, inside the axis's range, never plotly's bare minor digits ("10, 2, 5, 100" or
"8 9 1 2"); and a quantity that grows linearly is drawn on linear axes."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ui.plots.base import decade_label, log_axis
from ui.plots.generation import kv_timing_figure
from ui.plots.lab import Curve, training_curves
from ui.services.learn import Measured
from ui.views.learn import block, generation, positions, recurrence, setup
from ui.views.learn import cost as cost_views

UI = Path(__file__).resolve().parents[2] / "ui"
LENGTHS, COST_LENGTHS = [64, 128, 256, 512, 1024, 2048], [32, 64, 128, 256]
SUPERSCRIPTS = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")


def label_value(text: str) -> float:
    """What a tick label says: '1,024', '0.01', '10⁻⁹'."""
    if text.startswith("10") and len(text) > 2 and text[2] in "⁻⁰¹²³⁴⁵⁶⁷⁸⁹":
        return 10.0 ** int(text[2:].translate(SUPERSCRIPTS))
    return float(text.replace(",", ""))


def measured(values: dict) -> Measured:
    return Measured(answer=0.0, answer_text="", why="", alt="", values=values)


def figures():
    """(name, figure) for every figure the app makes with a log axis, on made-up values of their usual spans."""
    lengths = LENGTHS
    rng = np.random.default_rng(0)
    curve = Curve("run", np.arange(200), np.geomspace(4.2, 0.03, 200), np.arange(0, 200, 50),
                  np.array([4.0, 1.1, 0.2, 0.05]), np.array([0.0, 0.3, 0.8, 1.0]))
    grads = SimpleNamespace(models=[SimpleNamespace(name=n, gradient_trained=np.geomspace(1, 1e-25, 40),
                                                    gradient_untrained=np.geomspace(1, 1e-3, 40))
                                    for n in ("GRU", "attention")])
    shares = {"layers": np.arange(6), "mlp": [8.0, 9.5, 11.0, 14.0, 30.0, 640.0], "attn": [0.13, 2.0, 3.0, 4.0, 5.0, 9.0],
              "n_tokens": 40, "asked_layer": 3}
    shuffle = {"conditions": ["no positions", "RoPE"], "relative": [3.1e-8, 0.62], "n_tokens": 20, "layer": 0}
    cost = {"lengths": COST_LENGTHS, "per_head_bytes": [4096, 16384, 65536, 262144],
            "seconds": [0.011, 0.014, 0.019, 0.031], "exponent": 0.74}
    run_lengths = [256, 1024, 4096, 16384]
    run = {"methods": {m: {"lengths": run_lengths, "seconds": [c * n ** k for n in run_lengths], "name": m}
                       for m, c, k in (("sdpa", 1e-9, 2), ("bigbird", 2.5e-6, 1))},
           "lengths": run_lengths, "repeats": 5, "date": "2026-01-01", "on_gpu": False, "threads": 1,
           "crossover": {"method": "bigbird", "name": "BigBird", "reference": "sdpa", "n": 4096, "length": 2500.0,
                         "ratio": 0.6, "error": 0.05, "seconds": 2.5e-6 * 4096}}
    live = [{"method": m, "name": m, "short": m, "described": m, "refused": "", "shown": shown}
            for m, shown in (("topk", 1.2), ("bigbird", 1.6), ("performer", 38.0))]
    approximations = {"tokens": 150, "measure": "perplexity", "live": live, "bench": run}
    return [
        ("approximations (lesson 11)", cost_views.efficient_figure(measured(approximations))),
        ("approximations set-up", setup.approximations_setup(approximations)),
        ("kv timing", kv_timing_figure(lengths, rng.uniform(8, 12, 6), rng.uniform(8, 9, 6), [70, 900],
                                       [0.009, 0.011], [0.008, 0.0085], "t")),
        ("training curves", training_curves([curve], "t", 200)),
        ("gradient (lesson 1, Lab)", recurrence.gradient_figure(grads)),
        ("shuffle (lesson 6)", positions.shuffle_figure(measured(shuffle))),
        ("shares (lesson 7)", block.shares_figure(measured(shares))),
        ("cost (lesson 10)", generation.cost_figure(measured(cost))),
        ("shuffle set-up", setup.shuffle_setup(shuffle)),
        ("shares set-up", setup.shares_setup(shares)),
        ("cost set-up", setup.cost_setup(cost)),
    ]


def log_axes(fig):
    layout = fig.to_plotly_json()["layout"]
    return {k: v for k, v in layout.items() if re.fullmatch(r"[xy]axis\d*", k) and v.get("type") == "log"}


@pytest.mark.parametrize("name,fig", figures(), ids=[n for n, _ in figures()])
def test_every_log_axis_names_whole_numbers_inside_its_range(name, fig):
    axes = log_axes(fig)
    assert axes, f"{name}: no log axis"
    # the places a lesson measures at, known before it runs (a set-up figure has no trace), and every trace's x
    places = set(map(float, LENGTHS + COST_LENGTHS)) | {float(x) for t in fig.data if t.x is not None
                                                       for x in t.x if isinstance(x, (int, float, np.number))}
    for key, axis in axes.items():
        ticks, texts = axis.get("tickvals"), axis.get("ticktext")
        assert ticks is not None and texts is not None and len(ticks) == len(texts) >= 2, (name, key, axis)
        low, high = axis["range"]
        for tick, text in zip(ticks, texts):
            assert math.isclose(label_value(text), tick, rel_tol=1e-9), (name, key, text, tick)
            power = math.log10(tick)
            decade = math.isclose(power, round(power), abs_tol=1e-9)
            assert decade or tick in places, f"{name} {key}: {text} is neither a decade nor a measured place"
            assert low - 1e-9 <= power <= high + 1e-9, f"{name} {key}: the label {text} lies outside the range"


def test_no_log_axis_is_made_outside_the_helper():
    """A log axis made by hand (type="log" without ticks) would print plotly's bare minor digits again."""
    found = [f"{p.relative_to(UI)}:{i}" for p in UI.rglob("*.py") if p.name != "base.py"
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"""type\s*[=:]\s*["']log["']|axis_type\s*=""", line)]
    assert not found, f"log axes made without ui.plots.base.log_axis: {found}"


def test_the_data_sit_inside_the_decades_and_wide_axes_thin_their_labels():
    axis = log_axis([3e-30, 1.0])
    assert axis["range"] == [-30, 0] and axis["ticktext"][-1] == "1" and len(axis["ticktext"]) <= 8
    assert log_axis([8.0, 12.0])["ticktext"] == ["1", "10", "100"]       # "8 9 1 2" no more
    assert log_axis([0.13, 640])["ticktext"] == ["0.1", "1", "10", "100", "1,000"]
    assert [decade_label(p, plain=False) for p in (-9, 0, 1, 6)] == ["10⁻⁹", "1", "10", "10⁶"]


def test_the_kv_cache_grows_on_linear_axes_before_and_after_reveal():
    values = {"lengths": [64, 256, 1024], "allocated": [1.5e6, 6e6, 24e6], "no_gqa": [4.5e6, 18e6, 72e6],
              "kv_heads": 3, "heads": 9, "dtype": "float32", "layers": 30, "head_dim": 64, "bytes_per": 4}
    for fig in (generation.kv_cache_figure(measured(values)), setup.kv_cache_setup(values)):
        layout = fig.to_plotly_json()["layout"]
        assert layout["xaxis"]["type"] == "linear" and layout["xaxis"]["range"][0] == 0
        assert layout["xaxis"]["ticktext"] == ["0", "64", "256", "1,024"]
        assert layout.get("yaxis", {}).get("type", "linear") == "linear"
    drawn = generation.kv_cache_figure(measured(values)).data[0]
    slopes = np.diff(drawn.y) / np.diff(drawn.x)
    assert np.allclose(slopes, slopes[0])                                 # a straight line, drawn as one
