"""Norms, feed-forward variants and positional encodings (sinusoidal and rotary)."""
from __future__ import annotations

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


def column_blocks(n_columns: int) -> int:
    """How many column blocks an input-major matrix is cut into: one per CPU thread, when they divide evenly."""
    threads = torch.get_num_threads()
    return threads if n_columns % threads == 0 else 1


def split_columns(w: Tensor, blocks: int) -> Tensor:
    """[in, out] → [blocks, in, out / blocks]: each block of columns contiguous on its own."""
    return w.reshape(w.shape[0], blocks, -1).permute(1, 0, 2).contiguous()


def times_blocks(x: Tensor, w: Tensor) -> Tensor:
    """x [..., in] · W, W stored as column blocks [blocks, in, out / blocks] → [..., out].

    A batched product over the blocks lets each CPU thread stream its own block: a one-token step then
    reads W at 22–30 GB/s on this project's 2-core CPU, against 15–20 for one [in, out] matrix and 11 for
    nn.Linear's [out, in]."""
    flat = x.reshape(1, -1, x.shape[-1]).expand(w.shape[0], -1, -1)   # [blocks, N, in]
    y = torch.bmm(flat, w)                                              # [blocks, N, out / blocks]
    return y.permute(1, 0, 2).reshape(*x.shape[:-1], -1)


class Linear(nn.Module):
    """y = x·Wᵀ + b, with W laid out for the one-token decode step, where reading W is the whole cost.

    When out ≥ in, W is stored input-major as column blocks (see times_blocks); otherwise as nn.Linear's
    [out, in], which streams faster for tall matrices such as the feed-forward's down projection (15.5 GB/s
    against 11.5 input-major). Checkpoints hold [out, in]; `pack` turns that into the stored layout.
    """

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        self.input_major = d_out >= d_in
        self.checkpoint_shape = (d_out, d_in)
        blocks = column_blocks(d_out)
        self.weight = nn.Parameter(torch.empty((blocks, d_in, d_out // blocks) if self.input_major else (d_out, d_in)))
        self.bias = nn.Parameter(torch.empty(d_out)) if bias else None

    def pack(self, w: Tensor) -> Tensor:
        """A checkpoint's [out, in] weight in this module's layout."""
        return split_columns(w.t(), self.weight.shape[0]) if self.input_major else w

    def forward(self, x: Tensor) -> Tensor:
        if not self.input_major:
            return F.linear(x, self.weight, self.bias)
        y = times_blocks(x, self.weight)
        return y if self.bias is None else y + self.bias


class TokenEmbedding(nn.Module):
    """The token table, stored input-major as column blocks [blocks, d, vocab / blocks] for the same reason as
    Linear: a tied LM head multiplies by it at every step. Looking a token up reads one column."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.checkpoint_shape = (vocab_size, d_model)
        blocks = column_blocks(vocab_size)
        self.weight = nn.Parameter(torch.empty(blocks, d_model, vocab_size // blocks))

    def pack(self, w: Tensor) -> Tensor:
        return split_columns(w.t(), self.weight.shape[0])

    def forward(self, ids: Tensor) -> Tensor:
        per_block = self.weight.shape[-1]
        return self.weight[ids // per_block, :, ids % per_block]  # [..., d]


class Norm(nn.Module):
    """LayerNorm (x-μ)/σ·γ+β or RMSNorm x/rms(x)·γ, over the last dimension."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.kind, self.eps = cfg.norm, cfg.norm_eps
        self.weight = nn.Parameter(torch.empty(cfg.d_model))
        self.bias = nn.Parameter(torch.empty(cfg.d_model)) if cfg.norm_bias else None

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "rmsnorm":
            # x / √(mean(x²) + ε) in float32, then scaled in the model dtype, as Llama does. Written out:
            # for one token, four small ops beat the fused kernel's start-up cost on a CPU.
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * h.to(x.dtype)
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class FeedForward(nn.Module):
    """Position-wise FFN: down(act(up(x))), or gated (SwiGLU): down(act(gate(x)) ⊙ up(x))."""

    def __init__(self, cfg: ModelConfig, d_ff: int | None = None):
        super().__init__()
        d_ff = d_ff or cfg.d_ff
        self.gated, self.act = cfg.gated_ffn, ACTIVATIONS[cfg.activation]
        # gate and up share one matrix [2·d_ff, d] so a gated FFN costs one matmul going in
        self.up = Linear(cfg.d_model, (2 if self.gated else 1) * d_ff, bias=cfg.ffn_bias)
        self.down = Linear(d_ff, cfg.d_model, bias=cfg.ffn_bias)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            return self.down(self.act(gate) * up)
        return self.down(self.act(h))


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


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [B, T] → cos, sin [B, 1, T, head_dim], angles m·θ_i repeated for both halves."""
    angles = positions[..., None].float() * inv_freq.to(positions.device)  # [B, T, hd/2], float32
    emb = torch.cat([angles, angles], dim=-1)[:, None]                      # [B, 1, T, hd]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Rotate each pair (x_i, x_{i+d/2}) of x [B, H, T, hd] by the angle position·θ_i (rotate-half convention)."""
    cos, sin = rope_cos_sin(positions, inv_freq, x.dtype)
    return x * cos + rotate_half(x) * sin

