"""weights/registry.json: the known models, each with its family, licence and sources in order.

Optional keys, shown before a download:
  memory_mb     float32 parameter bytes / 2**20, what the loaded model holds (entry); written by
                scripts/measure_registry.py with
  parameters    the parameter count it came from, and
  memory_source how: "measured: ..." (the loaded model, or its config.json on the meta device) or
                "announced: ..." with where the count was announced, for a model not installed here
  disk_mb       MB on disk as the hub or the wheel lists the files (source)
  gated         true where the hub serves the files only after the licence is accepted (entry)
  licence_note  what to do before a gated pull (entry; required when gated)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .errors import WeightsError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = REPO_ROOT / "weights"
REGISTRY_FILE = DEFAULT_ROOT / "registry.json"

PYPI_KINDS = ("gguf", "hf-folder", "gguf-chunks")  # one GGUF, a model folder, a GGUF split across wheels
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
    if "memory_mb" in entry and not _positive_number(entry["memory_mb"]):
        raise WeightsError(f"{where}: 'memory_mb' must be a positive number of MiB, got {entry['memory_mb']!r}")
    if not isinstance(entry.get("gated", False), bool):
        raise WeightsError(f"{where}: 'gated' must be true or false, got {entry['gated']!r}")
    if entry.get("gated") and not (isinstance(entry.get("licence_note"), str) and entry["licence_note"].strip()):
        raise WeightsError(f"{where} is gated but has no 'licence_note' saying where to accept the licence")
    for source in entry["sources"]:
        if "disk_mb" in source and not _positive_number(source["disk_mb"]):
            raise WeightsError(f"{where}: a source's 'disk_mb' must be a positive number, got {source['disk_mb']!r}")
        kind = source.get("type")
        if kind == "hub":
            if not HUB_REPO_ID.match(source.get("repo", "")):
                raise WeightsError(f"{where}: hub source needs 'repo' as 'owner/name', got {source.get('repo')!r}")
        elif kind == "pypi":
            missing = [k for k in ("package", "version", "path", "kind") if k not in source]
            if missing:
                raise WeightsError(f"{where}: pypi source lacks {missing}")
            if source["kind"] not in PYPI_KINDS:
                raise WeightsError(f"{where}: pypi 'kind' must be one of {list(PYPI_KINDS)}, got {source['kind']!r}")
            if source["kind"] == "gguf-chunks":
                _check_chunks(source, where)
        else:
            raise WeightsError(f"{where}: source type must be 'hub' or 'pypi', got {kind!r}")


def _check_chunks(source: dict, where: str) -> None:
    """A gguf-chunks source lists its chunk packages in order, each with the file it holds."""
    chunks = source.get("chunks")
    if not isinstance(chunks, list) or not chunks:
        raise WeightsError(f"{where}: a gguf-chunks source needs 'chunks', a list of its chunk packages in order")
    for i, chunk in enumerate(chunks, start=1):
        if not isinstance(chunk, dict) or not all(isinstance(chunk.get(k), str) for k in ("package", "path")):
            raise WeightsError(f"{where}: chunk {i} needs 'package' and 'path' (the file inside its wheel), "
                               f"got {chunk!r}")
    if not all(isinstance(name, str) for name in source.get("licence_files", [])):
        raise WeightsError(f"{where}: 'licence_files' must be a list of file names beside SHA256SUMS")


def _positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


SOURCE_PLACES = {"hub": "the Hugging Face Hub", "pypi": "PyPI"}


def memory_phrase(entry: dict) -> str:
    """"269 MiB in memory as float32" where the registry knows the entry's memory_mb, else ""."""
    return f"{entry['memory_mb']:,} MiB in memory as float32" if entry.get("memory_mb") else ""


def size_phrase(entry: dict) -> str:
    """What a pull costs, as the registry knows it: each source's size on disk, then the memory, e.g.
    "166 MB on disk from the Hugging Face Hub, 269 MiB in memory as float32"; "" when nothing is known."""
    parts = [f"{s['disk_mb']:,} MB on disk from {SOURCE_PLACES.get(s.get('type'), s.get('type'))}"
             for s in entry.get("sources", []) if s.get("disk_mb")]
    return ", ".join([*parts, memory_phrase(entry)] if memory_phrase(entry) else parts)


def gated_phrase(entry: dict) -> str:
    """For a gated entry: that its licence must be accepted on the hub and that HF_TOKEN is used (only the hub's
    download, where the entry has other sources); else ""."""
    if not entry.get("gated"):
        return ""
    repos = [s["repo"] for s in entry.get("sources", []) if s.get("type") == "hub"]
    where = f" at https://huggingface.co/{repos[0]}" if repos else " on the Hugging Face Hub"
    others = any(s.get("type") != "hub" for s in entry.get("sources", []))
    return (f"the Hub's copy is gated: accept its licence{where} and set HF_TOKEN, which that download uses"
            if others else f"gated: accept its licence{where} and set HF_TOKEN, which the download uses")


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
