"""Reading the logits a block of positions at a time. A text's logits [B, T, vocab] are large when the vocabulary
is (float32 at 2,048 tokens and 256k tokens: 2 GB per copy), and most analyses want a few numbers per position
(a loss, the top tokens, one probability). They run the forward pass with return_logits=False and read its
final hidden states [B, T, d] here, through model.logits on one block of positions at a time, so no more than
one block's logits (and what the reader derives from them) exists at once.

The block's size comes from a byte budget, never from the machine: the same text is cut the same way anywhere,
and each position's numbers are computed by the same operations as on the whole text.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

LOGITS_BUDGET = 64 * 2**20  # bytes of float32 logits one block may hold: [B, rows, vocab] × 4 ≤ this

Read = Callable[[Tensor, slice], Tensor | tuple[Tensor, ...]]


def block_rows(batch: int, vocab: int, budget: int = LOGITS_BUDGET) -> int:
    """Positions per block so that batch × positions × vocab float32 logits fit in `budget` bytes (at least one)."""
    return max(1, budget // (batch * vocab * 4))


def by_blocks(model, hidden: Tensor, read: Read, budget: int = LOGITS_BUDGET) -> Tensor | tuple[Tensor, ...]:
    """read(logits [B, t, vocab], positions) on each block of positions of hidden [B, T, d] (positions: the
    block's slice of 0..T, to index per-position inputs such as target ids). read returns a tensor [B, t, ...]
    or a tuple of them; the blocks' results are written into one tensor each [B, T, ...], returned the same way,
    so only one block's logits and the reader's intermediates exist at a time."""
    batch, n = hidden.shape[:2]
    rows = block_rows(batch, model.config.vocab_size, budget)
    joined, single = None, False
    for start in range(0, n, rows) or [0]:  # an empty text still gives empty results of the right shapes
        at = slice(start, min(start + rows, n))
        got = read(model.logits(hidden[:, at]), at)
        single = isinstance(got, Tensor)
        parts = (got,) if single else tuple(got)
        if joined is None:
            joined = tuple(p.new_empty((p.shape[0], n, *p.shape[2:])) for p in parts)
        for whole, part in zip(joined, parts):
            whole[:, at] = part
    return joined[0] if single else joined


def losses(model, hidden: Tensor, targets: Tensor, budget: int = LOGITS_BUDGET) -> Tensor:
    """Cross-entropy in nats of targets [B, T] under the logits at each position of hidden [B, T, d] → [B, T]
    float32; a target of −100 gives 0 (cross_entropy's ignore_index)."""
    return by_blocks(model, hidden, lambda logits, at: cross_entropy(logits, targets[:, at]), budget)


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """logits [B, t, V], targets [B, t] → [B, t] float32 nats, −log softmax(logits)[target]. Rows of [B·t, V]:
    the vocabulary is the contiguous axis (as [B, V, t] it would be strided, several times slower)."""
    flat = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    return flat.view(targets.shape)


def at_position(model, hidden: Tensor, position: int) -> Tensor:
    """The logits of one position of hidden [B, T, d] → [B, vocab]. Where hidden carries a graph (a forward
    with grad=True) the result does too, even inside torch.inference_mode, so it can be differentiated."""
    if not hidden.requires_grad:
        return model.logits(hidden[:, position])
    with torch.inference_mode(False), torch.enable_grad():
        return model.logits(hidden[:, position])
