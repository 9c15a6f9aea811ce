"""Views into a loaded model for the app's pages: parameter counts, queries and keys, position tables.

Each is a small function of the model's real weights and one recorded forward pass; none changes the model.
"""
from __future__ import annotations

import torch
from torch import Tensor


def parameter_counts(model) -> dict:
    """Parameters per part. Attention has 4d² weights per layer (W^Q, W^K, W^V, W^O; fewer with GQA; plus the
    q and k norms where the family has them), the feed-forward 2·d·d_ff (8d² at d_ff = 4d; 3·d·d_ff when gated).
    position_bias: T5's learned relative-position table, one per stack (ALiBi's slopes are fixed, not learned)."""
    def count(modules) -> int:
        return sum(p.numel() for m in modules if m is not None for p in m.parameters())
    stacks = [s for s in (model.encoder, model.stack) if s is not None]
    blocks = [b for s in stacks for b in s.blocks]
    norms = [m for b in blocks for m in (b.attn_norm, b.cross_norm, b.ffn_norm, b.attn_post_norm, b.ffn_post_norm)]
    norms += [s.final_norm for s in stacks]
    first = model.stack.blocks[0]
    counts = {
        "embeddings": count([model.stack.embed] + ([model.encoder.embed] if model.encoder else [])),
        "attention": count([m for b in blocks for m in (b.attn, b.cross)]),
        "feed_forward": count([b.ffn for b in blocks]),
        "norms": count(norms),
        "lm_head": 0 if model.lm_head is None else count([model.lm_head]),
        "position_bias": count([s.score_bias for s in stacks]),
        "per_layer": {"attention": count([first.attn, first.cross]), "feed_forward": count([first.ffn])},
    }
    if model.encoder is not None:  # the shared token table is counted once
        counts["embeddings"] -= model.encoder.embed.tokens.weight.numel()
    counts["total"] = sum(p.numel() for p in model.parameters())
    return counts


def held_bytes(model) -> int:
    """The bytes of every parameter and buffer the model holds, each tensor once (a tied output matrix shares the
    embedding's): numel × element_size, so float32 weights count 4 bytes each. On the meta device it is what the
    same model would hold once filled."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def queries_keys(model, input_ids: Tensor, layer: int, rotate: bool = True,
                 attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The queries [B, H, T, d_k] and keys [B, H_kv, T, d_k] that self-attention of `layer` in the main stack
    computes for input_ids; rotate=False gives them before RoPE (x·W_Q + b_Q, as recorded)."""
    if model.encoder is not None:
        raise ValueError("queries_keys reads the self-attention of decoder-only and encoder-only models")
    model.head_weights(layer)  # checks the layer
    names = ("q", "k") if rotate else ("q_unrotated", "k_unrotated")
    with torch.inference_mode():
        records = model(input_ids, attention_mask=attention_mask, record=names, return_logits=False).records
    return records[names[0]][layer].transpose(1, 2), records[names[1]][layer].transpose(1, 2)


def learned_positions(model) -> Tensor | None:
    """The learned absolute position embeddings [max_positions, d] (GPT-2, BERT), else None."""
    table = model.stack.embed.positions
    return None if table is None else table.weight.detach()


def rope_frequencies(model) -> Tensor | None:
    """RoPE's frequencies θ_i [head_dim/2], else None."""
    return model.inv_freq
