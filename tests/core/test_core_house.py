"""The layers inside core, checked from the source as tests/ui/test_house.py checks the UI's (its import reader):

    core.lab                                    the Lab's engines (training, recurrence, extrapolation, sinks)
    core.analysis                               what is built on the pass and its records (over.py: each over a corpus)
    core.corpus                                 texts and the job machinery (Job, Over, checks, batching, saving)
    core.model, core.probe, core.generate, core.loading, core.logits, core.plane, core.store, core.families
    core.attention, core.approx, core.layers, core.config, core.kv_cache, core.machine.growth, core.machine.allocator

A module imports only its own layer or those below it, never one above, and no two packages import each other
(core.corpus ↔ core.analysis is gone). core (its __init__: load_model) sits with the model's layer. scripts/ and
bench/ import the core, never ui (bench/ but for the benches that measure the app itself, named with their
reasons in APP_BENCHES)."""
from __future__ import annotations

import importlib.util
import re
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
    ("core.attention", "core.approx", "core.layers", "core.config", "core.kv_cache", "core.machine.growth",
     "core.machine.allocator"),
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


# The benches that measure the app itself, each with why it reads ui: the only modules of scripts/ or bench/ that
# may import it. A bench of the core reads the core (core.machine.allocator, core.lab.train.DEFAULT_RUN, ...).
APP_BENCHES = {
    "bench/stop_click.py": "it times the page's own Stop: it sets the Generate view's pacing and can run an older "
                           "ui/tabs/generate.py in place of the current one",
    "bench/load.py": "it loads the running app through its endpoints, sending the Patching tab's own preset pair "
                     "and threshold (ui.services.patching), so the load is what the page sends",
    "bench/analysis/shortcuts.py": "it says how many pairs one corpus job fits in the app's time cap "
                                   "(ui.settings' ATTN_CORPUS_MAX_SECONDS), a setting of the app, not the core",
}
UI_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+ui(?:\.[\w.]+)?[ \t]+import\b|import[ \t]+ui\b)", re.MULTILINE)


def ui_imports(path: Path) -> list[str]:
    """Each line of `path` importing ui, as 'path:line text': in its code or in code it runs from a string (a
    child process's script)."""
    source = path.read_text(encoding="utf-8")
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return [f"{name}:{source.count(chr(10), 0, m.start()) + 1} {m.group(0).strip()}"
            for m in UI_IMPORT.finditer(source)]


def test_scripts_import_no_ui():
    found = [line for path in sorted((ROOT / "scripts").rglob("*.py")) for line in ui_imports(path)]
    assert not found, f"scripts/ imports ui (a script reads the core, never the app): {found}"


BENCHES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bench").rglob("*.py"))


@pytest.mark.parametrize("bench", [name for name in BENCHES if name not in APP_BENCHES])
def test_benches_import_no_ui_but_those_measuring_the_app(bench):
    found = ui_imports(ROOT / bench)
    assert not found, (f"{bench} imports ui: {found}; a bench of the core reads the core (move what it needs there), "
                       f"and only a bench measuring the app itself goes in APP_BENCHES, with its reason")


def test_the_allow_list_names_benches_that_import_ui():
    assert set(APP_BENCHES) <= set(BENCHES), f"no such bench: {sorted(set(APP_BENCHES) - set(BENCHES))}"
    idle = [name for name in APP_BENCHES if not ui_imports(ROOT / name)]
    assert not idle, f"{idle} import no ui any more: take them off APP_BENCHES"


def test_the_ui_import_reader_sees_imports_in_code_and_in_a_childs_script(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('import uid\nfrom ui import memory\nCHILD = """\nimport ui.tabs.generate as tab\n"""\n'
                      "def f():\n    from ui.services.patching import PRESETS\n# ui is named, not imported\n")
    assert ui_imports(sample) == ["sample.py:2 from ui import", "sample.py:4 import ui",
                                  "sample.py:7 from ui.services.patching import"]
