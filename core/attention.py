"""Scaled dot-product attention, eq. 2.1: softmax(QKᵀ/√d_k + M)·V.

One signature, two paths. The fast path calls torch's fused scaled_dot_product_attention and
returns no weights; the explicit path computes every stage and returns the probabilities.
Masks are boolean, True where a query may attend to a key; M is 0 there and -∞ elsewhere.

The variants are named terms of the same function, in this order:
  S = QKᵀ·scale                     scale 1/√d_k, or the family's own (1 for T5)
  S = c·tanh(S / c)                 softcap c (Gemma 2): the scores stay within ±c
  S = S + bias                      a bias on the scores: ALiBi's −m_h·(i − j), T5's relative buckets
  P = softmax(S + M)                M from the mask, which also holds a sliding window (i − j < w)
  P = softmax([S + M, s])[:Tk]      a sink: one more entry in each row's denominator, with no value, so a row's
                                    weights may sum to less than 1; s a learned logit per head (gpt-oss) or a
                                    learned key's score q·k_s·scale (a key-only sink token)

Observers (the end of this module) are what see the probabilities while a forward pass computes them.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_mask(n_queries: int, n_keys: int, device=None) -> Tensor:
    """[Tq, Tk] bool: query i (the last Tq of Tk positions) sees keys j ≤ its own index."""
    q_index = torch.arange(n_keys - n_queries, n_keys, device=device)
    return torch.arange(n_keys, device=device)[None, :] <= q_index[:, None]


def padding_or_none(mask: Tensor | None) -> Tensor | None:
    """An attention mask [B, T], or None when it marks every token real (so the fused causal kernel can run).
    Reads the mask on the host once: for whole passes, never inside a decode step."""
    return None if mask is None or bool(mask.all()) else mask


def masked_softmax_(scores: Tensor, allowed: Tensor | None, sink: Tensor | None = None) -> Tensor:
    """softmax(S + M) over the last dimension, writing into `scores` (one n × n buffer, not two).
    M is -∞ where `allowed` is False; a row with no allowed key gets probabilities 0 (never NaN).
    sink: logits [H], one per head, or [B, H, Tq, 1], one per row (scores [B, H, Tq, Tk]): each row's
    denominator gains exp(s), which takes the weight the keys do not; a row with no allowed key gives it all
    to the sink."""
    if sink is not None:
        return sink_softmax(scores if allowed is None else scores.masked_fill(~allowed, float("-inf")), sink)
    if allowed is None:
        return torch.softmax(scores, dim=-1)
    probs = torch.softmax(scores.masked_fill_(~allowed, float("-inf")), dim=-1)
    return probs.nan_to_num(0.0) if probs.requires_grad else probs.nan_to_num_(0.0)  # autograd keeps softmax's output


def sink_softmax(scores: Tensor, sink: Tensor) -> Tensor:
    """exp(S) / (Σ_j exp(S_j) + exp(s)): softmax over the keys and one sink entry, the sink's column dropped.
    scores [B, H, Tq, Tk] (masked: -∞); sink [H] (a logit per head) or [B, H, Tq, 1] (one per row: a sink key
    scored by each query); the max is taken with the sink, so a row of -∞ gives 0s, not NaN."""
    sink = sink.to(scores.dtype)
    sink = sink.view(1, -1, 1, 1) if sink.dim() == 1 else sink
    top = torch.maximum(scores.amax(-1, keepdim=True), sink)
    weights = (scores - top).exp()
    return weights / (weights.sum(-1, keepdim=True) + (sink - top).exp())


def row_entropy(probs: Tensor) -> Tensor:
    """Entropy in nats of each attention row, [..., Tq]: −Σ_j p_ij log p_ij (0·log 0 counted as 0)."""
    p = probs.float()
    return -(p * p.clamp_min(1e-30).log()).sum(-1)


def soft_cap(scores: Tensor, cap: float | None, inplace: bool = False) -> Tensor:
    """c·tanh(S / c), the soft-cap on scaled scores (Gemma 2's attention) or on logits (its final cap): every value
    stays within ±c; S itself where cap is None. inplace: written into scores where autograd allows it."""
    if cap is None:
        return scores
    if not inplace:
        return cap * torch.tanh(scores / cap)
    scores = scores.div_(cap).tanh_()   # autograd keeps tanh's output, so the product is a new tensor when it records
    return scores * cap if scores.requires_grad else scores.mul_(cap)


def scored(scores: Tensor, softcap: float | None, bias: Tensor | None) -> Tensor:
    """The terms between the scaled scores and the mask, in place where it can be: c·tanh(S / c), then + bias."""
    scores = soft_cap(scores, softcap, inplace=True)
    if bias is not None:
        scores = scores.add_(bias)
    return scores


def attention_stages(q: Tensor, k: Tensor, allowed: Tensor | None, scale: float, softcap: float | None = None,
                     bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The stages of eq. 2.1 kept apart for display, all float32: scores S = QKᵀ·scale (after any soft-cap and
    bias), masked S + M, probabilities softmax(S + M). q [B, H, Tq, d_k], k [B, H, Tk, d_k], allowed and bias
    broadcastable to [B, H, Tq, Tk]."""
    scores = scored((q.float() @ k.float().transpose(-1, -2)) * scale, softcap, bias)
    masked = scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))
    return scores, masked, masked_softmax_(masked.clone(), allowed)


def attention_rows(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, is_causal: bool, scale: float,
                   rows: int, softcap: float | None = None, bias: Tensor | None = None,
                   window: int | None = None, sink: Tensor | None = None) -> Iterator[tuple[int, Tensor, Tensor, int]]:
    """Eq. 2.1 a block of query rows at a time: yields (first row, probs [B, H, rows, width] float32,
    output [B, H, rows, d_k] = probs·V, first key: the key probs' first column is). A block of a long text stays in the CPU's cache through every stage
    instead of streaming an n × n matrix through memory once per stage. Under a causal mask the keys after a
    block's last query are never scored: `width` stops there, and the probabilities of later keys are 0. Under a
    sliding window w, the keys w or more places before a block's first query are not scored either: probs starts
    at the window's first key (the earlier keys' probabilities are 0), so a long text costs rows × (w + rows) per
    block, not rows × n; without padding the window's edge is one triangle of rows × rows, as the causal one is.
    Same arguments as `attention`.
    """
    batch, n_heads, n_queries, d_k = q.shape
    n_kv, n_keys = k.shape[1], k.shape[-2]
    group = n_heads // n_kv
    for start in range(0, n_queries, rows):
        stop = min(start + rows, n_queries)
        width = n_keys - n_queries + stop if is_causal else n_keys  # keys any query of this block may see
        first = max(0, n_keys - n_queries + start - window + 1) if window else 0   # the window's first key
        seen = width - first
        # each key/value head scores its group of query heads in one matmul, without copying keys
        q_block = q[:, :, start:stop].reshape(batch, n_kv, group * (stop - start), d_k)
        scores = (q_block.float() @ k[:, :, first:width].float().transpose(-1, -2)).mul_(scale)
        scores = scores.view(batch, n_heads, stop - start, seen)
        if softcap is not None or bias is not None:
            rows_bias = None
            if bias is not None:
                rows_bias = bias[..., start:stop, first:width] if bias.shape[-2] > 1 else bias[..., first:width]
            scores = scored(scores, softcap, rows_bias)
        mask, n_rows = None, stop - start
        # key first + c is in the window of query row r when c ≥ r + edge (i − j < w)
        edge = n_keys - n_queries + start - first - window + 1 if window else 0
        if allowed is not None:
            mask = allowed[..., start:stop, first:width] if allowed.shape[-2] > 1 else allowed[..., first:width]
            if is_causal:
                mask = mask & causal_mask(n_rows, seen, q.device)
            if window:
                mask = mask & (torch.arange(seen, device=q.device) >= torch.arange(n_rows, device=q.device)[:, None] + edge)
        elif is_causal:  # only the last n_rows keys can lie ahead of a query of this block
            diagonal = scores[..., seen - n_rows:]
            diagonal.masked_fill_(~causal_mask(n_rows, n_rows, q.device), float("-inf"))
            if window and n_rows + edge > 0:  # only the first n_rows + edge keys can lie before a query's window
                corner = min(seen, n_rows + edge)
                before = torch.arange(corner, device=q.device) < torch.arange(n_rows, device=q.device)[:, None] + edge
                scores[..., :corner].masked_fill_(before, float("-inf"))
        rows_sink = sink[:, :, start:stop] if sink is not None and sink.dim() == 4 else sink
        probs = masked_softmax_(scores, mask, rows_sink)
        grouped = probs.view(batch, n_kv, group * (stop - start), seen).to(v.dtype)
        out = (grouped @ v[:, :, first:width]).view(batch, n_heads, stop - start, v.shape[-1])
        yield start, probs, out, first


def attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None, is_causal: bool = False,
              scale: float | None = None, return_probs: bool = False, softcap: float | None = None,
              bias: Tensor | None = None, window: int | None = None,
              sink: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """q [B, H, Tq, d_k]; k, v [B, H_kv, Tk, d_k] with H a multiple of H_kv (grouped-query attention).

    allowed: bool mask broadcastable to [B, H, Tq, Tk], or None; is_causal adds the causal mask.
    scale: the factor on QKᵀ, 1/√d_k by default; 1.0 turns scaling off.
    softcap: c, the scores become c·tanh(S / c) (no fused kernel has it: the explicit path runs).
    bias: float, broadcastable to [B, H, Tq, Tk], added to the scores (ALiBi, T5's relative buckets).
    window: w, a sliding window: a query (the last Tq of Tk places) sees no key w or more places back.
    sink: logits [H], one per query head, or [B, H, Tq, 1], one per row, in every row's denominator (the
    explicit path runs).
    Returns the output [B, H, Tq, d_k] and, when return_probs, the probabilities [B, H, Tq, Tk] float32.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if window is not None:  # the window joins the mask
        band = sliding_window_mask(q.shape[-2], k.shape[-2], window, q.device)
        if is_causal:
            band, is_causal = band & causal_mask(q.shape[-2], k.shape[-2], q.device), False
        allowed = band if allowed is None else allowed & band
    if not return_probs and softcap is None and sink is None:
        if is_causal and (allowed is not None or bias is not None):
            causal = causal_mask(q.shape[-2], k.shape[-2], q.device)
            allowed, is_causal = causal if allowed is None else allowed & causal, False
        if bias is not None:  # one float mask: the bias where allowed, -∞ elsewhere
            allowed = bias.to(q.dtype) if allowed is None else bias.to(q.dtype).masked_fill(~allowed, float("-inf"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=is_causal, scale=scale,
                                             enable_gqa=k.shape[1] != q.shape[1])
        return out, None
    group = q.shape[1] // k.shape[1]
    if group > 1:  # each key/value head serves `group` query heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if is_causal:
        causal = causal_mask(q.shape[-2], k.shape[-2], q.device)
        allowed = causal if allowed is None else allowed & causal
    scores = scored((q.float() @ k.float().transpose(-1, -2)).mul_(scale), softcap, bias)  # [B, H, Tq, Tk] float32
    probs = masked_softmax_(scores, allowed, sink)
    return probs.to(v.dtype) @ v, probs


# ---- masks and positions for n new tokens after `start` cached ones ----

def positions_from_mask(key_mask: Tensor | None, start: int, n: int, batch: int, device) -> Tensor:
    """Position ids [B, n] of the n newest tokens: count of real tokens before each (so left padding is
    skipped), or simply start..start+n-1 with no padding."""
    if key_mask is None:
        return torch.arange(start, start + n, device=device).expand(batch, n)
    return (key_mask[:, :start + n].long().cumsum(-1) - 1).clamp(min=0)[:, start:]


def position_mask(query_positions: Tensor, key_positions: Tensor, causal: bool, window: int | None = None) -> Tensor:
    """[..., Tq, Tk] bool, True where query i may read key j by their positions: j ≤ i where causal, and i − j < w
    within a sliding window w (eq. 6.5). Positions [..., Tq] and [..., Tk], of any batch shape that broadcasts."""
    offset = query_positions[..., :, None] - key_positions[..., None, :]              # i − j
    allowed = offset >= 0 if causal else torch.ones_like(offset, dtype=torch.bool)
    return allowed if window is None else allowed & (offset < window)


def layer_mask(cfg, layer: int, n: int, start: int = 0, device=None) -> Tensor:
    """[n, n] bool, the mask layer `layer` of a stack with config cfg (its causal flag, its window: config.layer_window)
    puts on n unpadded tokens from position `start`."""
    positions = torch.arange(start, start + n, device=device)
    return position_mask(positions, positions, cfg.causal, cfg.layer_window(layer))


def sliding_window_mask(n_queries: int, n_keys: int, window: int, device=None, bidirectional: bool = False) -> Tensor:
    """[Tq, Tk] bool: query i (the last Tq of Tk places) sees key j only within the window, i − j < w (eq. 6.5;
    later keys are left to the causal mask). bidirectional (an encoder's window): |i − j| < w, the w − 1 keys
    either side and the query's own."""
    q_index = torch.arange(n_keys - n_queries, n_keys, device=device)
    offset = q_index[:, None] - torch.arange(n_keys, device=device)[None, :]          # i − j, [Tq, Tk]
    return (offset.abs() if bidirectional else offset) < window


def local_global_mask(n_queries: int, n_keys: int, window: int, global_tokens: int = 0, device=None,
                      bidirectional: bool = False) -> Tensor:
    """[Tq, Tk] bool, a sliding window plus g global tokens (Longformer's local + global pattern): every query
    also sees keys 0..g−1; bidirectional, the queries at places 0..g−1 also see every key, so the global tokens
    are global both ways. The causal mask, where there is one, is the caller's to add."""
    band = sliding_window_mask(n_queries, n_keys, window, device, bidirectional)
    band[:, :global_tokens] = True
    if bidirectional:
        q_index = torch.arange(n_keys - n_queries, n_keys, device=device)
        band |= (q_index < global_tokens)[:, None]
    return band


def self_attention_mask(key_mask: Tensor | None, start: int, n: int, causal: bool,
                        device: torch.device | None = None) -> tuple[Tensor | None, bool]:
    """The mask for n new queries over start + n keys: (allowed [B, 1, n, start+n] or None, is_causal).

    key_mask: [B, ≥ start+n] bool, False on padding, or None when nothing is padded.
    A padding query left with no key at all (left padding under a causal mask) attends to itself,
    so no row is empty; its output is never used.
    """
    n_keys = start + n
    if key_mask is None:
        if not causal or n == 1:
            return None, False
        if start == 0:
            return None, True
        return causal_mask(n, n_keys, device)[None, None], False
    allowed = key_mask[:, None, None, :n_keys]                         # [B, 1, 1, Tk]
    if causal:
        allowed = allowed & causal_mask(n, n_keys, key_mask.device)  # [B, 1, n, Tk]
    else:
        allowed = allowed.expand(-1, -1, n, -1)
    own = torch.arange(n_keys, device=key_mask.device) == torch.arange(start, n_keys, device=key_mask.device)[:, None]
    return allowed | (~allowed.any(-1, keepdim=True) & own), False


# ---- the online softmax (eq. 6.10): softmax over the keys a block at a time, as FlashAttention computes it ----

class OnlineStep(NamedTuple):
    """One block of keys in the online softmax of one query row (eq. 6.10)."""
    start: int          # the block's keys start:stop
    stop: int
    block_max: float    # max_j s_j over the block (−inf where it masks every key)
    m: float            # the running max after it, m_new = max(m_old, block_max)
    rescale: float      # e^(m_old − m_new), what ℓ (and the output) carried so far is multiplied by
    ell: float          # the running sum after it, ℓ = ℓ·e^(m_old − m_new) + Σ_j e^(s_j − m_new)


def _check_block(block, n: int) -> int:
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a whole number of keys ≥ 1, got {block!r}")
    return min(block, max(n, 1))


def _shifted(m: Tensor) -> Tensor:
    # the max subtracted before exp: m itself, or 0 while every key so far is masked (m = −∞), so no −∞ − −∞
    return torch.where(torch.isinf(m), torch.zeros_like(m), m)


def online_softmax(scores: Tensor, block: int, values: Tensor | None = None
                   ) -> tuple[Tensor, list[OnlineStep], Tensor | None]:
    """One query row's softmax, reading its scores a block of keys at a time (eq. 6.10).

    scores: [n] the row's scores with −∞ where the mask hides a key; values: [n, d_head] or None.
    Returns (probs [n], the step of each block, out [d_head] = Σ_j p_j·v_j or None): the running max m and sum ℓ
    are all the row keeps between blocks, and out is accumulated the same way, so no block's weights are kept.
    The probabilities are e^(s_j − m)/ℓ with the final m and ℓ, equal to softmax(scores)."""
    if scores.dim() != 1 or scores.numel() == 0:
        raise ValueError(f"scores must be one query row [n] with n ≥ 1, got shape {list(scores.shape)}")
    if values is not None and (values.dim() != 2 or values.shape[0] != scores.shape[0]):
        raise ValueError(f"values must be [n, d_head] with n = {scores.shape[0]}, got {list(values.shape)}")
    n = scores.shape[0]
    block = _check_block(block, n)
    m = scores.new_tensor(float("-inf"))
    ell = scores.new_zeros(())
    out = None if values is None else values.new_zeros(values.shape[1])
    steps = []
    for start in range(0, n, block):
        s = scores[start:start + block]
        block_max = s.max()
        m_new = torch.maximum(m, block_max)
        rescale = torch.exp(m - _shifted(m_new)) if torch.isfinite(m) else scores.new_tensor(0.0)
        p = torch.exp(s - _shifted(m_new))                                 # [block], 0 where masked
        ell = ell * rescale + p.sum()
        if out is not None:
            out = out * rescale + p @ values[start:start + block]          # [d_head]
        m = m_new
        steps.append(OnlineStep(start, start + s.shape[0], float(block_max), float(m), float(rescale), float(ell)))
    if not float(ell) > 0:
        raise ValueError("every key of this row is masked (all scores −∞): its softmax is undefined")
    probs = torch.exp(scores - m) / ell
    return probs, steps, None if out is None else out / ell


def online_attention(q: Tensor, k: Tensor, v: Tensor, block: int, scale: float | None = None,
                     mask: Tensor | None = None) -> Tensor:
    """softmax(q·kᵀ·scale + M)·v for one head, the FlashAttention way (eq. 6.10): every query row keeps its
    running max m [T], sum ℓ [T] and output accumulator [T, d_head] while the keys and values pass a block at a
    time, so only a few blocks' scores and weights [T, block] exist at once, never the [T, T] matrix (what it
    holds at most: softmax_bytes).

    q: [T, d_head], k and v: [Tk, d_head], mask: [T, Tk] bool (True where the query may read the key) or None;
    scale: 1/√d_head unless given. A row that may read no key is an error, as in online_softmax."""
    if q.dim() != 2 or k.dim() != 2 or v.dim() != 2 or k.shape != v.shape or q.shape[1] != k.shape[1]:
        raise ValueError(f"q, k, v must be one head's [T, d_head], [Tk, d_head], [Tk, d_head]; got "
                         f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if mask is not None and mask.shape != (q.shape[0], k.shape[0]):
        raise ValueError(f"mask must be [T, Tk] = {[q.shape[0], k.shape[0]]}, got {list(mask.shape)}")
    scale = q.shape[1] ** -0.5 if scale is None else scale
    n_keys = k.shape[0]
    block = _check_block(block, n_keys)
    m = q.new_full((q.shape[0],), float("-inf"))                           # [T]
    ell = q.new_zeros(q.shape[0])                                          # [T]
    out = q.new_zeros(q.shape[0], v.shape[1])                              # [T, d_head]
    for start in range(0, n_keys, block):
        s = (q @ k[start:start + block].T) * scale                        # [T, block]
        if mask is not None:
            s = s.masked_fill(~mask[:, start:start + block], float("-inf"))
        m_new = torch.maximum(m, s.max(-1).values)
        shift = _shifted(m_new)
        rescale = torch.exp(m - shift)                                     # [T]; 0 while m = −∞
        p = torch.exp(s - shift[:, None])                                  # [T, block]
        ell = ell * rescale + p.sum(-1)
        out = out * rescale[:, None] + p @ v[start:start + block]
        m = m_new
    if not bool((ell > 0).all()):
        raise ValueError("a query row may read no key (its mask row is all False): its softmax is undefined")
    return out / ell[:, None]


def softmax_bytes(n_queries: int, n_keys: int, block: int, d_head: int, bytes_per: int = 4) -> dict[str, int]:
    """The most bytes each method holds at once beyond q, k, v and the output, for one head without a mask (eq. 6.10),
    counted from the shapes of the tensors alive together, statement by statement.

    plain, softmax(q·kᵀ·scale)·v: two [Tq, Tk] matrices at once, the product and the scaled scores, then the scores
    and the weights.
    online, online_attention's loop: a name keeps its tensor until it is bound again, so while block i's scores are
    made the previous block's scores and weights are still held. With b_prev and b the two blocks' widths (b_prev = 0
    for the first block), the largest of these statements' sums:
      scores   s = q·kᵀ·scale     previous s and p, the product, s:      (2·b_prev + 2·b)·Tq + acc + 4 [Tq]
      max      m_new = max(...)   previous p, s:                         (b_prev + b)·Tq + acc + 6 [Tq] + int64 [Tq]
      weights  p = e^(s − m)      previous p, s, s − m, p:               (b_prev + 3·b)·Tq + acc + 5 [Tq]
      sum      ℓ = ℓ·r + Σp       s, p:                                  2·b·Tq + acc + 8 [Tq]
      output   o = o·r + p·v      s, p, and o, o·r, p·v, the new o:      2·b·Tq + 4·acc + 5 [Tq]
    where acc = Tq·d_head is the output accumulator o, and the [Tq] vectors are the running max m (and m_new), the sum
    ℓ, the shift, the rescale r and the statement's own temporaries (in the first block's scores and max, two fewer:
    no shift and rescale yet). A mask adds its slice and a masked copy of the scores, not counted here. The count is
    exact for float32 (bytes_per 4): the most the tensors the loop makes hold at once; the allocator's own keeping
    (freed blocks it does not hand back) comes on top of it."""
    block = min(block, n_keys)
    n_blocks = -(-n_keys // block)
    last = n_keys - (n_blocks - 1) * block
    pairs = {(0, block if n_blocks > 1 else n_keys)}                   # (previous width, this width)
    if n_blocks > 2:
        pairs.add((block, block))
    if n_blocks > 1:
        pairs.add((block, last))
    acc, n = d_head * n_queries * bytes_per, n_queries
    online = 0
    for previous, width in pairs:
        fewer = 0 if previous else 2                                   # no shift and rescale yet in the first block
        online = max(online,
                     (2 * previous + 2 * width) * n * bytes_per + acc + (4 - fewer) * n * bytes_per,
                     (previous + width) * n * bytes_per + acc + (6 - fewer) * n * bytes_per + 8 * n,
                     (previous + 3 * width) * n * bytes_per + acc + 5 * n * bytes_per,
                     2 * width * n * bytes_per + acc + 8 * n * bytes_per,
                     2 * width * n * bytes_per + 4 * acc + 5 * n * bytes_per)
    return {"plain": 2 * n_queries * n_keys * bytes_per, "online": online}


# ---- observers: who sees the attention probabilities as a forward pass computes them ----
# An observer is called as observer(kind, layer, probs [B, H, Tq, Tk] float32) for each layer it wants. kind is
# "self" (the main stack), "encoder" (a seq2seq model's encoder) or "cross" (its decoder's cross-attention).
# Layers it does not want keep the fused fast path above, so observing one layer costs one layer.
# An observer with rows_per_block set receives each map in blocks of query rows instead,
# observer(kind, layer, probs [B, H, rows, width], start, n): rows start.. of an n-key map, keys from width on with
# probability 0; the layer's output is computed from those same blocks (attention_rows). This is how long texts are
# captured (core/analysis/capture.py) without an n × n float32 matrix.

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
