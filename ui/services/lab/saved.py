"""Runs the Lab trained and the project ships (assets/lessons/): each one a model folder with the store's manifest,
whose `source.lab` is the LabConfig it was trained with. The Lab lists them beside a session's own runs, so its
attention section opens one as it opens a run trained here (the Learn tab's "Try it" does). And the one reading of
the experiments' shipped results (read_result: recurrence, extrapolation, sinks). Never imports gradio.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.lab import shipped
from core.lab.train import LabConfig
from ui.services.checks import UserError

REVERSE = "saved: reverse"   # the encoder-decoder the course's cross-attention lesson reads
INDUCTION = "saved: induction"   # the attention-only decoder whose induction circuit the Lab traces
SAVED_RUNS = {REVERSE: shipped.REVERSE, INDUCTION: shipped.INDUCTION}   # Run list id → model folder


def read_result(load: Callable[[Path], object], folder: Path, what: str):
    """An experiment's result the repository ships, read from `folder` by `load`; None, with a warning naming `what`,
    where it is absent or unreadable (the page then says so in words)."""
    try:
        return load(folder)
    except (OSError, ValueError, KeyError, TypeError) as err:
        logging.getLogger(__name__).warning("no saved %s result in %s: %s", what, folder, err)
        return None


@dataclass(frozen=True)
class SavedRun:
    id: str
    lab: LabConfig
    model: object   # core.model.Transformer, float32 on the CPU


def is_saved(run_id) -> bool:
    return isinstance(run_id, str) and run_id.strip() in SAVED_RUNS


def lab_config(folder: Path) -> LabConfig:
    """The LabConfig a shipped run was trained with (core/lab/shipped.py), its refusal in words."""
    try:
        return shipped.lab_config(folder)
    except ValueError as error:
        raise UserError(f"{error}.") from None


@functools.lru_cache(maxsize=len(SAVED_RUNS))
def load(run_id: str) -> SavedRun:
    """A shipped run, loaded once per process (its weights are a few hundred kB)."""
    from core import load_model

    folder = SAVED_RUNS.get(str(run_id).strip())
    if folder is None:
        raise UserError(f"There is no saved run {run_id!r}; the saved runs are {', '.join(SAVED_RUNS)}.")
    if not (folder / "model.safetensors").is_file():
        raise UserError(f"The saved run {run_id!r} is missing ({folder.name}): it is made by the command in "
                        "that folder's README.md.")
    return SavedRun(str(run_id).strip(), lab_config(folder), load_model(folder, device="cpu"))
