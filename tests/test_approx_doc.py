"""docs/approximations.md's measurements are scripts/approx_accuracy.py's rendering of the run it saved
(assets/measured/approx_accuracy.json): the section equals what the renderer makes from that file, every number in it
is one of the file's to the precision printed, the hand-written rest of the page holds no measured figure, and the
saved summaries hold together (intervals around their means and inside their ranges, percent = 100 × the change,
each map's mean its cells'). No model runs here."""
import importlib.util
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "approximations.md"
SAVED = ROOT / "assets" / "measured" / "approx_accuracy.json"
SECTION = re.compile(r"<!-- bench:approximations start -->.*?<!-- bench:approximations end -->", re.S)
NUMBER = re.compile(r"−?\d+(?:\.\d+)?")     # the renderer prints a negative with U+2212; '-' is a hyphen in names
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def script():
    spec = importlib.util.spec_from_file_location("approx_accuracy", ROOT / "scripts" / "approx_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def saved() -> dict:
    import json
    return json.loads(SAVED.read_text(encoding="utf-8"))


def section(text: str) -> str:
    found = SECTION.findall(text)
    assert len(found) == 1, f"docs/approximations.md holds {len(found)} approximations sections, one expected"
    return found[0]


UNPRINTED = {"map", "each"}     # the per-head maps and per-text values: thousands of numbers the page never prints


def leaves(value, numbers: list[float], words: set[str]) -> None:
    """Every number in a saved run but its maps and per-text values, and every number written inside its strings
    (the command, machine, notes): the page's figures must be among these, and so many numbers would hold almost
    any figure."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in UNPRINTED:
                leaves(item, numbers, words)
    elif isinstance(value, list):
        for item in value:
            leaves(item, numbers, words)
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, (int, float)):
        numbers.append(float(value))
    elif isinstance(value, str):
        words.update(NUMBER.findall(THOUSANDS.sub("", value)))


def not_in_run(text: str, run: dict) -> list[str]:
    """The numbers of `text` (thousands' commas dropped) that are no number of the run as printed to the same
    decimals, nor written in its strings."""
    numbers, words = [], set()
    leaves(run, numbers, words)
    printed = {d: {f"{v:.{d}f}".replace("-", "−") for v in numbers} | {f"{abs(v):.{d}f}" for v in numbers}
               for d in range(5)}
    missing = []
    for token in NUMBER.findall(THOUSANDS.sub("", text)):
        decimals = len(token.split(".")[1]) if "." in token else 0
        if token not in words and token not in printed.get(decimals, set()):
            missing.append(token)
    return missing


def test_the_section_is_the_rendering_of_the_saved_run():
    assert section(DOC.read_text(encoding="utf-8")) == script().block(saved()), (
        "docs/approximations.md's section differs from what scripts/approx_accuracy.py renders from "
        "assets/measured/approx_accuracy.json: run `python scripts/approx_accuracy.py --render` (or publish a new run)")


def test_every_number_in_the_tables_is_in_the_saved_run():
    text, run = section(DOC.read_text(encoding="utf-8")), saved()
    assert len(NUMBER.findall(text)) > 300       # three models' tables, not an empty section
    assert not not_in_run(text, run), f"figures not in assets/measured/approx_accuracy.json: {not_in_run(text, run)}"
    # the check can fail: a figure typed into the section is caught
    assert not_in_run(text.replace("### ", "Top-k costs 0.8137 here.\n\n### ", 1), run) == ["0.8137"]


def test_the_hand_written_rest_of_the_page_holds_no_measured_figure():
    rest = SECTION.sub("", DOC.read_text(encoding="utf-8"))
    assert not [t for t in NUMBER.findall(rest) if "." in t]
    assert "%" not in rest


def test_the_saved_summaries_hold_together():
    run = saved()
    s = run["settings"]
    assert [m["name"] for m in run["models"]] == list(script().MODELS)
    runs = 0
    for model in run["models"]:
        perplexity = model["measure"] == "perplexity_change"
        assert perplexity == (model["name"] != "minilm-l6")
        assert ("linformer" in model["refusals"]) == perplexity        # the core refuses it on a causal model
        for corpus in model["corpora"].values():
            assert corpus["items"] == len(corpus["tokens"]["each"]) >= s["min_items"]
            for r in corpus["runs"]:
                if "refused" in r:
                    assert r["method"] == "linformer" and r["budget"]["fit"] == "fitted"
                    continue
                runs += 1
                c = r["change"]
                assert r["n"] == c["n"] == corpus["items"] - len(r["left_out"])
                if r["n"] < s["min_items"]:
                    assert c["low"] is None and c["interval"] is None
                else:
                    assert c["low"] <= c["mean"] + 1e-9 and c["mean"] <= c["high"] + 1e-9, r
                    assert c["interval"] == "percentile bootstrap"
                    assert c["low"] >= -1 and (perplexity or c["high"] <= 1)     # a perplexity change ≥ −1 too
                if perplexity:
                    for key in ("mean", "low", "high"):
                        if c[key] is not None:
                            assert c["percent"][key] == pytest.approx(100 * c[key], abs=1e-4)
                else:
                    assert -1 <= (c["low"] if c["low"] is not None else c["mean"]) <= c["mean"] <= 1
                    assert r["measure"]["exact"] == 1 and r["measure"]["approximate"] == pytest.approx(c["mean"])
                assert r["cache_bytes"]["approximate"] <= r["cache_bytes"]["exact"]
                for name, top in (("tv", 1.0), ("z_error", math.inf)):
                    errors = r[name]
                    if errors is None:
                        assert name == "tv" and r["method"] == "linformer"
                        continue
                    cells = [v for row in errors["map"] for v in (row if isinstance(row, list) else [row])
                             if v is not None]
                    assert 0 <= errors["mean"] <= errors["max"] <= top
                    assert errors["mean"] == pytest.approx(sum(cells) / len(cells), rel=1e-4, abs=1e-7)
                    assert errors["max"] == pytest.approx(max(cells), rel=1e-5)
                    if r["scope"] == "layer":
                        assert len(errors["map"]) == model["heads"] and r["layers"] == [model["middle_layer"]]
                    else:
                        assert len(errors["map"]) == model["layers"] and all(v is not None for row in errors["map"]
                                                                             for v in row)
    assert runs > 60


def test_the_budgets_within_one_percent_are_read_from_the_runs():
    approx = script()
    model = {"measure": "perplexity_change", "middle_layer": 15}

    def lowrank(rank, low, high, scope="all"):
        return {"method": "lowrank_kv", "label": f"rank {rank}", "scope": scope, "budget": {"rank": rank},
                "change": {"low": low / 100, "percent": {"mean": (low + high) / 2, "low": low, "high": high}},
                "cache_bytes": {"approximate": rank * 120, "exact": 46080}}

    corpus = {"runs": [lowrank(192, 0.2, 3.0), lowrank(288, -0.4, 0.9), lowrank(336, -0.5, 0.5),
                       {"method": "topk", "label": "k 8", "scope": "all", "budget": {"k": 8},
                        "change": {"low": 0.02, "percent": {"mean": 3.0, "low": 2.0, "high": 4.0}},
                        "cache_bytes": {"approximate": 46080, "exact": 46080}},
                       lowrank(192, -0.2, 0.3, scope="layer")]}
    assert approx.within_words(model, corpus, "all") == (
        "The budgets that keep a perplexity change within ±1 % in all layers, interval and all: low-rank KV: rank 288 "
        "(+0.25 % [−0.40, +0.90], 34,560 of 46,080 cache bytes a token), rank 336 (+0.00 % [−0.50, +0.50], 40,320 "
        "of 46,080 cache bytes a token); top-k: none.")
    assert approx.within_words(model, corpus, "layer").startswith(
        "The budgets that keep a perplexity change within ±1 % in layer 15 alone, interval and all: low-rank KV: "
        "rank 192 (+0.05 % [−0.20, +0.30]")
    cosine = {"measure": "cosine", "middle_layer": 3}
    runs = [{"method": "topk", "label": f"k {k}", "scope": "all", "budget": {"k": k},
             "change": {"mean": mean, "low": low, "high": 1.0}, "cache_bytes": {"approximate": 1, "exact": 1}}
            for k, mean, low in ((8, 0.97, 0.95), (32, 0.995, 0.991))]
    assert approx.within_words(cosine, {"runs": runs}, "all") == (
        "The budgets that keep a cosine within 1 % of 1 in all layers, interval and all: top-k: k 32 "
        "(0.995 [0.991, 1.000]).")
