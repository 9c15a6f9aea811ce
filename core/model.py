"""The Transformer: attention, Pre-LN / Post-LN (and parallel, sandwich) blocks, encoder and decoder stacks.

Every family is this one model with a different ModelConfig; core/families/ holds only config readers, weight-name
tables and config-field tables. The embeddings and the LM head are in core/layers.py, masks in core/attention.py. Parameters keep the checkpoint's layout
(nn.Linear's [out, in]), with q/k/v fused into one matrix and gate/up into another (rows concatenated).

One forward pass can also show its attention to an observer (core/attention.py), record internals by stable
names, remove chosen heads and return the logit lens (core/probe.py, which also splits weights by head), and
let gradients reach the token embeddings. Generating reads and writes a KV cache (core/kv_cache.py).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
from torch import Tensor, nn

from . import generate as generation
from .approx import Approx, approximate, head_errors
from .attention import (attention, attention_rows, causal_mask, padding_or_none, position_mask, positions_from_mask,
                        local_global_mask, self_attention_mask)
from .config import ModelConfig, encoder_config
from .kv_cache import KVCache
from .layers import Embeddings, FeedForward, LMHead, Norm, ScoreBias, rope_cos_sin, rope_inv_freq, rotate
from .attention import AttentionRecorder, Kind, Observer
from .probe import HeadWeights, LogitLens, Patch, Probe, read_logit_lens, split_by_head


@dataclass
class ModelOutput:
    logits: Tensor | None                       # [B, T, vocab], None without an LM head
    hidden_states: Tensor                       # [B, T, d] after the last block (and final norm)
    attentions: tuple[Tensor, ...] | None = None          # per layer [B, H, Tq, Tk] float32
    encoder_attentions: tuple[Tensor, ...] | None = None
    cross_attentions: tuple[Tensor, ...] | None = None
    encoder_hidden_states: Tensor | None = None
    records: dict[str, tuple[Tensor, ...]] | None = None  # name → one tensor per layer (see probe.RECORDABLE)
    logit_lens: LogitLens | None = None
    token_embeddings: Tensor | None = None      # [B, T, d], the leaf that gradients reach (grad=True)
    approx_errors: dict[int, tuple[Tensor | None, Tensor]] | None = None  # Approx(shadow=True): layer → head_errors


@dataclass
class LayerTerms:
    """The mask and rotation of the layers of one type ("full" or "sliding") in one pass."""
    allowed: Tensor | None          # bool [B, 1, Tq, Tk], True where attention may go
    is_causal: bool                 # add the standard causal mask (cheaper than building it)
    rope: tuple[Tensor, Tensor] | None  # cos, sin [B, 1, T, rotary_dim]
    window: int | None = None       # a sliding window attention adds to the mask, when it hides keys on this text


@dataclass
class AttentionSetup:
    """What every layer of one stack shares in one forward pass."""
    allowed: Tensor | None          # bool [B, 1, Tq, Tk], True where attention may go
    is_causal: bool                 # add the standard causal mask (cheaper than building it)
    scale: float | None             # the factor on QKᵀ; None: 1/√d_k
    rope: tuple[Tensor, Tensor] | None  # cos, sin [B, 1, T, rotary_dim]
    bias: Tensor | None = None      # float [B or 1, H, Tq, Tk] added to every layer's scores (ALiBi, T5)
    softcap: float | None = None    # the scores' soft cap c (Gemma 2)
    sliding: LayerTerms | None = None   # the "sliding" layers' own mask and rotation, where they differ
    layer_types: tuple[str, ...] = ()   # "full" | "sliding" per layer (config.layer_types)
    kind: Kind = "self"
    observer: Observer | None = None
    probe: Probe | None = None
    query_mask: Tensor | None = None        # bool [B, Tq], False on padding (mean ablation averages the rest)
    cache: KVCache | None = None
    slot: Tensor | None = None              # [1] long: the cache position a one-token static step writes
    memory: Tensor | None = None            # encoder output for cross-attention [B, S, d]
    memory_allowed: Tensor | None = None    # bool [B, 1, 1, S]: the encoder's real tokens
    approx: Approx | None = None            # an approximation of the stack's self-attention (core.approx)
    approx_errors: dict | None = None       # layer → (total variation [B, H] or None, z's relative error [B, H])

    def terms(self, layer: int) -> LayerTerms:
        """The mask and rotation layer `layer` uses: its type's (a window, another RoPE base) or the stack's."""
        if self.sliding is not None and self.layer_types and self.layer_types[layer] == "sliding":
            return self.sliding
        return LayerTerms(self.allowed, self.is_causal, self.rope)

    def observes(self, kind: Kind, layer: int) -> bool:
        """The observer takes this layer's probabilities."""
        return self.observer is not None and self.observer.wants(kind, layer)

    def records_pattern(self, kind: Kind, layer: int) -> bool:
        return self.probe is not None and kind != "cross" and self.probe.wants(kind, "pattern", layer)

    def keeper(self, layer: int) -> Callable[[str, Tensor], None] | None:
        """keep(name, value) for what a part of this layer records (probe.RECORDABLE), or None: nothing is."""
        return None if self.probe is None else self.probe.keeper(self.kind, layer)


class Attention(nn.Module):
    """Multi-head attention, eq. 3.1: W^O · concat_i(Attention(X W_i^Q, X W_i^K, X W_i^V)).

    Self-attention keeps W^Q, W^K, W^V in one matrix ([H + 2·H_kv]·d_k rows) so projecting is one matmul;
    cross-attention projects queries from the decoder and keys/values (one matrix) from the encoder output.
    """

    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        if cross:
            self.q = nn.Linear(cfg.d_model, q_dim, bias=cfg.qkv_bias)
            self.kv = nn.Linear(cfg.d_model, 2 * kv_dim, bias=cfg.qkv_bias)
        else:
            self.qkv = nn.Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=cfg.qkv_bias)
        self.out = nn.Linear(q_dim, cfg.d_model, bias=cfg.out_bias)
        # QK-norm: an RMSNorm over d_k on each head's queries and keys, before RoPE (Qwen3, Gemma 3)
        qk_norm = cfg.qk_norm and not cross
        self.q_norm = Norm(cfg, cfg.head_dim, kind="rmsnorm") if qk_norm else None
        self.k_norm = Norm(cfg, cfg.head_dim, kind="rmsnorm") if qk_norm else None
        # a sink in each row's denominator: a logit per head (gpt-oss's `sinks`) or a key per head; zero at the
        # start either way (one more e^0)
        shapes = {"logit": (cfg.n_heads,), "key": (cfg.n_heads, cfg.head_dim)}
        if cfg.attention_sinks and cfg.attention_sinks not in shapes:
            raise ValueError(f"attention_sinks must be one of {', '.join(shapes)} or empty, got {cfg.attention_sinks!r}")
        self.sinks = nn.Parameter(torch.zeros(shapes[cfg.attention_sinks])) if cfg.attention_sinks and not cross \
            else None
        # gated attention (Qiu et al. 2025, G1): σ(x·W_g) [B, T, H·d_k] multiplies each head's output before W_O
        self.gate = nn.Linear(cfg.d_model, q_dim, bias=False) if cfg.attn_output_gate and not cross else None
        # differential attention (Ye et al. 2025): heads 2i and 2i+1 form differential head i; λ's four vectors [d_k],
        # shared by the layer's heads, and the RMSNorm over 2·d_k that each differential head's output passes (one
        # gain for all of them, as the paper's code has it)
        self.differential = cfg.differential_attention and not cross
        if self.differential:
            self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
                nn.Parameter(torch.randn(cfg.head_dim) * 0.1) for _ in range(4))         # the paper's N(0, 0.1²)
            self.diff_norm = Norm(cfg, 2 * cfg.head_dim, kind="rmsnorm")
            nn.init.ones_(self.diff_norm.weight)

    def heads(self, x: Tensor, n: int) -> Tensor:
        """[B, T, n·d_k] → [B, n, T, d_k]"""
        return x.view(x.shape[0], x.shape[1], n, self.head_dim).transpose(1, 2)

    def kv_weight(self) -> Tensor:
        """[W_K; W_V], [2·H_kv·d_k, d_model]: the rows of the fused projection that make keys and values."""
        return self.qkv.weight[self.n_heads * self.head_dim:]

    def self_qkv(self, x: Tensor, rope: tuple[Tensor, Tensor] | None,
                 keep: Callable[[str, Tensor], None] | None = None,
                 lowrank: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q [B, H, T, d_k], k and v [B, H_kv, T, d_k]; RoPE rotates queries and keys (in one go).
        keep receives q, k, v and, before any rotation, q_unrotated and k_unrotated ([B, T, heads, d_k]).
        lowrank (down [r, d_model], up [2·H_kv·d_k, r]): keys and values from the latent c = down·x, up·c (+ bias),
        normed and rotated after, as a latent-attention cache would give them (core.approx, lowrank_kv)."""
        qkv = self.qkv(x)
        if lowrank is not None:
            q_dim, (down, up) = self.n_heads * self.head_dim, lowrank
            kv = (x @ down.T) @ up.T                                     # [B, T, 2·H_kv·d_k] through r numbers
            if self.qkv.bias is not None:
                kv = kv + self.qkv.bias[q_dim:]
            qkv = torch.cat([qkv[..., :q_dim], kv], dim=-1)
        qk, v = self.heads(qkv, self.n_heads + 2 * self.n_kv_heads).split(
            [self.n_heads + self.n_kv_heads, self.n_kv_heads], dim=1)
        split = [self.n_heads, self.n_kv_heads]
        if self.q_norm is not None:
            q, k = qk.split(split, dim=1)
            qk = torch.cat([self.q_norm(q), self.k_norm(k)], dim=1)
        if keep is not None:
            for name, t in zip(("q_unrotated", "k_unrotated"), qk.split(split, dim=1)):
                keep(name, t.transpose(1, 2))
        if rope is not None:
            qk = rotate(qk, *rope)
        q, k = qk.split(split, dim=1)
        if keep is not None:
            for name, t in (("q", q), ("k", k), ("v", v)):
                keep(name, t.transpose(1, 2))
        return q, k, v

    def forward(self, x: Tensor, setup: AttentionSetup, layer: int, cross: bool = False) -> Tensor:
        kind, cache, probe = ("cross" if cross else setup.kind), setup.cache, setup.probe
        if cross:
            q = self.heads(self.q(x), self.n_heads)
            if cache is not None and cache.cross[layer] is not None:
                k, v = cache.cross[layer]
            else:
                k, v = self.heads(self.kv(setup.memory), 2 * self.n_kv_heads).chunk(2, dim=1)
                if cache is not None:
                    cache.cross[layer] = (k, v)
            allowed, is_causal = setup.memory_allowed, False
            bias = window = None
        else:
            terms = setup.terms(layer)
            approx = setup.approx if setup.approx is not None and setup.approx.applies(layer) else None
            lowrank = approx.factors(layer, self.kv_weight()) if approx and approx.method == "lowrank_kv" else None
            q, k, v = self.self_qkv(x, terms.rope, setup.keeper(layer), None if approx and approx.shadow else lowrank)
            if cache is not None:
                k, v = cache.write(layer, k, v, setup.slot)
            allowed, is_causal, bias, window = terms.allowed, terms.is_causal, setup.bias, terms.window
            if approx is not None:
                approx_kv = self.self_qkv(x, terms.rope, lowrank=lowrank)[1:] if lowrank is not None and approx.shadow \
                    else (k, v)
                z = self.approximated(q, k, v, approx_kv, allowed, is_causal, setup, approx, layer, bias, window)
        if cross or approx is None:
            attend = self.attend_differential if self.differential else self.attend
            z = attend(q, k, v, allowed, is_causal, setup, kind, layer, bias, window)        # [B, H, T, d_k]
        if self.gate is not None:   # G1: z_h ⊙ σ(x·W_g,h), elementwise and per head, before W_O
            z = z * torch.sigmoid(self.heads(self.gate(x), self.n_heads))
        if probe is not None and not cross:
            z = probe.ablated(kind, layer, z, setup.query_mask).transpose(1, 2)     # [B, T, H, d_k]
            z = probe.patched(kind, "z", layer, z)
            probe.keep(kind, "z", layer, z)
        else:
            z = z.transpose(1, 2)
        z = z.reshape(x.shape[0], x.shape[1], self.n_heads * self.head_dim)
        return self.out(z)

    def differential_lambda(self, layer: int) -> tuple[Tensor, float]:
        """(λ, λ_init) of differential attention at `layer` (counted from 0): λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) +
        λ_init, λ_init = 0.8 − 0.6·exp(−0.3·(l − 1)) with l = layer + 1 counted from 1, as the paper counts."""
        init = 0.8 - 0.6 * math.exp(-0.3 * layer)
        lam = torch.exp((self.lambda_q1 * self.lambda_k1).sum()) - torch.exp((self.lambda_q2 * self.lambda_k2).sum())
        return lam + init, init

    def attend_differential(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, is_causal: bool,
                            setup: AttentionSetup, kind: Kind, layer: int, bias: Tensor | None = None,
                            window: int | None = None) -> Tensor:
        """Differential attention (Ye et al. 2025, ICLR; their eqs. 1–3) in the paper's layout: the layer's H heads
        form H/2 differential heads, head 2i giving Q₁, K₁ and head 2i+1 giving Q₂, K₂ of differential head i (each
        d = d_k wide, scored at s = 1/√d_k as a softmax head is), and their values together its V [T, 2·d_k], as
        the paper's code views the same projections. W_Q, W_K, W_V and W_O keep the softmax layer's shapes; the
        layer adds λ's four vectors [d_k] and the norm's gain [2·d_k]:
          A_i = softmax(Q₁K₁ᵀs + M) − λ·softmax(Q₂K₂ᵀs + M)
          z_i = (1 − λ_init)·RMSNorm(A_i·V_i)        over 2·d_k; heads 2i and 2i+1 hold its two halves
        The scores' other terms (soft cap, bias, mask, window) enter both softmaxes alike. What the observers and the
        `pattern` record receive for heads 2i and 2i+1 is A_i, the difference map that multiplies V: its rows sum
        to 1 − λ and its entries may be negative."""
        lam, init = self.differential_lambda(layer)
        (b, h, t, d), n_keys = q.shape, k.shape[-2]
        q1, q2, k1, k2 = q[:, 0::2], q[:, 1::2], k[:, 0::2], k[:, 1::2]          # [B, H/2, T, d_k]
        values = v.unflatten(1, (h // 2, 2)).transpose(2, 3).flatten(-2)          # [B, H/2, Tk, 2·d_k]
        observe, keep = setup.observes(kind, layer), setup.records_pattern(kind, layer)
        terms = dict(return_probs=observe or keep, softcap=setup.softcap, bias=bias, window=window)
        if bias is not None and bias.shape[1] > 1:   # a bias per head: each softmax takes its own head's
            bias1, bias2 = bias[:, 0::2], bias[:, 1::2]
        else:
            bias1 = bias2 = bias
        out1, p1 = attention(q1, k1, values, allowed, is_causal, setup.scale, **{**terms, "bias": bias1})
        out2, p2 = attention(q2, k2, values, allowed, is_causal, setup.scale, **{**terms, "bias": bias2})
        out = out1 - lam.to(out1.dtype) * out2                                          # A·V [B, H/2, T, 2·d_k]
        if observe or keep:
            probs = (p1 - lam.float() * p2).repeat_interleave(2, dim=1)                # A [B, H, Tq, Tk]
            if keep:
                setup.probe.keep(kind, "pattern", layer, probs)
            if observe:   # the whole map as one block to an observer that takes blocks of rows
                setup.observer(kind, layer, probs, 0, n_keys, 0)
        z = (1 - init) * self.diff_norm(out)                                             # [B, H/2, T, 2·d_k]
        return z.unflatten(-1, (2, d)).transpose(2, 3).reshape(b, h, t, d)             # [B, H, T, d_k]

    def sink_logits(self, q: Tensor, scale: float | None) -> Tensor | None:
        """The sink's entry in each row's denominator: [H] logits as they are, or a key per head scored by each
        query (q [B, H, T, d_k] → [B, H, T, 1], with the scores' scale); None without a sink."""
        if self.sinks is None or self.sinks.dim() == 1:
            return self.sinks
        scale = self.head_dim ** -0.5 if scale is None else scale
        return (q.float() * self.sinks.float()[None, :, None, :]).sum(-1, keepdim=True) * scale

    def approximated(self, q: Tensor, k: Tensor, v: Tensor, approx_kv: tuple[Tensor, Tensor], allowed: Tensor | None,
                     is_causal: bool, setup: AttentionSetup, approx: Approx, layer: int, bias: Tensor | None,
                     window: int | None) -> Tensor:
        """This layer's attention under `approx` (core.approx.approximate) on its chosen heads, exact attention on the
        rest; with approx.shadow, exact attention's output with each head's error beside it in setup.approx_errors.
        approx_kv: the keys and values the approximation reads (lowrank_kv's, else k and v)."""
        kind, softcap, sink = setup.kind, setup.softcap, self.sink_logits(q, setup.scale)
        observe, keep = setup.observes(kind, layer), setup.records_pattern(kind, layer)
        wanted = observe or keep
        if wanted and not approx.has_weights and not approx.shadow:
            raise ValueError(f"{approx.method} weighs {approx.rank} mixed rows, not the keys: it has no attention "
                             "pattern to show (record z, or use shadow=True for the exact pattern)")
        heads = approx.head_mask(self.n_heads, q.device)
        exact_needed = approx.shadow or heads is not None
        exact_out = exact_probs = None
        if exact_needed:
            exact_out, exact_probs = attention(q, k, v, allowed, is_causal, setup.scale,
                                               return_probs=wanted or (approx.shadow and approx.has_weights),
                                               softcap=softcap, bias=bias, window=window, sink=sink)
        out, probs = approximate(q, *approx_kv, approx, layer, allowed, is_causal, setup.scale, softcap, bias, window,
                                 sink, return_probs=approx.has_weights and (wanted or approx.shadow))
        if heads is not None:               # the chosen heads approximated, the others exact
            out = torch.where(heads[:, None, None], out, exact_out)
            if probs is not None and exact_probs is not None:
                probs = torch.where(heads[:, None, None], probs, exact_probs)
        if approx.shadow:
            setup.approx_errors[layer] = head_errors(exact_out, out, exact_probs, probs, setup.query_mask)
            out, probs = exact_out, exact_probs
        if keep:
            setup.probe.keep(kind, "pattern", layer, probs)
        if observe:
            setup.observer(kind, layer, probs)
        return out

    def attend(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, is_causal: bool,
               setup: AttentionSetup, kind: Kind, layer: int, bias: Tensor | None = None,
               window: int | None = None) -> Tensor:
        """Eq. 2.1 on the fast path, or on the explicit one when the probabilities are wanted."""
        softcap = setup.softcap if kind != "cross" else None
        sink = self.sink_logits(q, setup.scale)
        observe, keep = setup.observes(kind, layer), setup.records_pattern(kind, layer)
        rows = setup.observer.rows_per_block if observe and not keep else None
        if rows:  # an observer that takes the probabilities a block of query rows at a time
            out = q.new_empty(q.shape[0], self.n_heads, q.shape[2], self.head_dim)
            scale = self.head_dim ** -0.5 if setup.scale is None else setup.scale
            for start, block, out_block, first in attention_rows(q, k, v, allowed, is_causal, scale, rows, softcap,
                                                                 bias, window, sink):
                out[:, :, start:start + block.shape[2]] = out_block
                setup.observer(kind, layer, block, start, k.shape[-2], first)
            return out
        out, probs = attention(q, k, v, allowed, is_causal, setup.scale, return_probs=observe or keep,
                               softcap=softcap, bias=bias, window=window, sink=sink)
        if keep:
            setup.probe.keep(kind, "pattern", layer, probs)
        if observe:
            setup.observer(kind, layer, probs)
        return out


class Block(nn.Module):
    """One Transformer layer. Sublayers in order: self-attention, cross-attention (decoder of seq2seq only),
    feed-forward; each wrapped as Pre-LN x + f(norm(x)) or Post-LN (eqs. 5.1–5.4) norm(x + f(x)).
    Two variants of the wiring, each a config switch: parallel (GPT-NeoX) x + attn(norm₁(x)) + mlp(norm₂(x)),
    both sublayers reading the block's input; sandwich (Gemma 2/3) x + post_norm(f(norm(x))), a norm on each
    sublayer's output too. attn_out and mlp_out are always what joins the residual stream."""

    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__()
        self.pre_norm, self.parallel = cfg.norm_placement == "pre", cfg.parallel_block
        self.attn_norm, self.attn = Norm(cfg), Attention(cfg)
        self.cross_norm, self.cross = (Norm(cfg), Attention(cfg, cross=True)) if cross else (None, None)
        self.ffn_norm, self.ffn = Norm(cfg), FeedForward(cfg)
        self.attn_post_norm = Norm(cfg) if cfg.sandwich_norm else None
        self.ffn_post_norm = Norm(cfg) if cfg.sandwich_norm else None
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout else None  # on sublayer outputs, as in the paper

    def branch(self, x: Tensor, name: str, f: Callable[[Tensor], Tensor], norm: Norm, post_norm: Norm | None,
               setup: AttentionSetup, layer: int) -> Tensor:
        """One sublayer's contribution: f(norm(x)) in Pre-LN (through post_norm where there is one), f(x) in
        Post-LN, patched and recorded as {name}_out."""
        h = norm(x) if self.pre_norm else x
        out = f(h)
        if post_norm is not None:
            out = post_norm(out)
        if self.dropout is not None:
            out = self.dropout(out)
        if setup.probe is not None:
            out = setup.probe.patched(setup.kind, f"{name}_out", layer, out)
            setup.probe.keep(setup.kind, f"{name}_in", layer, h)
            setup.probe.keep(setup.kind, f"{name}_out", layer, out)
        return out

    def sublayer(self, x: Tensor, name: str, f: Callable[[Tensor], Tensor], norm: Norm, post_norm: Norm | None,
                 setup: AttentionSetup, layer: int) -> Tensor:
        out = self.branch(x, name, f, norm, post_norm, setup, layer)
        return x + out if self.pre_norm else norm(x + out)

    def forward(self, x: Tensor, setup: AttentionSetup, layer: int) -> Tensor:
        if setup.probe is not None:
            x = setup.probe.patched(setup.kind, "resid_pre", layer, x)
            setup.probe.keep(setup.kind, "resid_pre", layer, x)
        attend = lambda h: self.attn(h, setup, layer)                                  # noqa: E731
        feed = lambda h: self.ffn(h, setup.keeper(layer))                              # noqa: E731
        if self.parallel:  # both read x: x + attn(norm₁(x)) + mlp(norm₂(x))
            attn_out = self.branch(x, "attn", attend, self.attn_norm, self.attn_post_norm, setup, layer)
            x = x + attn_out + self.branch(x, "mlp", feed, self.ffn_norm, self.ffn_post_norm, setup, layer)
        else:
            x = self.sublayer(x, "attn", attend, self.attn_norm, self.attn_post_norm, setup, layer)
            if self.cross is not None:
                x = self.sublayer(x, "cross", lambda h: self.cross(h, setup, layer, cross=True), self.cross_norm,
                                  None, setup, layer)
            x = self.sublayer(x, "mlp", feed, self.ffn_norm, self.ffn_post_norm, setup, layer)
        if setup.probe is not None:
            x = setup.probe.patched(setup.kind, "resid_post", layer, x)
            setup.probe.keep(setup.kind, "resid_post", layer, x)
        return x


class Stack(nn.Module):
    """Embeddings, then n_layers blocks, then an optional final norm (Pre-LN stacks)."""

    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg)
        self.blocks = nn.ModuleList(Block(cfg, cross) for _ in range(cfg.n_layers))
        self.final_norm = Norm(cfg) if cfg.final_norm else None
        # a bias on every layer's scores, one per stack (T5's table is learned by each stack's first layer)
        self.score_bias = ScoreBias(cfg, bidirectional=not cfg.causal) if cfg.score_bias != "none" else None

    def forward(self, x: Tensor, setup: AttentionSetup, n_layers: int | None = None, start: int = 0) -> Tensor:
        """x: the embeddings, or with start > 0 the residual stream entering block `start`."""
        for i in range(start, len(self.blocks) if n_layers is None else n_layers):
            x = self.blocks[i](x, setup, i)
        if self.final_norm is not None and n_layers is None:
            x = self.final_norm(x)
        return x


class Transformer(nn.Module):
    """The whole model. `stack` is the main stack: the decoder of GPT-2, Llama and Marian, BERT's encoder.
    `encoder` exists only for encoder-decoder models (Marian) and shares the token embeddings."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.stack = Stack(cfg, cross=cfg.is_encoder_decoder)
        self.encoder = Stack(encoder_config(cfg)) if cfg.is_encoder_decoder else None
        if self.encoder is not None:
            self.stack.embed.tokens = self.encoder.embed.tokens
        self.lm_head = LMHead(cfg) if cfg.has_lm_head else None
        # θ_i, moved with the model but not a weight: not in state_dict. inv_freq_local: "sliding" layers' own base
        rotary = cfg.rotary_dim or cfg.head_dim
        rope, local = cfg.positional == "rope", cfg.rope_local_theta and cfg.rope_local_theta != cfg.rope_theta
        self.register_buffer("inv_freq", rope_inv_freq(rotary, cfg.rope_theta) if rope else None, persistent=False)
        self.register_buffer("inv_freq_local", rope_inv_freq(rotary, cfg.rope_local_theta) if rope and local else None,
                             persistent=False)
        self.tokenizer = None  # set by load_model
        self.decoding = generation.CompiledDecoding()  # the compiled decode step and its cache, once asked for

    @property
    def device(self) -> torch.device:
        return self.stack.embed.tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.stack.embed.tokens.weight.dtype

    def attention_stack(self) -> tuple[Stack, Kind]:
        """The stack that reads the text, whose self-attention the views show: a seq2seq model's encoder
        ("encoder"), else the main stack ("self")."""
        return (self.encoder, "encoder") if self.encoder is not None else (self.stack, "self")

    def head_weights(self, layer: int, kind: Kind = "self") -> HeadWeights:
        """W_Q, W_K, W_V [heads, d_model, d_head] and W_O [H, d_head, d_model] of one layer's attention:
        kind "self" (the main stack), "encoder" or "cross" (a seq2seq decoder's cross-attention)."""
        stack = self.encoder if kind == "encoder" else self.stack
        if stack is None or (kind == "cross" and self.encoder is None) or kind not in ("self", "encoder", "cross"):
            raise ValueError(f"no {kind!r} attention in this model (kinds: self"
                             f"{', encoder, cross' if self.encoder is not None else ''})")
        block = stack.blocks[stack.cfg.check_layer(layer)]
        return split_by_head(block.cross if kind == "cross" else block.attn)

    def setup(self, stack: Stack, input_ids: Tensor, key_mask: Tensor | None, start: int, *, causal: bool,
              padding_mask: bool, scale: bool, positions: bool, window: tuple[int, int] | None = None,
              local_windows: bool = True) -> tuple[AttentionSetup, Tensor]:
        """Masks, position ids and rotary angles for n new tokens after `start` cached ones.
        Positions always skip padding; the padding_mask switch only changes what attention may see.
        window (w, g): every layer's mask also hides keys w or more places back (i − j ≥ w, eq. 6.5), except the
        first g keys, which every query still sees (a local + global mask); in a stack without the causal mask the
        window is symmetric (|i − j| ≥ w hidden) and the first g queries also see every key (Longformer)."""
        batch, n = input_ids.shape
        device, cfg = input_ids.device, stack.cfg
        allowed, is_causal = self_attention_mask(key_mask if padding_mask else None, start, n, causal, device)
        if window is not None:
            band = local_global_mask(n, start + n, window[0], window[1], device, bidirectional=not causal)
            if allowed is None and is_causal:
                allowed = causal_mask(n, start + n, device)[None, None]
            allowed, is_causal = band[None, None] if allowed is None else allowed & band, False
        position_ids = positions_from_mask(key_mask, start, n, batch, device)
        setup = AttentionSetup(allowed=allowed, is_causal=is_causal, scale=cfg.score_scale if scale else 1.0,
                               rope=self.rope(stack, position_ids, positions), softcap=cfg.attn_softcap,
                               layer_types=cfg.layer_types)
        if "sliding" in cfg.layer_types:
            setup.sliding = LayerTerms(allowed, is_causal, self.rope(stack, position_ids, positions, local=True))
            if local_windows and cfg.sliding_window is not None and start + n > cfg.sliding_window:
                setup.sliding.window = cfg.sliding_window     # attention puts it in the mask (else it hides nothing)
        if stack.score_bias is not None and positions:
            if stack.score_bias.by_index:   # places in the sequence, padding counted
                query_pos = torch.arange(start, start + n, device=device)[None]
                key_pos = torch.arange(start + n, device=device)[None]
            else:                           # real tokens counted, padding skipped
                query_pos, key_pos = position_ids, positions_from_mask(key_mask, 0, start + n, batch, device)
            setup.bias = stack.score_bias(query_pos, key_pos)
        if key_mask is not None:
            setup.query_mask = key_mask[:, start:start + n]
        return setup, position_ids

    def static_setup(self, stack: Stack, cache: KVCache) -> tuple[AttentionSetup, Tensor]:
        """One new token per row at cache.slot, attending over the whole cache: every shape fixed."""
        cfg = stack.cfg
        keys = torch.arange(cache.max_len, device=cache.slot.device)
        allowed = (cache.key_mask & (keys <= cache.slot))[:, None, None, :]   # [B, 1, 1, max_len]
        position_ids = cache.next_position[:, None]                             # [B, 1]
        setup = AttentionSetup(allowed=allowed, is_causal=False, scale=cfg.score_scale,
                               rope=self.rope(stack, position_ids, True), slot=cache.slot, softcap=cfg.attn_softcap,
                               layer_types=cfg.layer_types)
        if "sliding" in cfg.layer_types:
            sliding = allowed
            if cfg.sliding_window is not None:   # keys i − j ≥ w back are out of the window
                sliding = allowed & position_mask(cache.slot, keys, False, cfg.sliding_window)[None, None]
            setup.sliding = LayerTerms(sliding, False, self.rope(stack, position_ids, True, local=True))
        if stack.score_bias is not None:
            if stack.score_bias.by_index:
                query_pos, key_pos = cache.slot[None], keys[None]                           # [1, 1], [1, max_len]
            else:
                query_pos, key_pos = position_ids, (cache.key_mask.long().cumsum(-1) - 1).clamp(min=0)
            setup.bias = stack.score_bias(query_pos, key_pos)
        return setup, position_ids

    def ring_setup(self, stack: Stack, cache) -> tuple[AttentionSetup, Tensor]:
        """static_setup over a RollingKVCache (core.kv_cache): the full layers read the whole cache under the static
        step's mask; the windowed layers read their ring under cache.ring_allowed(), with their own rotation
        (Gemma's local RoPE base)."""
        setup, position_ids = self.static_setup(stack, cache)
        rope = setup.sliding.rope if setup.sliding is not None else setup.rope
        setup.layer_types = tuple("sliding" if w else "full" for w in cache.windowed)
        setup.sliding = LayerTerms(cache.ring_allowed(), False, rope)
        setup.cache = cache
        return setup, position_ids

    def rope(self, stack: Stack, position_ids: Tensor, positions: bool,
             local: bool = False) -> tuple[Tensor, Tensor] | None:
        """cos, sin [B, 1, T, rotary_dim] at position_ids [B, T]; local: with the "sliding" layers' own base."""
        if positions and stack.cfg.positional == "rope":
            inv_freq = self.inv_freq_local if local and self.inv_freq_local is not None else self.inv_freq
            return rope_cos_sin(position_ids, inv_freq, self.dtype)
        return None

    def layer_inv_freq(self, stack: Stack, layer: int) -> Tensor | None:
        """θ_i [rotary_dim/2], the frequencies `layer` of `stack` rotates with (config.local_rope: the sliding
        layers' own base), or None without RoPE."""
        if stack.cfg.positional != "rope":
            return None
        return self.inv_freq_local if stack.cfg.local_rope(layer) else self.inv_freq

    def layer_rope(self, stack: Stack, layer: int, position_ids: Tensor) -> tuple[Tensor, Tensor] | None:
        """cos, sin [B, 1, T, rotary_dim] of `layer` of `stack` at position_ids [B, T], or None without RoPE."""
        return self.rope(stack, position_ids, True, local=stack.cfg.local_rope(layer))

    def check_head(self, layer, head) -> tuple[int, int]:
        """(layer, head) of the stack that reads the text (attention_stack), each an int in range, or an
        IndexRangeError naming the range (core.config.check_index)."""
        stack, kind = self.attention_stack()
        return stack.cfg.check_head(layer, head, "the encoder" if kind == "encoder" else "the model")

    def run_stack(self, stack: Stack, input_ids: Tensor, attention_mask: Tensor | None, *, kind: Kind,
                  causal: bool = True, padding_mask: bool = True, scale: bool = True, positions: bool = True,
                  token_type_ids: Tensor | None = None, observer: Observer | None = None, probe: Probe | None = None,
                  cache: KVCache | None = None, static: bool = False, memory: Tensor | None = None,
                  memory_mask: Tensor | None = None, n_layers: int | None = None,
                  token_embeddings: Tensor | None = None, start_layer: int = 0,
                  resid: Tensor | None = None, window: tuple[int, int] | None = None,
                  local_windows: bool = True, approx: Approx | None = None,
                  approx_errors: dict | None = None) -> Tensor:
        """Embed input_ids [B, T] and run them through `stack`; returns hidden states [B, T, d].

        attention_mask: [B, T] for the new tokens, or [B, cached + T] (1 = real token, 0 = padding).
        With a cache, the tokens follow the cached ones and are written to it; static=True is the one-token
        decode step at cache.slot (see KVCache), which leaves advancing the cache to the caller.
        resid [B, T, d], with start_layer: resume from the residual stream entering that block (as recorded by
        resid_pre), skipping the embeddings and the blocks before it.
        """
        n = input_ids.shape[1]
        if static:
            setup, position_ids = self.static_setup(stack, cache)
        else:
            start = cache.length if cache is not None else 0
            key_mask = None
            if cache is not None:
                if attention_mask is not None:
                    cache.key_mask[:, start:start + n] = attention_mask[:, -n:].bool()
                    key_mask = cache.key_mask
            elif attention_mask is not None:
                key_mask = attention_mask.bool()
            setup, position_ids = self.setup(stack, input_ids, key_mask, start, causal=causal,
                                             padding_mask=padding_mask, scale=scale, positions=positions,
                                             window=window, local_windows=local_windows)
        setup.kind, setup.observer, setup.probe, setup.cache, setup.memory = kind, observer, probe, cache, memory
        setup.approx, setup.approx_errors = approx, approx_errors
        if memory is not None and memory_mask is not None and padding_mask:
            setup.memory_allowed = memory_mask.bool()[:, None, None, :]
        if resid is None:
            x = stack.embed(input_ids, position_ids, token_type_ids, positions, token_embeddings, setup.keeper(0))
        else:
            x = resid
        x = stack(x, setup, n_layers, start_layer)
        if cache is not None and not static:
            cache.advance(n)
        return x

    # ---- generation (core/generate.py) ----

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        cfg = self.config
        return KVCache(cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim, self.dtype, self.device)

    def generate(self, input_ids: Tensor, max_new_tokens: int, **options) -> Tensor:
        """Prompt + new tokens. options: temperature=0.0, top_k, top_p, repetition_penalty=1.0, seed, stop,
        attention_mask, compile (see core.generate.generate)."""
        return generation.generate(self, input_ids, max_new_tokens, **options)

    def stream(self, input_ids: Tensor, max_new_tokens: int, **options) -> Iterator[generation.Step]:
        """A Step for each token as it is made (token an int for one sequence, [B] for a batch); the same
        options, plus capture_attention (fills Step.rows) and top_probs=k (see core.generate.stream)."""
        return generation.stream(self, input_ids, max_new_tokens, **options)

    def logits(self, hidden: Tensor) -> Tensor | None:
        return None if self.lm_head is None else self.lm_head(hidden, self.stack.embed.tokens.weight)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, decoder_input_ids: Tensor | None = None,
                capture_attention: bool = False, causal_mask: bool = True, padding_mask: bool = True,
                scale: bool = True, positions: bool = True, token_type_ids: Tensor | None = None,
                decoder_attention_mask: Tensor | None = None, observer: Observer | None = None, *,
                record: Iterable[str] = (), ablate_heads: Iterable[tuple[int, int]] | Tensor = (), ablation: str = "zero",
                logit_lens: bool = False, logit_lens_top_k: int | None = 10, grad: bool = False,
                token_embeddings: Tensor | None = None, patches: Iterable[Patch] = (),
                return_logits: bool = True, window: int | None = None, global_tokens: int = 0,
                local_windows: bool = True, approx: Approx | None = None) -> ModelOutput:
        """One full forward pass. Runs in whatever autograd mode the caller chose (parameters of a loaded model
        do not require gradients, so no graph is kept unless something asks for one).

        The four switches (causal_mask, padding_mask, scale, positions) exist for the demos: each removes exactly
        what its name says. capture_attention returns every layer's probabilities as float32 [B, H, Tq, Tk];
        `observer` receives them instead, layer by layer.
        record: names from probe.RECORDABLE → out.records; ablate_heads / ablation / patches: see probe.Probe.
        logit_lens: out.logit_lens, each layer's residual stream through the final norm and the LM head
        (top logit_lens_top_k per position, or all with None).
        grad: gradients reach out.token_embeddings [B, T, d] (the input of the main stack, or of the encoder),
        even inside torch.inference_mode. token_embeddings: rows to use instead of looking input_ids up (for
        integrated gradients), before embed_scale, positions and token types.
        return_logits=False leaves out.logits None: a caller that reads the logits a block of positions at a time
        (model.logits on slices of out.hidden_states) never holds [B, T, vocab] at once.
        window: every self-attention layer of the main stack also hides keys `window` or more places back
        (eq. 6.5), as a "sliding" layer does; global_tokens: keys 0..g−1 stay visible to every query. On an
        encoder (no causal mask) the window is symmetric, |i − j| < w, and queries 0..g−1 also see every key.
        local_windows=False: a family's own sliding-window layers read every key, their own rotation kept (Gemma
        3's local layers widened); a full pass only, not a cached decode step.
        approx: an approximation (core.approx.Approx) of the self-attention of the stack that reads the text (a
        seq2seq model's encoder, else the main stack) on its layers and heads; with approx.shadow, out.approx_errors.
        """
        cfg = self.config
        if window is not None and self.encoder is not None:
            raise ValueError(f"a window narrows one stack's self-attention: {cfg.family} is an encoder-decoder; "
                             "use a decoder-only or an encoder-only model")
        if window is not None and (window < 1 or global_tokens < 0):
            raise ValueError(f"window={window}, global_tokens={global_tokens}: the window needs w ≥ 1 and g ≥ 0")
        local = None if window is None else (window, global_tokens)
        approximating = {}
        if approx is not None:
            if not isinstance(approx, Approx):
                raise TypeError(f"approx must be a core.approx.Approx, got {type(approx).__name__}")
            reader = self.attention_stack()[0]
            if reader.cfg.differential_attention:
                raise ValueError(f"{approx.method} replaces one softmax per head; a differential-attention head weighs "
                                 "a difference of two (softmax(Q₁K₁ᵀs) − λ·softmax(Q₂K₂ᵀs)), so it cannot be "
                                 "approximated here")
            approx.check(reader.cfg, len(reader.blocks))
            approximating = dict(approx=approx, approx_errors={} if approx.shadow else None)
        asked = {record} if isinstance(record, str) else set(record)
        probe = None
        ablating = isinstance(ablate_heads, Tensor) or bool(ablate_heads)
        patches = list(patches)
        if asked or ablating or logit_lens or patches:  # the lens reads each layer's output
            probe = Probe(cfg, asked | ({"resid_post"} if logit_lens else set()), ablate_heads, ablation, patches)
        attention_mask, decoder_attention_mask = padding_or_none(attention_mask), padding_or_none(decoder_attention_mask)
        recorder = AttentionRecorder() if capture_attention and observer is None else None
        observer = observer or recorder
        switches = dict(padding_mask=padding_mask, scale=scale, positions=positions, observer=observer, probe=probe,
                        local_windows=local_windows)
        mode = torch.inference_mode(False) if grad else contextlib.nullcontext()
        with mode, (torch.enable_grad() if grad else contextlib.nullcontext()):
            if grad:  # a leaf of our own, outside any inference mode the inputs were made in
                input_ids = input_ids.clone()
                if token_embeddings is None:
                    token_embeddings = self.attention_stack()[0].embed.tokens(input_ids).detach()
                token_embeddings = token_embeddings.clone().requires_grad_(True)
            memory = None
            if self.encoder is not None:
                memory = self.run_stack(self.encoder, input_ids, attention_mask, kind="encoder", causal=False,
                                        token_embeddings=token_embeddings, **switches, **approximating)
                if decoder_input_ids is None:
                    start = cfg.decoder_start_token_id
                    decoder_input_ids = torch.full((input_ids.shape[0], 1), start, device=input_ids.device)
                hidden = self.run_stack(self.stack, decoder_input_ids, decoder_attention_mask, kind="self",
                                        causal=causal_mask and cfg.causal, memory=memory,
                                        memory_mask=attention_mask, **switches)
            else:
                hidden = self.run_stack(self.stack, input_ids, attention_mask, kind="self",
                                        causal=causal_mask and cfg.causal, token_type_ids=token_type_ids,
                                        token_embeddings=token_embeddings, window=local, **switches, **approximating)
            out = ModelOutput(logits=self.logits(hidden) if return_logits else None, hidden_states=hidden, encoder_hidden_states=memory,
                              token_embeddings=token_embeddings if grad else None)
            if logit_lens:
                out.logit_lens = read_logit_lens(self, probe.layers("resid_post"), logit_lens_top_k)
        if recorder is not None:
            out.attentions = recorder.layers("self")
            out.encoder_attentions = recorder.layers("encoder") if self.encoder is not None else None
            out.cross_attentions = recorder.layers("cross") if self.encoder is not None else None
        if probe is not None:
            out.records = {name: probe.layers(name) for name in sorted(probe.records) if name in asked}
        if approximating.get("approx_errors") is not None:
            out.approx_errors = dict(sorted(approximating["approx_errors"].items()))
        return out
