"""The Transformer: embeddings, Pre-LN / Post-LN blocks, encoder and decoder stacks, LM head.

Every family (GPT-2, Llama, BERT, Marian) is this one model with a different ModelConfig;
core/families/ holds only config readers and weight-name tables.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from . import generate as generation
from .attention import attention, attention_rows, causal_mask as causal_matrix
from .config import ModelConfig
from .layers import (ACTIVATIONS, FeedForward, Linear, Norm, TokenEmbedding, column_blocks, rope_cos_sin,
                     rope_inv_freq, rotate_half, sinusoidal_encoding, split_columns, times_blocks)

# An observer sees attention probabilities as they are computed: observer(kind, layer, probs [B, H, Tq, Tk]).
# kind is "self" (the main stack), "encoder" or "cross". `observer.wants(kind, layer)` picks the layers
# that take the explicit path; the others keep the fused fast path. An observer with `rows_per_block`
# receives the rows in blocks instead, observer(kind, layer, probs [B, H, rows, width], first_row, Tk)
# (keys from width on have probability 0), and the layer's output is computed from those same blocks:
# this is how long texts are captured (core/capture.py).
Observer = Callable[[str, int, Tensor], None]


@dataclass
class ModelOutput:
    logits: Tensor | None                       # [B, T, vocab], None without an LM head
    hidden_states: Tensor                       # [B, T, d] after the last block (and final norm)
    attentions: tuple[Tensor, ...] | None = None          # per layer [B, H, Tq, Tk] float32
    encoder_attentions: tuple[Tensor, ...] | None = None
    cross_attentions: tuple[Tensor, ...] | None = None
    encoder_hidden_states: Tensor | None = None


@dataclass
class AttentionSetup:
    """What every layer of one stack shares in one forward pass."""
    allowed: Tensor | None          # bool [B, 1, Tq, Tk], True where attention may go
    is_causal: bool                 # add the standard causal mask (cheaper than building it)
    scale: float | None             # None: 1/√d_k; 1.0: scaling switched off
    rope: tuple[Tensor, Tensor] | None  # cos, sin [B, 1, T, d_k]
    kind: str = "self"
    observer: Observer | None = None
    cache: "KVCache | None" = None
    memory: Tensor | None = None            # encoder output for cross-attention [B, S, d]
    memory_allowed: Tensor | None = None    # bool [B, 1, 1, S]: the encoder's real tokens

    def wants_probs(self, kind: str, layer: int) -> bool:
        if self.observer is None:
            return False
        wants = getattr(self.observer, "wants", None)
        return wants is None or wants(kind, layer)


class KVCache:
    """Preallocated keys and values for every layer, indexed by position: [layers, B, H_kv, max_len, d_k].

    `length` counts the filled positions; `key_mask` [B, max_len] marks real tokens (False on padding).
    For seq2seq, `cross` holds each decoder layer's keys and values of the encoder output, computed once.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.key_mask = torch.ones(batch, max_len, dtype=torch.bool, device=device)
        self.length, self.max_len = 0, max_len
        self.cross: list[tuple[Tensor, Tensor] | None] = [None] * n_layers

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new k, v [B, H_kv, T, d_k] after the filled positions; return all filled so far."""
        end = self.length + k.shape[2]
        self.keys[layer, :, :, self.length:end] = k
        self.values[layer, :, :, self.length:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]


class Attention(nn.Module):
    """Multi-head attention, eq. 3.1: W^O · concat_i(Attention(X W_i^Q, X W_i^K, X W_i^V)).

    Self-attention keeps W^Q, W^K, W^V in one matrix ([H + 2·H_kv]·d_k rows) so projecting is one matmul;
    cross-attention projects queries from the decoder and keys/values from the encoder output.
    """

    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        if cross:
            self.q = Linear(cfg.d_model, q_dim, bias=cfg.qkv_bias)
            self.kv = Linear(cfg.d_model, 2 * kv_dim, bias=cfg.qkv_bias)
        else:
            self.qkv = Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=cfg.qkv_bias)
        self.out = Linear(q_dim, cfg.d_model, bias=cfg.out_bias)

    def heads(self, x: Tensor, n: int) -> Tensor:
        """[B, T, n·d_k] → [B, n, T, d_k]"""
        return x.view(x.shape[0], x.shape[1], n, self.head_dim).transpose(1, 2)

    def self_qkv(self, x: Tensor, setup: AttentionSetup) -> tuple[Tensor, Tensor, Tensor]:
        qk, v = self.heads(self.qkv(x), self.n_heads + 2 * self.n_kv_heads).split(
            [self.n_heads + self.n_kv_heads, self.n_kv_heads], dim=1)
        if setup.rope is not None:  # rotary positions act on queries and keys only (both in one go)
            cos, sin = setup.rope
            qk = qk * cos + rotate_half(qk) * sin
        q, k = qk.split([self.n_heads, self.n_kv_heads], dim=1)
        return q, k, v

    def forward(self, x: Tensor, setup: AttentionSetup, layer: int, cross: bool = False) -> tuple[Tensor, Tensor | None]:
        kind = "cross" if cross else setup.kind
        cache = setup.cache
        if cross:
            q = self.heads(self.q(x), self.n_heads)
            if cache is not None and cache.cross[layer] is not None:
                k, v = cache.cross[layer]
            else:
                k, v = self.heads(self.kv(setup.memory), 2 * self.n_kv_heads).chunk(2, dim=1)
                if cache is not None:
                    cache.cross[layer] = (k, v)
            allowed, is_causal = setup.memory_allowed, False
        else:
            q, k, v = self.self_qkv(x, setup)
            if cache is not None:
                k, v = cache.update(layer, k, v)
            allowed, is_causal = setup.allowed, setup.is_causal
        want = setup.wants_probs(kind, layer)
        rows = getattr(setup.observer, "rows_per_block", None) if want else None
        if rows:  # an observer that takes the probabilities a block of query rows at a time
            probs, out = None, q.new_empty(q.shape[0], self.n_heads, q.shape[2], self.head_dim)
            scale = self.head_dim ** -0.5 if setup.scale is None else setup.scale
            for start, block, out_block in attention_rows(q, k, v, allowed, is_causal, scale, rows):
                out[:, :, start:start + block.shape[2]] = out_block
                setup.observer(kind, layer, block, start, k.shape[-2])
        else:
            out, probs = attention(q, k, v, allowed, is_causal, setup.scale, return_probs=want)
            if want:
                setup.observer(kind, layer, probs)
        out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], self.n_heads * self.head_dim)
        return self.out(out), probs


class Block(nn.Module):
    """One Transformer layer. Pre-LN: x + f(norm(x)). Post-LN (eqs. 5.1–5.4): norm(x + f(x)).

    Sublayers in order: self-attention, cross-attention (decoder of seq2seq only), feed-forward.
    """

    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__()
        self.pre_norm = cfg.norm_placement == "pre"
        self.attn_norm, self.attn = Norm(cfg), Attention(cfg)
        self.cross_norm, self.cross = (Norm(cfg), Attention(cfg, cross=True)) if cross else (None, None)
        self.ffn_norm, self.ffn = Norm(cfg), FeedForward(cfg)

    def residual(self, x: Tensor, sublayer, norm: Norm, *args) -> Tensor:
        if self.pre_norm:
            return x + sublayer(norm(x), *args)
        return norm(x + sublayer(x, *args))

    def forward(self, x: Tensor, setup: AttentionSetup, layer: int) -> Tensor:
        x = self.residual(x, lambda h: self.attn(h, setup, layer)[0], self.attn_norm)
        if self.cross is not None:
            x = self.residual(x, lambda h: self.cross(h, setup, layer, cross=True)[0], self.cross_norm)
        return self.residual(x, self.ffn, self.ffn_norm)


class Embeddings(nn.Module):
    """Token embeddings (× embed_scale), plus token types and absolute positions where the family has them."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tokens = TokenEmbedding(cfg.vocab_size, cfg.d_model)
        self.positions = nn.Embedding(cfg.max_positions, cfg.d_model) if cfg.positional == "learned" else None
        self.token_types = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        self.norm = Norm(cfg) if cfg.embed_norm else None

    def forward(self, input_ids: Tensor, positions: Tensor, token_type_ids: Tensor | None, use_positions: bool) -> Tensor:
        x = self.tokens(input_ids)
        if self.cfg.embed_scale != 1.0:
            x = x * self.cfg.embed_scale
        if self.token_types is not None:
            x = x + self.token_types(token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids))
        if use_positions and self.positions is not None:
            x = x + self.positions(positions)
        if use_positions and self.cfg.positional == "sinusoidal":
            x = x + sinusoidal_encoding(positions, self.cfg.d_model, interleaved=False).to(x.dtype)
        return self.norm(x) if self.norm is not None else x


class Stack(nn.Module):
    """Embeddings, then n_layers blocks, then an optional final norm (Pre-LN stacks)."""

    def __init__(self, cfg: ModelConfig, cross: bool = False):
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg)
        self.blocks = nn.ModuleList(Block(cfg, cross) for _ in range(cfg.n_layers))
        self.final_norm = Norm(cfg) if cfg.final_norm else None

    def forward(self, x: Tensor, setup: AttentionSetup, n_layers: int | None = None) -> Tensor:
        for i, block in enumerate(self.blocks[:n_layers]):
            x = block(x, setup, i)
        if self.final_norm is not None and n_layers is None:
            x = self.final_norm(x)
        return x


class LMHead(nn.Module):
    """Hidden states → vocabulary logits; tied heads reuse the token embedding matrix."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = Linear(cfg.d_model, cfg.d_model) if cfg.lm_head_transform else None
        self.norm = Norm(cfg) if cfg.lm_head_transform else None
        self.act = cfg.activation
        self.checkpoint_shape = (cfg.vocab_size, cfg.d_model)
        blocks = column_blocks(cfg.vocab_size)
        self.weight = None if cfg.tie_word_embeddings else nn.Parameter(
            torch.empty(blocks, cfg.d_model, cfg.vocab_size // blocks))  # laid out like TokenEmbedding
        self.bias = nn.Parameter(torch.empty(cfg.vocab_size)) if cfg.lm_head_bias else None

    def pack(self, w: Tensor) -> Tensor:
        return split_columns(w.t(), self.weight.shape[0])

    def forward(self, h: Tensor, embedding: Tensor) -> Tensor:
        """h [B, T, d], embedding: the token table (used when tied) → logits [B, T, vocab]."""
        if self.dense is not None:  # BERT's MLM transform
            h = self.norm(ACTIVATIONS[self.act](self.dense(h)))
        logits = times_blocks(h, embedding if self.weight is None else self.weight)
        return logits if self.bias is None else logits + self.bias


def encoder_config(cfg: ModelConfig) -> ModelConfig:
    """The seq2seq encoder's own shape: bidirectional, its own depth, width and head count."""
    heads = cfg.encoder_n_heads or cfg.n_heads
    return dataclasses.replace(cfg, n_layers=cfg.n_encoder_layers, n_heads=heads, n_kv_heads=heads,
                               d_ff=cfg.encoder_d_ff or cfg.d_ff, head_dim=cfg.d_model // heads, causal=False)


def positions_from_mask(key_mask: Tensor | None, start: int, n: int, batch: int, device) -> Tensor:
    """Position ids [B, n] of the n newest tokens: count of real tokens before each (so left padding is
    skipped), or simply start..start+n-1 with no padding."""
    if key_mask is None:
        return torch.arange(start, start + n, device=device).expand(batch, n)
    return (key_mask[:, :start + n].long().cumsum(-1) - 1).clamp(min=0)[:, start:]


def self_attention_mask(key_mask: Tensor | None, start: int, n: int, causal: bool,
                        device: torch.device | None = None) -> tuple[Tensor | None, bool]:
    """The mask for n new queries over start + n keys: (allowed [B, 1, n, start+n] or None, is_causal).

    key_mask: [B, ≥ start+n] bool, False on padding, or None when nothing is padded.
    A padding query left with no key at all (left padding under a causal mask) attends to itself,
    so no row is empty; its output is never used.
    """
    n_keys = start + n
    if key_mask is None or bool(key_mask[:, :n_keys].all()):
        if not causal or n == 1:
            return None, False
        if start == 0:
            return None, True
        return causal_matrix(n, n_keys, device)[None, None], False
    allowed = key_mask[:, None, None, :n_keys]                         # [B, 1, 1, Tk]
    if causal:
        allowed = allowed & causal_matrix(n, n_keys, key_mask.device)  # [B, 1, n, Tk]
    else:
        allowed = allowed.expand(-1, -1, n, -1)
    empty = ~allowed.any(-1, keepdim=True)
    if bool(empty.any()):
        own = torch.arange(n_keys, device=key_mask.device) == torch.arange(start, n_keys, device=key_mask.device)[:, None]
        allowed = allowed | (empty & own)
    return allowed, False


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
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta) if cfg.positional == "rope" else None
        self.tokenizer = None  # set by load_model

    @property
    def device(self) -> torch.device:
        return self.stack.embed.tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.stack.embed.tokens.weight.dtype

    def setup(self, stack: Stack, input_ids: Tensor, key_mask: Tensor | None, start: int, *, causal: bool,
              padding_mask: bool, scale: bool, positions: bool) -> tuple[AttentionSetup, Tensor]:
        """Masks, position ids and rotary angles for n new tokens after `start` cached ones.
        Positions always skip padding; the padding_mask switch only changes what attention may see."""
        batch, n = input_ids.shape
        allowed, is_causal = self_attention_mask(key_mask if padding_mask else None, start, n, causal,
                                                 input_ids.device)
        position_ids = positions_from_mask(key_mask, start, n, batch, input_ids.device)
        rope = None
        if positions and stack.cfg.positional == "rope":
            rope = rope_cos_sin(position_ids, self.inv_freq, self.dtype)
        setup = AttentionSetup(allowed=allowed, is_causal=is_causal, scale=None if scale else 1.0, rope=rope)
        return setup, position_ids

    def run_stack(self, stack: Stack, input_ids: Tensor, attention_mask: Tensor | None, *, kind: str,
                  causal: bool, padding_mask: bool, scale: bool, positions: bool, token_type_ids: Tensor | None = None,
                  observer: Observer | None = None, cache: KVCache | None = None, memory: Tensor | None = None,
                  memory_mask: Tensor | None = None, n_layers: int | None = None) -> Tensor:
        """Embed input_ids [B, T] and run them through `stack`; returns hidden states [B, T, d].

        attention_mask: [B, T] for the new tokens, or [B, cached + T] (1 = real token, 0 = padding).
        """
        n = input_ids.shape[1]
        start = cache.length if cache is not None else 0
        key_mask = None
        if cache is not None:
            if attention_mask is not None:
                cache.key_mask[:, start:start + n] = attention_mask[:, -n:].bool()
            key_mask = cache.key_mask
        elif attention_mask is not None:
            key_mask = attention_mask.bool()
        setup, position_ids = self.setup(stack, input_ids, key_mask, start, causal=causal,
                                         padding_mask=padding_mask, scale=scale, positions=positions)
        setup.kind, setup.observer, setup.cache, setup.memory = kind, observer, cache, memory
        if memory is not None and memory_mask is not None and padding_mask:
            setup.memory_allowed = memory_mask.bool()[:, None, None, :]
        x = stack.embed(input_ids, position_ids, token_type_ids, positions)
        x = stack(x, setup, n_layers)
        if cache is not None:
            cache.length = start + n
        return x

    # ---- views into the model for the app: real weights, real projections ----

    def queries_keys(self, input_ids: Tensor, layer: int, rotate: bool = True,
                     attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The queries [B, H, T, d_k] and keys [B, H_kv, T, d_k] that self-attention of `layer` in the main
        stack computes for input_ids; rotate=False gives them before RoPE."""
        if not 0 <= layer < self.config.n_layers:
            raise IndexError(f"layer {layer} is out of range: the model has layers 0..{self.config.n_layers - 1}")
        if self.encoder is not None:
            raise ValueError("queries_keys reads the self-attention of decoder-only and encoder-only models")
        with torch.inference_mode():
            mask = attention_mask.bool() if attention_mask is not None else None
            x = self.run_stack(self.stack, input_ids, attention_mask, kind="self", causal=self.config.causal,
                               padding_mask=True, scale=True, positions=True, n_layers=layer)
            setup, _ = self.setup(self.stack, input_ids, mask, 0, causal=self.config.causal, padding_mask=True,
                                  scale=True, positions=rotate)
            block = self.stack.blocks[layer]
            q, k, _ = block.attn.self_qkv(block.attn_norm(x) if block.pre_norm else x, setup)
        return q, k

    def learned_positions(self) -> Tensor | None:
        """The learned absolute position embeddings [max_positions, d] (GPT-2, BERT), else None."""
        table = self.stack.embed.positions
        return None if table is None else table.weight.detach()

    def rope_inv_freq(self) -> Tensor | None:
        """RoPE's frequencies θ_i [head_dim/2], else None."""
        return self.inv_freq

    def parameter_counts(self) -> dict:
        """Parameters per part. Attention has 4d² weights per layer (W^Q, W^K, W^V, W^O; fewer with GQA),
        the feed-forward 2·d·d_ff (8d² at d_ff = 4d; 3·d·d_ff when gated)."""
        def count(modules) -> int:
            return sum(p.numel() for m in modules if m is not None for p in m.parameters())
        stacks = [s for s in (self.encoder, self.stack) if s is not None]
        blocks = [b for s in stacks for b in s.blocks]
        norms = [m for b in blocks for m in (b.attn_norm, b.cross_norm, b.ffn_norm)] + [s.final_norm for s in stacks]
        head_own = 0 if self.lm_head is None else count([self.lm_head])
        first = self.stack.blocks[0]
        counts = {
            "embeddings": count([self.stack.embed] + ([self.encoder.embed] if self.encoder else [])),
            "attention": count([m for b in blocks for m in (b.attn, b.cross)]),
            "feed_forward": count([b.ffn for b in blocks]),
            "norms": count(norms),
            "lm_head": head_own,
            "per_layer": {"attention": count([first.attn, first.cross]), "feed_forward": count([first.ffn])},
        }
        if self.encoder is not None:  # the shared token table is counted once
            counts["embeddings"] -= self.encoder.embed.tokens.weight.numel()
        counts["total"] = sum(p.numel() for p in self.parameters())
        return counts

    # ---- generation (core/generate.py) ----

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        cfg = self.config
        return KVCache(cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim, self.dtype, self.device)

    def generate(self, input_ids: Tensor, max_new_tokens: int, **options) -> Tensor:
        """Prompt + new tokens. options: temperature=0.0, top_k, top_p, repetition_penalty=1.0, seed, stop,
        attention_mask, compile (see core.generate.generate)."""
        return generation.generate(self, input_ids, max_new_tokens, **options)

    def stream(self, input_ids: Tensor, max_new_tokens: int, **options):
        """Token ids as they are made; the same options, plus capture_attention (see core.generate.stream)."""
        return generation.stream(self, input_ids, max_new_tokens, **options)

    def logits(self, hidden: Tensor) -> Tensor | None:
        return None if self.lm_head is None else self.lm_head(hidden, self.stack.embed.tokens.weight)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, decoder_input_ids: Tensor | None = None,
                capture_attention: bool = False, causal_mask: bool = True, padding_mask: bool = True,
                scale: bool = True, positions: bool = True, token_type_ids: Tensor | None = None,
                decoder_attention_mask: Tensor | None = None, observer: Observer | None = None) -> ModelOutput:
        """One full forward pass. The four switches (causal_mask, padding_mask, scale, positions) exist
        for the demos: each removes exactly what its name says. capture_attention returns every layer's
        probabilities as float32 [B, H, Tq, Tk]; `observer` receives them instead, layer by layer."""
        recorder = AttentionRecorder() if capture_attention and observer is None else None
        observer = observer or recorder
        switches = dict(padding_mask=padding_mask, scale=scale, positions=positions, observer=observer)
        memory = None
        with torch.inference_mode():
            if self.encoder is not None:
                memory = self.run_stack(self.encoder, input_ids, attention_mask, kind="encoder", causal=False,
                                        **switches)
                if decoder_input_ids is None:
                    start = self.config.decoder_start_token_id
                    decoder_input_ids = torch.full((input_ids.shape[0], 1), start, device=input_ids.device)
                hidden = self.run_stack(self.stack, decoder_input_ids, decoder_attention_mask, kind="self",
                                        causal=causal_mask and self.config.causal, memory=memory,
                                        memory_mask=attention_mask, **switches)
            else:
                hidden = self.run_stack(self.stack, input_ids, attention_mask, kind="self",
                                        causal=causal_mask and self.config.causal, token_type_ids=token_type_ids,
                                        **switches)
            out = ModelOutput(logits=self.logits(hidden), hidden_states=hidden, encoder_hidden_states=memory)
        if recorder is not None:
            out.attentions = recorder.layers("self")
            out.encoder_attentions = recorder.layers("encoder") if self.encoder is not None else None
            out.cross_attentions = recorder.layers("cross") if self.encoder is not None else None
        return out


class AttentionRecorder:
    """Keeps every layer's probabilities, float32, as the model computes them."""

    def __init__(self):
        self.maps: dict[str, dict[int, Tensor]] = {}

    def __call__(self, kind: str, layer: int, probs: Tensor) -> None:
        self.maps.setdefault(kind, {})[layer] = probs

    def layers(self, kind: str) -> tuple[Tensor, ...] | None:
        found = self.maps.get(kind)
        return None if found is None else tuple(found[i] for i in sorted(found))
