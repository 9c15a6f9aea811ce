"""Analyses over many texts: built-in and uploaded corpora (texts.py) and each analysis summarised over them with its
spread (summaries.py). No UI imports: the app, the Ray backend and a notebook call the same functions."""
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
