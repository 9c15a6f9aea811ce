"""docs/shortcuts.md's findings and tables are bench/analysis/shortcuts.py's rendering of the run it saved beside the
page (assets/measured/shortcuts.json): the section equals what the renderer makes from that file, every number in it is one of
the file's to the precision printed, the hand-written rest of the page holds no measured figure, and the saved
summaries agree with the saved per-pair values and stay inside their ranges. No model runs here."""
import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "shortcuts.md"
SAVED = ROOT / "assets" / "measured" / "shortcuts.json"
SECTION = re.compile(r"<!-- bench:shortcuts start -->.*?<!-- bench:shortcuts end -->", re.S)
NUMBER = re.compile(r"−?\d+(?:\.\d+)?")     # the renderer prints a negative with U+2212; '-' is a hyphen in names


def bench():
    path = ROOT / "bench" / "analysis" / "shortcuts.py"
    spec = importlib.util.spec_from_file_location("shortcuts_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def saved() -> dict:
    return json.loads(SAVED.read_text(encoding="utf-8"))


def section(text: str) -> str:
    found = SECTION.findall(text)
    assert len(found) == 1, f"docs/shortcuts.md holds {len(found)} shortcuts sections, one expected"
    return found[0]


def leaves(value, numbers: list[float], words: set[str]) -> None:
    """Every number in a saved run, and every number written inside its strings (the command, date, machine)."""
    if isinstance(value, dict):
        for item in value.values():
            leaves(item, numbers, words)
    elif isinstance(value, list):
        for item in value:
            leaves(item, numbers, words)
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, (int, float)):
        numbers.append(float(value))
    elif isinstance(value, str):
        words.update(NUMBER.findall(value))


def not_in_run(text: str, run: dict) -> list[str]:
    """The numbers of `text` that are no number of the run as printed to the same decimals, nor written in its
    strings."""
    numbers, words = [], set()
    leaves(run, numbers, words)
    printed = {d: {f"{v:.{d}f}".replace("-", "−") for v in numbers} for d in range(5)}
    missing = []
    for token in NUMBER.findall(text):
        decimals = len(token.split(".")[1]) if "." in token else 0
        if token not in words and token not in printed.get(decimals, set()):
            missing.append(token)
    return missing


def test_the_section_is_the_rendering_of_the_saved_run():
    assert section(DOC.read_text(encoding="utf-8")) == bench().block(saved()), (
        "docs/shortcuts.md's section differs from what bench/analysis/shortcuts.py renders from assets/measured/shortcuts.json: "
        "run `python bench/analysis/shortcuts.py --render` (or publish a new run)")


def test_every_number_in_the_findings_and_tables_is_in_the_saved_run():
    text, run = section(DOC.read_text(encoding="utf-8")), saved()
    assert len(NUMBER.findall(text)) > 100       # the findings and both tables, not an empty section
    assert not not_in_run(text, run), f"figures not in assets/measured/shortcuts.json: {not_in_run(text, run)}"
    # the check can fail: a figure typed into the section is caught
    assert not_in_run(text.replace("### The measurement", "AtP reaches 0.9137 here.\n\n### The measurement"),
                      run) == ["0.9137"]


def test_the_hand_written_rest_of_the_page_holds_no_measured_figure():
    rest = SECTION.sub("", DOC.read_text(encoding="utf-8"))
    decimals = [t for t in NUMBER.findall(rest) if "." in t]
    assert decimals == ["0.1", "0.1"], decimals          # the strong-cell threshold, a setting of the run
    assert not not_in_run(" ".join(decimals), saved())


def test_the_saved_summaries_are_their_per_pair_values_and_stay_in_range():
    run = saved()
    report = run["report"]
    summaries = [s for site in report["sites"].values() for s in
                 [*site["exact"].values(), *(m for measures in site["methods"].values() for m in measures.values())]]
    assert len(summaries) == 2 + 4 * 5 + 2 + 3 * 5
    for s in summaries:
        values = [v for v in s["per_pair"] if v is not None]
        assert s["n"] == len(s["per_pair"]) == len(report["items"])
        if s["mean"] is None:                   # flow's signed error: an unsigned method has none
            assert not values and s["low"] is None
            continue
        assert s["mean"] == pytest.approx(math.fsum(values) / len(values), rel=1e-6)   # float32 items
        if s["n"] < report["min_items"]:
            assert s["low"] is None and s["high"] is None and s["interval"] is None
            continue
        assert s["low"] <= s["mean"] + 1e-12 and s["mean"] <= s["high"] + 1e-12
        low, high = s["bounds"] or (None, None)
        assert low is None or s["low"] >= low, s
        assert high is None or s["high"] <= high, s
        assert s["interval"] == ("Student's t" if s["bounds"] is None else "percentile bootstrap")
    assert report["pairs"] >= report["min_items"] and len(report["items"]) >= report["min_items"], (
        "the published run has too few pairs for an interval")


def test_the_findings_are_computed_comparisons():
    shortcuts = bench()

    def s(mean, low, high):
        return {"mean": mean, "low": low, "high": high}

    measures = {"atp": {"rho": s(0.9, 0.85, 0.95), "signed_error": s(-0.5, -0.7, -0.3)},
                "ig": {"rho": s(0.7, 0.6, 0.8), "signed_error": s(0.02, -0.1, 0.14)},
                "flow": {"rho": s(0.2, 0.1, 0.3), "signed_error": s(None, None, None)}}
    assert shortcuts.leader(measures, "rho", lower=False) == (
        "atp (0.90 [0.85, 0.95]), its interval clear of ig's (0.70 [0.60, 0.80]); flow lowest (0.20 [0.10, 0.30])")
    measures["ig"]["rho"] = s(0.9, 0.8, 0.96)
    assert shortcuts.leader(measures, "rho", lower=False).startswith(
        "atp and ig (0.90 [0.85, 0.95], the same to two decimals), atp's interval clear of flow's")
    assert shortcuts.leader(measures, "rho", lower=True).startswith("flow (0.20 [0.10, 0.30]), its interval clear of")
    assert shortcuts.signed_words(measures) == ("atp (−0.50 [−0.70, −0.30]) falls short of patching (interval below "
                                                "0); ig (0.02 [−0.10, 0.14]) cannot be told from patching (interval "
                                                "around 0)")
