"""Norms, feed-forward variants and positional encodings (sinusoidal and rotary)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig

ACTIVATIONS = {
    "gelu": F.gelu,                                         # exact, erf-based (BERT)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),   # GPT-2's "gelu_new"
    "silu": F.silu,                                         # a.k.a. swish (Llama's SwiGLU, Marian)
    "relu": F.relu,
}


class Norm(nn.Module):
    """LayerNorm (x-μ)/σ·γ+β or RMSNorm x/rms(x)·γ, over the last dimension."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.kind, self.eps = cfg.norm, cfg.norm_eps
        self.weight = nn.Parameter(torch.empty(cfg.d_model))
        self.bias = nn.Parameter(torch.empty(cfg.d_model)) if cfg.norm_bias else None

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "rmsnorm":
            # x / √(mean(x²) + ε) in float32, then scaled in the model dtype, as Llama does
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * h.to(x.dtype)
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
        s = self.divisor(x)
        if self.kind == "rmsnorm":
            return lambda c: self.weight.float() * (c.float() / s)
        return lambda c: self.weight.float() * ((c.float() - c.float().mean(-1, keepdim=True)) / s)


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
    """Rotate each pair (x_i, x_{i+d/2}) of x [B, H, T, hd] by its angle (rotate-half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def apply_rope(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """RoPE: x [B, H, T, hd] at position ids [B, T], each pair rotated by position·θ_i."""
    cos, sin = rope_cos_sin(positions, inv_freq, x.dtype)
    return rotate(x, cos, sin)

