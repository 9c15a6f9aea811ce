"""The Lab's runs the repository ships (assets/lessons/): each a model folder with the store's manifest, whose
`source.lab` is the LabConfig it was trained with. Scripts and the page read a shipped run's config here."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from .train import LabConfig

LESSONS = Path(__file__).resolve().parents[2] / "assets" / "lessons"
REVERSE = LESSONS / "encoder-decoder"   # a small reversing encoder-decoder (the cross-attention lesson's)
INDUCTION = LESSONS / "induction"       # a two-layer attention-only decoder trained on copy-62


def lab_config(folder: Path) -> LabConfig:
    """The LabConfig a shipped run was trained with, from its manifest's source.lab (unknown keys left out)."""
    manifest = json.loads((Path(folder) / "manifest.json").read_text(encoding="utf-8"))
    given = manifest.get("source", {}).get("lab")
    if not isinstance(given, dict):
        raise ValueError(f"{Path(folder).name}: its manifest.json has no source.lab, so it is not a run the Lab "
                         "trained")
    known = {f.name for f in fields(LabConfig)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if k in known}
    return LabConfig(**values)
