"""Many texts and the jobs over them: built-in and uploaded corpora (texts.py), the job machinery every analysis
over a corpus runs on (jobs.py), the summary of its items with their spread (stats.py), jobs saved item by item
(saved.py) and split into chunks (chunks.py). It imports no analysis (core/analysis/over.py names the analyses a
job runs) and no UI: the app, the Ray backend and a notebook call the same functions."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Pair:
    """One clean/corrupted prompt pair for patching and attribution: two 1-D token-id tensors of equal length, the
    answer the clean prompt should predict next and the foil the corrupted one points to (single token ids)."""
    clean: Tensor
    corrupted: Tensor
    answer: int
    foil: int
