"""Norms, feed-forward variants and positional encodings: sinusoidal and rotary on the vectors, ALiBi and T5's
relative buckets as a bias on the scores."""
from __future__ import annotations

import math

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import soft_cap
from .config import ModelConfig

ACTIVATIONS = {
    "gelu": F.gelu,                                         # exact, erf-based (BERT)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),   # GPT-2's "gelu_new"
    "silu": F.silu,                                         # a.k.a. swish (Llama's SwiGLU, Marian)
    "relu": F.relu,
}


class Norm(nn.Module):
    """LayerNorm (x-μ)/σ·γ+β or RMSNorm x/rms(x)·γ, over the last dimension (d, or d_k for a norm on q and k).
    With offset 1 the gain is (1 + γ), as Gemma stores it."""

    def __init__(self, cfg: ModelConfig, dim: int | None = None, kind: str | None = None):
        super().__init__()
        dim = dim or cfg.d_model
        self.kind, self.eps, self.offset = kind or cfg.norm, cfg.norm_eps, cfg.norm_offset
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim)) if cfg.norm_bias and self.kind == "layernorm" else None

    @property
    def gain(self) -> Tensor:
        """γ, or (1 + γ) with Gemma's offset."""
        return self.weight + self.offset if self.offset else self.weight

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "rmsnorm":
            # x / √(mean(x²) + ε) in float32, then scaled in the model dtype, as Llama does
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.gain * h.to(x.dtype)
        if self.offset:
            return F.layer_norm(x, x.shape[-1:], self.gain, self.bias, self.eps)
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)

    def divisor(self, x: Tensor) -> Tensor:
        """s [..., 1] float32, what the norm divides x [..., d] by: √(σ² + ε) (LayerNorm, eq. 5.4) or
        rms(x) = √(mean(x²) + ε) (RMSNorm)."""
        h = x.float()
        if self.kind == "rmsnorm":
            return torch.sqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + self.eps)

    def frozen(self, x: Tensor):
        """The norm at x with its scale frozen, as a linear map c ↦ γ ⊙ P(c) / s (float32): s is x's σ and P
        removes the mean (LayerNorm), or s is rms(x) and P is the identity (RMSNorm). norm(x) = frozen(x)(x) + β,
        so the parts of a sum x = Σ c_k map to parts that add up to norm(x) − β. c broadcasts against x."""
        s, gain = self.divisor(x), self.gain.float()
        if self.kind == "rmsnorm":
            return lambda c: gain * (c.float() / s)
        return lambda c: gain * ((c.float() - c.float().mean(-1, keepdim=True)) / s)


class FeedForward(nn.Module):
    """Position-wise FFN: down(act(up(x))), or gated (SwiGLU): down(act(gate(x)) ⊙ up(x))."""

    def __init__(self, cfg: ModelConfig, d_ff: int | None = None):
        super().__init__()
        d_ff = d_ff or cfg.d_ff
        self.gated, self.act = cfg.gated_ffn, ACTIVATIONS[cfg.activation]
        # gate and up share one [2·d_ff, d] matrix (gate rows first) so a gated FFN costs one matmul going in
        self.up = nn.Linear(cfg.d_model, (2 if self.gated else 1) * d_ff, bias=cfg.ffn_bias)
        self.down = nn.Linear(d_ff, cfg.d_model, bias=cfg.ffn_bias)

    def forward(self, x: Tensor, keep: Callable[[str, Tensor], None] | None = None) -> Tensor:
        """x [B, T, d] → [B, T, d]. keep(name, value), when given, receives the hidden stages [B, T, d_ff]
        (probe.RECORDABLE): mlp_up, mlp_gate (gated only) and mlp_hidden, what enters the down projection."""
        h = self.up(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            gate = self.act(gate)
            hidden = gate * up
        else:
            gate, up = None, h
            hidden = self.act(h)
        if keep is not None:
            for name, value in (("mlp_up", up), ("mlp_gate", gate), ("mlp_hidden", hidden)):
                if value is not None:
                    keep(name, value)
        return self.down(hidden)


def sinusoidal_encoding(positions: Tensor | int, d: int, interleaved: bool = True) -> Tensor:
    """Eq. 4.1: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

    positions: an int n (positions 0..n-1) or a tensor of positions, any shape [...]. Returns [..., d] float32.
    interleaved=False puts all sines first and all cosines after (Marian's layout); the values are the same.
    """
    if isinstance(positions, int):
        positions = torch.arange(positions)
    i = torch.arange(d // 2, dtype=torch.float64, device=positions.device)
    angles = positions.to(torch.float64)[..., None] / torch.pow(10000.0, 2 * i / d)  # [..., d/2]
    sin, cos = angles.sin(), angles.cos()
    pe = torch.stack([sin, cos], dim=-1).flatten(-2) if interleaved else torch.cat([sin, cos], dim=-1)
    return pe.float()


def rope_inv_freq(head_dim: int, theta: float) -> Tensor:
    """θ_i = theta^(-2i/d_head), one frequency per pair of dimensions: [head_dim/2] float32."""
    steps = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float()  # cpu even under a meta context
    return 1.0 / (theta ** (steps / head_dim))


def rope_angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """The rotation angle m·θ_i of each frequency pair at each position: positions [...] → [..., hd/2] float32."""
    return positions[..., None].float() * inv_freq.to(positions.device)


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [B, T] → cos, sin [B, 1, T, head_dim], angles m·θ_i repeated for both halves."""
    angles = rope_angles(positions, inv_freq)                               # [B, T, hd/2], float32
    emb = torch.cat([angles, angles], dim=-1)[:, None]                      # [B, 1, T, hd]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x_i, x_{i+r/2}) of the first r dims of x [B, H, T, hd] by its angle (rotate-half
    convention), r = cos.shape[-1]: all of a head (r = hd), or a part of it (GPT-NeoX's rotary_pct), the rest
    passing through unrotated."""
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([rotate(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def apply_rope(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """RoPE: x [B, H, T, hd] at position ids [B, T], each pair rotated by position·θ_i."""
    cos, sin = rope_cos_sin(positions, inv_freq, x.dtype)
    return rotate(x, cos, sin)



# ---- the ends of a stack: embeddings in, vocabulary logits out ----

class Embeddings(nn.Module):
    """Token embeddings (× embed_scale), plus token types and absolute positions where the family has them."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        n_positions = cfg.max_positions + cfg.position_offset
        self.positions = nn.Embedding(n_positions, cfg.d_model) if cfg.positional == "learned" else None
        self.token_types = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        self.norm = Norm(cfg) if cfg.embed_norm else None
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout else None

    def forward(self, input_ids: Tensor, positions: Tensor, token_type_ids: Tensor | None, use_positions: bool,
                token_embeddings: Tensor | None = None, keep: Callable[[str, Tensor], None] | None = None) -> Tensor:
        """token_embeddings [B, T, d], when given, stand in for the looked-up rows (before embed_scale).
        keep(name, value), when given, receives the parts before they are added (probe.EMBEDDING_PARTS)."""
        x = self.tokens(input_ids) if token_embeddings is None else token_embeddings
        if self.cfg.embed_scale != 1.0:
            x = x * self.cfg.embed_scale
        parts = [("embed", x)]                                                 # each [B, T, d]
        if self.token_types is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            parts.append(("type_embed", self.token_types(types)))
        if use_positions and self.positions is not None:
            parts.append(("pos_embed", self.positions(positions + self.cfg.position_offset)))
        if use_positions and self.cfg.positional == "sinusoidal":  # eq. 4.2: X_embed + PE
            parts.append(("pos_embed", sinusoidal_encoding(positions, self.cfg.d_model, interleaved=False).to(x.dtype)))
        if keep is not None:
            for name, part in parts:
                keep(name, part)
        for _, part in parts[1:]:
            x = x + part
        x = self.norm(x) if self.norm is not None else x
        return self.dropout(x) if self.dropout is not None else x


class LMHead(nn.Module):
    """Hidden states → vocabulary logits; a tied head reuses the token embedding matrix [vocab, d]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model) if cfg.lm_head_transform else None
        self.norm = Norm(cfg) if cfg.lm_head_transform else None
        self.act = cfg.activation
        self.weight = None if cfg.tie_word_embeddings else nn.Parameter(torch.empty(cfg.vocab_size, cfg.d_model))
        self.bias = nn.Parameter(torch.empty(cfg.vocab_size)) if cfg.lm_head_bias else None
        self.scale, self.softcap = cfg.lm_head_scale, cfg.final_softcap

    def forward(self, h: Tensor, embedding: Tensor) -> Tensor:
        """h [B, T, d], embedding: the token table (used when tied) → logits [B, T, vocab]."""
        if self.dense is not None:  # BERT's MLM transform
            h = self.norm(ACTIVATIONS[self.act](self.dense(h)))
        if self.scale != 1.0:     # T5 with tied embeddings: h·d^-½
            h = h * self.scale
        return self.capped(F.linear(h, embedding if self.weight is None else self.weight, self.bias))

    def capped(self, logits: Tensor) -> Tensor:
        """The final soft-cap c·tanh(logits / c) where the family has one (Gemma 2), else the logits."""
        return soft_cap(logits, self.softcap)


# ---- biases on the scores: positions said by a term added to QKᵀ, not by the vectors ----

def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's per-head slopes m_h [H] float32 (Press et al. 2022): the geometric sequence 2^(-8h/n), h = 1..n,
    for n a power of two; otherwise the sequence for the power of two p below n, then every other slope of the
    sequence for 2p (h = 1, 3, 5, ...) until there are n."""
    p = 2 ** math.floor(math.log2(n_heads))
    slopes = [2 ** (-8 * h / p) for h in range(1, p + 1)]
    slopes += [2 ** (-8 * h / (2 * p)) for h in range(1, 2 * (n_heads - p), 2)]
    return torch.tensor(slopes, dtype=torch.float32, device="cpu")  # cpu even under a meta context


def relative_bucket(distance: Tensor, bidirectional: bool, n_buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of a relative distance j − i (key minus query), any shape, long. Half the buckets are exact
    distances 0, 1, 2, ...; the rest grow logarithmically up to max_distance, past which all share the last.
    Bidirectional (an encoder): one half of the buckets for keys after the query, one for those before it.
    Causal (a decoder): only keys at or before the query have buckets, by i − j."""
    bucket = torch.zeros_like(distance)
    if bidirectional:
        n_buckets //= 2
        bucket = (distance > 0).long() * n_buckets
        distance = distance.abs()
    else:
        distance = (-distance).clamp(min=0)
    exact = n_buckets // 2
    log_ratio = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (n_buckets - exact)).long()).clamp(max=n_buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)


class ScoreBias(nn.Module):
    """A term added to every layer's scores, bias [B, H, Tq, Tk] from query and key positions [B, Tq], [B, Tk].

    "alibi": −m_h·(i − j), no weights; i and j count real tokens (padding skipped), as BLOOM counts them.
    "relative": T5's learned scalar per head and bucket of j − i, one table for all the layers of a stack; i and
    j are places in the sequence (padding counted), as T5 counts them."""

    def __init__(self, cfg: ModelConfig, bidirectional: bool):
        super().__init__()
        self.kind, self.bidirectional = cfg.score_bias, bidirectional
        self.n_buckets, self.max_distance = cfg.relative_buckets, cfg.relative_max_distance
        self.by_index = self.kind == "relative"
        if self.kind == "alibi":
            self.register_buffer("slopes", alibi_slopes(cfg.n_heads), persistent=False)
        elif self.kind == "relative":
            self.table = nn.Embedding(cfg.relative_buckets, cfg.n_heads)  # [buckets, H]
        else:
            raise ValueError(f"unknown score bias {self.kind!r}; expected 'alibi' or 'relative'")

    def forward(self, query_pos: Tensor, key_pos: Tensor) -> Tensor:
        distance = key_pos[:, None, :] - query_pos[:, :, None]                    # [B, Tq, Tk]: j − i
        if self.kind == "alibi":
            return self.slopes.to(query_pos.device)[:, None, None] * distance.float()[:, None]   # −m·(i − j)
        buckets = relative_bucket(distance, self.bidirectional, self.n_buckets, self.max_distance)
        return self.table(buckets).permute(0, 3, 1, 2)                            # [B, H, Tq, Tk]
