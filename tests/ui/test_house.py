"""The layout of the house, checked from the source: no import cycle among the project's modules, the layers'
directions (core never imports ui or gradio; plots know neither torch nor gradio; services never import gradio;
nothing imports app.py), and the sizes that keep each room readable."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "app.py", *sorted((ROOT / "core").rglob("*.py")), *sorted((ROOT / "ui").rglob("*.py"))]
MAX_UI_LINES = 500  # a module of app.py or ui/ over this wants its concern split
MAX_UI_FUNCTION_LINES = 100
MAX_MODULES_PER_FOLDER = 12
MAX_APP_LINES = 150


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SOURCES}


def imports_of(path: Path) -> set[str]:
    """The project modules that `path` imports, at the top or inside a function: `from a.b import c` counts as
    a.b.c when that is a module, else a.b; relative imports are resolved against the file's package."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `import a.b.c` where c is a name: a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def third_party(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    return names


def test_the_graph_reads_the_imports():
    assert "ui.services.checks" in GRAPH["ui.services.text"] and "ui.page" in GRAPH["app"]
    assert "core.kv_cache" in GRAPH["core.model"]


def test_no_import_cycle():
    done, path, cycles = set(), [], []

    def visit(node: str) -> None:
        if node in path:
            cycles.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            visit(nxt)
        path.pop()
        done.add(node)

    for node in sorted(GRAPH):
        visit(node)
    assert not cycles, "import cycles: " + "; ".join(" → ".join(c) for c in cycles)


@pytest.mark.parametrize("layer, forbidden", [
    ("core", {"ui", "app", "gradio"}),
    ("ui.plots", {"torch", "gradio", "core", "ui.services", "ui.tabs", "ui.views"}),
    ("ui.services", {"gradio", "ui.tabs", "ui.views", "ui.page", "ui.backend", "ui.links"}),
    ("ui.views", {"gradio", "ui.tabs", "ui.page", "ui.backend"}),
    ("ui", {"app"}),
    ("ui.memory", {"gradio", "torch", "ui.services", "ui.tabs", "ui.views", "ui.page"}),  # first in main
])
def test_each_layer_imports_only_what_it_may(layer, forbidden):
    for name, path in MODULES.items():
        if name != layer and not name.startswith(layer + "."):
            continue
        project = GRAPH[name]
        bad = {f for f in forbidden if f in third_party(path)}
        bad |= {m for m in project for f in forbidden if m == f or m.startswith(f + ".")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_allocator_settings_load_no_torch():
    # ui.memory runs first in main, before any thread allocates: it reads the core's allocator alone, which
    # imports neither torch nor any other module of the project (core's __init__ imports nothing until asked)
    assert GRAPH["ui.memory"] == {"core.machine.allocator"} and GRAPH["core.machine.allocator"] == set()
    assert not third_party(MODULES["core.machine.allocator"]) & {"torch", "numpy", "gradio"}


def test_rooms_stay_readable():
    too_long, long_functions = [], []
    for name, path in MODULES.items():
        if not (name == "app" or name.startswith("ui")):
            continue
        source = path.read_text(encoding="utf-8")
        if len(source.splitlines()) > MAX_UI_LINES:
            too_long.append(f"{path.relative_to(ROOT)}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_UI_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert len((ROOT / "app.py").read_text(encoding="utf-8").splitlines()) <= MAX_APP_LINES
    assert not too_long, too_long
    assert not long_functions, long_functions


def test_no_folder_holds_more_than_twelve_modules():
    crowded = {}
    for folder in {p.parent for p in SOURCES}:
        count = len(list(folder.glob("*.py")))
        if count > MAX_MODULES_PER_FOLDER:
            crowded[str(folder.relative_to(ROOT))] = count
    assert not crowded, crowded


def test_no_view_imports_the_core():
    # views present, services decide: a view turns a service's result into figures and words; only services call
    # the core (the model card included)
    reach = {name: sorted(m for m in GRAPH[name] if m == "core" or m.startswith("core."))
             for name in MODULES if name.startswith("ui.views")}
    assert not {name: found for name, found in reach.items() if found}


# views whose input checks have moved into services; the others still hold some of their own
CHECKED_IN_SERVICES = ("ui.views.attention", "ui.views.heads", "ui.views.inside", "ui.views.generate", "ui.views.card")
CHECKS = {"UserError", "check_range", "check_float", "parse_head", "check_seed"}


@pytest.mark.parametrize("name", CHECKED_IN_SERVICES)
def test_these_views_check_no_input_themselves(name):
    found = []
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            found.append(f"line {node.lineno}: raises")
        elif isinstance(node, ast.Name) and node.id in CHECKS:
            found.append(f"line {node.lineno}: {node.id}")
    assert not found, f"{name} checks input itself ({', '.join(found)}); a service's check belongs there"


def test_one_function_per_check():
    from ui.services import checks, heads, inside
    from ui.views import heads as head_views

    # the Heads and Inside tabs' layer and head, checked by the one function
    assert heads.check_head is checks.check_head is inside.check_head
    assert heads.scored_shape is checks.stack_shape is inside.shape_of
    tree = ast.parse(MODULES["ui.views.heads"].read_text(encoding="utf-8"))
    defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert not defined & {"check_head", "session_cache", "add_head"}, "the Heads view decides what its service does"
