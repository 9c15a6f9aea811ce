"""The layers inside core, checked from the source as tests/ui/test_house.py checks the UI's (its import reader):

    core.lab                                    the Lab's engines (training, recurrence, extrapolation, sinks)
    core.analysis                               what is built on the pass and its records (over.py: each over a corpus)
    core.corpus                                 texts and the job machinery (Job, Over, checks, batching, saving)
    core.model, core.probe, core.generate, core.loading, core.logits, core.plane, core.store, core.families
    core.attention, core.layers, core.config, core.observe, core.kv_cache

A module imports only its own layer or those below it, never one above, and no two packages import each other
(core.corpus ↔ core.analysis is gone). core (its __init__: load_model) sits with the model's layer. scripts/ and
bench/ import the core, never ui."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ui_house", ROOT / "tests" / "ui" / "test_house.py")
house = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(house)

LAYERS = [
    ("core.lab",),
    ("core.analysis",),
    ("core.corpus",),
    ("core", "core.model", "core.probe", "core.generate", "core.loading", "core.logits", "core.plane", "core.store",
     "core.families"),
    ("core.attention", "core.layers", "core.config", "core.observe", "core.kv_cache"),
]


def layer_of(name: str) -> int:
    """The index in LAYERS of the longest prefix naming `name`'s package or module (0 is the top)."""
    best, found = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    if found is None:
        raise AssertionError(f"{name} is in no layer of core: add it to LAYERS and to this module's docstring")
    return found


CORE = {name: imports for name, imports in house.GRAPH.items() if name == "core" or name.startswith("core.")}


def test_every_core_module_has_a_layer():
    assert {layer_of(name) for name in CORE} == set(range(len(LAYERS)))


def test_no_core_module_imports_a_layer_above_its_own():
    upward = sorted(f"{name} → {target}" for name, imports in CORE.items() for target in imports
                    if target.startswith("core") and layer_of(target) < layer_of(name))
    assert not upward, "imports running back up: " + "; ".join(upward)


def test_the_reader_sees_the_layers_imports():
    # the reader must see what these modules import, else the checks above hold vacuously
    assert "core.corpus.jobs" in CORE["core.analysis.over"] and "core.lab.train" in CORE["core.lab.extrapolation"]
    assert "core.logits" in CORE["core.probe"]


# still importing ui: scripts/composition_finding.py (the composition service), bench/lab_snapshots.py (the Lab's
# configs and settings), bench/analysis/shortcuts.py and bench/corpus/speed.py (settings, memory), bench/load.py
# (the patching service), bench/stop_click.py (it times the page's own Stop): strict, so the day they stop it fails
@pytest.mark.xfail(strict=True, reason="scripts and benches that still import ui, named above")
@pytest.mark.parametrize("folder", ["scripts", "bench"])
def test_scripts_and_benches_import_no_ui(folder):
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n == "ui" or n.startswith("ui.")]
    assert not found, f"{folder}/ imports ui: {found}"
