"""Attention capture that scales to long texts.

Capturing every layer and head of n tokens as float32 costs L·H·n²·4 bytes (4.5 GB for SmolLM2 at 2048
tokens), which is what transformers' output_attentions=True holds. This module keeps instead:
  - overview: every layer × head, block-averaged to at most overview_size² (the app's model view);
  - full resolution in float16 for every layer and head while n ≤ keep_full_up_to (the head view);
  - above that, full resolution of one layer recomputed on demand (a forward pass up to that layer only).
Probabilities are computed a block of 256 query rows at a time (core.attention.attention_rows), so no
n × n float32 matrix exists while the pass runs unless a full map is kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import padding_or_none
from ..config import check_index
from ..attention import Kind, Observer


def pool_last(x: Tensor, size: int) -> Tensor:
    """Block means along the last dimension down to `size` (adaptive average pooling); unchanged if shorter."""
    return x if x.shape[-1] <= size else F.adaptive_avg_pool1d(x, size)


def pool_columns(block: Tensor, n: int, size: int, first: int = 0) -> Tensor:
    """Adaptive average pooling of [..., width] (keys first .. first + width - 1) to [..., size] as if the row
    were zeros elsewhere in 0..n-1: bin j averages columns floor(j·n/size) .. ceil((j+1)·n/size) - 1, read off a
    running sum."""
    width = block.shape[-1]
    if n <= size:
        return F.pad(block, (first, n - first - width))
    step = n // size
    if n % size == 0 and width % step == 0 and first % step == 0:  # whole equal bins: a reshape and a mean
        pooled = block.view(*block.shape[:-1], width // step, step).mean(-1)
        return F.pad(pooled, (first // step, size - (first + width) // step))
    j = torch.arange(size, device=block.device)
    starts, ends = (j * n) // size, ((j + 1) * n + size - 1) // size
    running = F.pad(block.cumsum(-1), (1, 0))                                  # [..., width + 1]
    sums = running[..., (ends - first).clamp(0, width)] - running[..., (starts - first).clamp(0, width)]
    return sums / (ends - starts).to(block.dtype)


def store_rows(full: Tensor, block: Tensor, start: int, first: int = 0) -> None:
    """Write a block of rows [H, rows, width] (keys from `first` on) into a zero-filled [H, n, n] map."""
    full[:, start:start + block.shape[1], first:first + block.shape[-1]] = block


class OverviewObserver(Observer):
    """Pools each layer's probabilities as they are computed, a block of query rows at a time: keys first
    ([H, rows, n] → [H, rows, S]), then queries once the layer is done. Averaging over rectangles is separable,
    so this equals 2-D adaptive average pooling. Optionally keeps full maps (float16, or float32 for keep_layers)."""

    rows_per_block = 256

    def __init__(self, size: int, keep_full: bool, keep_layers=(), progress=None, n_layers: int = 0,
                 kind: Kind = "self"):
        self.size, self.keep_full, self.keep_layers, self.kind = size, keep_full, set(keep_layers), kind
        self.progress, self.n_layers = progress, n_layers
        self.pooled: dict[int, Tensor] = {}
        self.full: dict[int, Tensor] = {}

    def wants(self, kind: Kind, layer: int) -> bool:
        return kind == self.kind

    def __call__(self, kind: Kind, layer: int, probs: Tensor, start: int = 0, n: int | None = None,
                 first_key: int = 0) -> None:
        block = probs[0]                                   # [H, rows, width ≤ n], keys from first_key on
        heads, rows, width = block.shape
        n = n or width
        if start == 0:
            self.columns = block.new_empty(heads, n, min(n, self.size))
            if layer in self.keep_layers or self.keep_full:
                dtype = torch.float32 if layer in self.keep_layers else torch.float16
                self.full[layer] = block.new_zeros(heads, n, n, dtype=dtype)
        self.columns[:, start:start + rows] = pool_columns(block, n, self.size, first_key)
        if layer in self.full:
            store_rows(self.full[layer], block, start, first_key)
        if start + rows == n:                              # the layer's last block
            self.pooled[layer] = pool_last(self.columns.transpose(1, 2), self.size).transpose(1, 2)
            if self.progress is not None:
                self.progress(layer + 1, self.n_layers)


class LayerObserver(Observer):
    """Keeps the full float32 probabilities of one layer, filled a block of rows at a time."""

    rows_per_block = 256

    def __init__(self, layer: int, kind: Kind = "self"):
        self.layer, self.kind, self.probs = layer, kind, None

    def wants(self, kind: Kind, layer: int) -> bool:
        return kind == self.kind and layer == self.layer

    def __call__(self, kind: Kind, layer: int, probs: Tensor, start: int = 0, n: int | None = None,
                 first_key: int = 0) -> None:
        block = probs[0]
        n = n or block.shape[-1]
        if start == 0:
            self.probs = block.new_zeros(block.shape[0], n, n)
        store_rows(self.probs, block, start, first_key)


@dataclass
class AttentionMaps:
    """Every layer's and head's attention over one text of n tokens: the main stack's, or a seq2seq encoder's."""
    overview: np.ndarray              # [L, H, S, S] float32, S = min(n, overview_size), block-averaged
    n_tokens: int
    model: object = field(repr=False)
    inputs: dict = field(repr=False)
    full: dict[int, Tensor] = field(default_factory=dict, repr=False)  # layer → [H, n, n] float16

    @property
    def block(self) -> float:
        """How many tokens one overview cell averages along each axis."""
        return self.n_tokens / self.overview.shape[-1]

    def layer(self, layer: int) -> Tensor:
        """[H, n, n] float32 probabilities of one layer, kept or recomputed."""
        layer = check_index(layer, self.overview.shape[0], "layer", "the model has layers")
        if layer in self.full:
            return self.full[layer].float()
        return recompute_layer(self.model, self.inputs, layer)

    def head(self, layer: int, head: int | None = None, queries: tuple[int, int] | None = None,
             keys: tuple[int, int] | None = None) -> np.ndarray:
        """Full-resolution probabilities of one head (None: the mean over the layer's heads), optionally a
        window: rows queries[0]:queries[1], columns keys[0]:keys[1]."""
        maps = self.layer(layer)
        if head is not None:
            head = check_index(head, maps.shape[0], "head", f"layer {layer} has heads")
        grid = maps.mean(0) if head is None else maps[head]
        q0, q1 = queries or (0, self.n_tokens)
        k0, k1 = keys or (0, self.n_tokens)
        return grid[q0:q1, k0:k1].float().cpu().numpy()


def stack_inputs(model, input_ids: Tensor, attention_mask: Tensor | None = None, causal_mask: bool = True,
                 padding_mask: bool = True, scale: bool = True, positions: bool = True) -> dict:
    """run_stack's arguments for the stack whose attention a capture records: model.attention_stack()."""
    stack, kind = model.attention_stack()
    return dict(stack=stack, input_ids=input_ids.to(model.device),
                attention_mask=padding_or_none(None if attention_mask is None else attention_mask.to(model.device)),
                kind=kind, causal=causal_mask and stack.cfg.causal, padding_mask=padding_mask, scale=scale,
                positions=positions)


def capture(model, input_ids: Tensor, attention_mask: Tensor | None = None, overview_size: int = 128,
            keep_full_up_to: int = 512, keep_layers=(), progress=None, causal_mask: bool = True,
            padding_mask: bool = True, scale: bool = True, positions: bool = True) -> AttentionMaps:
    """One pass over input_ids [1, n] that records the attention of every layer and head of the main stack
    (decoder-only and encoder-only models) or of the encoder (encoder-decoder models).

    keep_layers: layers kept at full float32 resolution whatever n is (so a view of them needs no second pass).
    progress: called as progress(layers_done, n_layers) after each layer."""
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"capture takes one text, input_ids [1, n]; got shape {list(input_ids.shape)}")
    n = input_ids.shape[1]
    if n > model.config.max_positions:
        raise ValueError(f"{n} tokens exceed the model's {model.config.max_positions} positions")
    inputs = stack_inputs(model, input_ids, attention_mask, causal_mask=causal_mask, padding_mask=padding_mask,
                          scale=scale, positions=positions)
    stack, kind = inputs["stack"], inputs["kind"]
    observer = OverviewObserver(overview_size, keep_full=n <= keep_full_up_to, keep_layers=keep_layers,
                                progress=progress, n_layers=stack.cfg.n_layers, kind=kind)
    with torch.inference_mode():
        model.run_stack(observer=observer, **inputs)
    overview = torch.stack([observer.pooled[i] for i in sorted(observer.pooled)]).float().cpu().numpy()
    return AttentionMaps(overview=overview, n_tokens=n, model=model, inputs=inputs, full=observer.full)


def recompute_layer(model, inputs: dict, layer: int) -> Tensor:
    """[H, n, n] float32: one layer's probabilities by a pass through the blocks up to it (inputs: stack_inputs)."""
    layer = inputs["stack"].cfg.check_layer(layer)
    observer = LayerObserver(layer, inputs["kind"])
    with torch.inference_mode():
        model.run_stack(observer=observer, n_layers=layer + 1, **inputs)
    return observer.probs


def layer_map(model, input_ids: Tensor, layer: int) -> Tensor:
    """One layer's attention over one text input_ids [1, n] (a seq2seq model: its encoder's), every head:
    [H, n, n] float32, by a forward pass up to that layer only."""
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"layer_map takes one text, input_ids [1, n]; got shape {list(input_ids.shape)}")
    return recompute_layer(model, stack_inputs(model, input_ids), layer)
