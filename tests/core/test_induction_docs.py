"""docs/core.md's induction prose says only what its scripts measured: the shipped run's paragraph and the seeds table
(scripts/induction_seeds.py, assets/measured/induction_seeds.json) and the real model's table
(scripts/composition_finding.py, assets/measured/composition_finding.json) are each the script's rendering of its
saved run, the circuit decided again by core.analysis.circuits from the stored scores, and every figure in them
appears in that run."""
from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "core.md"
SECTIONS = {  # section → (script, saved run)
    "induction-shipped": ("induction_seeds", "induction_seeds.json"),
    "induction-seeds": ("induction_seeds", "induction_seeds.json"),
    "composition": ("composition_finding", "composition_finding.json"),
}
NUMBER = re.compile(r"(?<![\w.])[+-]?\d+\.\d+")


def script(name: str):
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def section(name: str) -> str:
    """The section's body as published: what follows its head line (the run's stamp)."""
    text = DOC.read_text(encoding="utf-8")
    found = re.search(rf"<!-- bench:{name} start -->\n_Written by [^\n]*_\n\n(.*?)\n<!-- bench:{name} end -->", text,
                      re.S)
    assert found, f"docs/core.md has no published section {name}"
    return found.group(1)


def saved(file: str) -> dict:
    return json.loads((ROOT / "assets" / "measured" / file).read_text(encoding="utf-8"))


def numbers(value) -> set[float]:
    """Every number a saved run holds (nested lists and dicts)."""
    if isinstance(value, bool):
        return set()
    if isinstance(value, (int, float)):
        return {float(value)}
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return set().union(*map(numbers, value)) if value else set()
    return set()


@pytest.mark.parametrize("name", SECTIONS)
def test_each_section_is_its_scripts_rendering_of_the_saved_run(name):
    module, file = SECTIONS[name]
    run = script(module)
    render = {"induction-shipped": "shipped_paragraph", "induction-seeds": "seeds_table", "composition": "body"}[name]
    rendered = getattr(run, render)(saved(file))
    assert section(name) == rendered


@pytest.mark.parametrize("name", SECTIONS)
def test_every_figure_in_a_section_appears_in_its_saved_run(name):
    held = numbers(saved(SECTIONS[name][1]))
    rules = {0.4, 0.5}          # the rule's minimums, which the prose states beside the scores
    for figure in NUMBER.findall(section(name)):
        places = len(figure.split(".")[1])
        value = float(figure)
        assert value in rules or any(math.isfinite(v) and round(v, places) == value for v in held), (
            f"{figure} in section {name} is in no saved value")
