"""The fresh machine is the truth: every module that the project's code or tests import comes from the standard
library, the project itself, or a distribution that a requirements*.txt file installs (named there, or a dependency
of one named there). A package installed by hand would make this machine's run green and a fresh one fail at
collection; this test fails first, naming the import, its file and line, and the file to add it to."""
from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ["app.py", "core", "ui", "bench", "scripts", "tests"]

# Imported only where they exist, each behind its own guard, and said so where it is imported.
OPTIONAL = {
    "spaces": "Hugging Face's ZeroGPU package: preinstalled on a Space, imported only when SPACES_ZERO_GPU is set",
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def named(req_file: Path, seen: set[Path]) -> set[Requirement]:
    """The requirements that a requirements file names, following its -r includes."""
    if req_file in seen or not req_file.is_file():
        return set()
    seen.add(req_file)
    out = set()
    for line in req_file.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith(("-r", "--requirement")):
            out |= named(req_file.parent / line.split(None, 1)[1], seen)
        elif line and not line.startswith("-"):
            out.add(Requirement(line))
    return out


def closure(requirements: set[Requirement]) -> set[str]:
    """The distributions these requirements install: each named one and, where installed, what it requires for
    the extras asked of it (an extra nobody asks for installs nothing), as pip resolves them on this Python."""
    todo, seen = [(norm(r.name), frozenset(r.extras)) for r in requirements], set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            r = Requirement(line)
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras | {""}):
                todo.append((norm(r.name), frozenset(r.extras)))
    return {name for name, _ in seen}


def local_names(root: Path, scanned: list[str]) -> set[str]:
    names = set()
    for path in python_files(root, scanned):
        names.add(path.stem)
        names |= {p.name for p in path.relative_to(root).parents if p.name}
    return names


def python_files(root: Path, scanned: list[str]):
    for top in scanned:
        yield from sorted((root / top).rglob("*.py")) if (root / top).is_dir() else [root / top]


def imports(root: Path, scanned: list[str]):
    """(top-level module, 'file:line') for every absolute import in the scanned code."""
    for path in python_files(root, scanned):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                yield module.split(".")[0], f"{path.relative_to(root)}:{node.lineno}"


def unprovided(root: Path, scanned: list[str]) -> dict[str, str]:
    """{module: 'file:line'} for each import that neither Python, the project nor a requirements file provides."""
    provided = closure(set().union(*(named(f, set()) for f in sorted(root.glob("requirements*.txt")))))
    providers = metadata.packages_distributions()
    stdlib, local = set(sys.stdlib_module_names) | {"__future__"}, local_names(root, scanned)
    missing = {}
    for top, where in imports(root, scanned):
        if top in stdlib or top in local or top in OPTIONAL:
            continue
        dists = {norm(d) for d in providers.get(top, [])} or {norm(top)}  # not installed: its own name
        if not dists & provided:
            missing.setdefault(top, where)
    return missing


def test_every_import_comes_from_a_requirements_file():
    missing = unprovided(ROOT, SCANNED)
    assert not missing, "imports that no requirements file installs (a fresh machine fails there):\n" + "\n".join(
        f"  import {top}  ({where}): add its distribution to requirements.txt (the app), requirements-dev.txt "
        f"(the tests) or requirements-bench.txt (the side-by-side benchmarks)" for top, where in sorted(missing.items()))


def test_the_check_reports_a_package_installed_by_hand(tmp_path):
    """Not vacuous: pip is installed in every environment, and an import of it that no requirements file names is
    reported, with its file and line; naming it in a requirements file clears it."""
    (tmp_path / "probe.py").write_text("import json\n\nimport pip\n")
    (tmp_path / "requirements.txt").write_text("numpy\n")
    assert unprovided(tmp_path, ["probe.py"]) == {"pip": "probe.py:3"}
    (tmp_path / "requirements-dev.txt").write_text("-r requirements.txt\npip  # named\n")
    assert unprovided(tmp_path, ["probe.py"]) == {}
