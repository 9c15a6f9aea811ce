"""Observers: what sees the attention probabilities while a forward pass computes them.

An observer is called as observer(kind, layer, probs [B, H, Tq, Tk] float32) for each layer it wants. kind is
"self" (the main stack), "encoder" (a seq2seq model's encoder) or "cross" (its decoder's cross-attention).
Layers it does not want keep the fused fast path (core/attention.py), so observing one layer costs one layer.
An observer with rows_per_block set receives each map in blocks of query rows instead,
observer(kind, layer, probs [B, H, rows, width], start, n): rows start.. of an n-key map, keys from width on with
probability 0; the layer's output is computed from those same blocks. This is how long texts are captured
(core/analysis/capture.py) without an n × n float32 matrix.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import torch
from torch import Tensor

Kind = Literal["self", "encoder", "cross"]


class Observer(ABC):
    """The base of every observer: by default it wants every layer of every kind, whole maps at a time. What it
    does with the probabilities is each observer's own (__call__)."""

    rows_per_block: int | None = None  # None: whole maps; else the number of query rows per call

    def wants(self, kind: Kind, layer: int) -> bool:
        return True

    @abstractmethod
    def __call__(self, kind: Kind, layer: int, probs: Tensor, start: int = 0, n: int | None = None,
                 first_key: int = 0) -> None:
        """Take one layer's probabilities (or one block of its query rows, when rows_per_block is set: rows from
        `start`, of n keys, the block's columns from key first_key on; a sliding window's keys before it are 0)."""


class AttentionRecorder(Observer):
    """Keeps every layer's probabilities, float32, as the model computes them."""

    def __init__(self):
        self.maps: dict[str, dict[int, Tensor]] = {}

    def __call__(self, kind: Kind, layer: int, probs: Tensor, start: int = 0, n: int | None = None,
                 first_key: int = 0) -> None:
        self.maps.setdefault(kind, {})[layer] = probs

    def layers(self, kind: Kind) -> tuple[Tensor, ...] | None:
        found = self.maps.get(kind)
        return None if found is None else tuple(found[i] for i in sorted(found))


class RowRecorder(Observer):
    """Keeps the last query's attention row of every layer: what the model looked at while it computed the
    next token. rows[kind][layer] is [B, H, Tk] float16, kind "self" or (seq2seq) "cross"."""

    def __init__(self):
        self.rows: dict[str, dict[int, Tensor]] = {"self": {}, "cross": {}}

    def __call__(self, kind: Kind, layer: int, probs: Tensor, start: int = 0, n: int | None = None,
                 first_key: int = 0) -> None:
        self.rows[kind][layer] = probs[:, :, -1].to(torch.float16)

    def take(self, kind: Kind = "self") -> Tensor | None:
        """[B, L, H, Tk] of one kind, emptied for the next token; None when that kind was not computed."""
        found = self.rows[kind]
        if not found:
            return None
        rows = torch.stack([found[i] for i in sorted(found)], dim=1)
        self.rows[kind] = {}
        return rows
