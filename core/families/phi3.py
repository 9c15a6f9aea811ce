"""Phi-3: the Llama layout with q/k/v fused into one projection and gate/up into another, RoPE on all or part of
each head, and a sliding window on every layer when config.json sets one."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .table import CHECKED, DROPOUT, IMPLEMENTED, INIT, SCALED_ROPE, UNREAD, ignored, refused, require, \
    rope_parameters, rotary_dim, rows

MODEL_TYPES = ("phi3",)
PREFIXES = ("model.",)
IGNORE = (r"rotary_emb\.inv_freq$", r"^lm_head\.weight$")
TRANSFORMS = {}

B, L = "stack.blocks.{}", "layers.{}"
WEIGHTS = {
    "stack.embed.tokens.weight": ["embed_tokens.weight"],
    **rows(f"{B}.attn_norm", f"{L}.input_layernorm", bias=False),
    **rows(f"{B}.attn.qkv", f"{L}.self_attn.qkv_proj"),         # [q | k | v] rows, as ours
    **rows(f"{B}.attn.out", f"{L}.self_attn.o_proj"),
    **rows(f"{B}.ffn_norm", f"{L}.post_attention_layernorm", bias=False),
    **rows(f"{B}.ffn.up", f"{L}.mlp.gate_up_proj"),             # [gate | up] rows, as ours
    **rows(f"{B}.ffn.down", f"{L}.mlp.down_proj"),
    **rows("stack.final_norm", "norm", bias=False),
    **rows("lm_head", "lm_head", bias=False),
}

def other_width(value, raw: dict) -> bool:
    return value not in (None, raw.get("hidden_size", 0) // max(raw.get("num_attention_heads", 1), 1))


FIELDS = {
    "hidden_size": IMPLEMENTED, "num_attention_heads": IMPLEMENTED, "num_hidden_layers": IMPLEMENTED,
    "num_key_value_heads": IMPLEMENTED, "intermediate_size": IMPLEMENTED, "max_position_embeddings": IMPLEMENTED,
    "rms_norm_eps": IMPLEMENTED, "sliding_window": IMPLEMENTED, "tie_word_embeddings": IMPLEMENTED,
    "rope_theta": IMPLEMENTED, "partial_rotary_factor": IMPLEMENTED, "hidden_act": CHECKED,
    "rope_parameters": SCALED_ROPE, "rope_scaling": SCALED_ROPE,   # Phi-3's 128k models' longrope among them
    "head_dim": refused(other_width, "a head width other than hidden_size / num_attention_heads is not "
                                     "implemented for Phi-3"),
    "original_max_position_embeddings": ignored("read only by the longrope RoPE, which is refused"),
    "attention_bias": ignored(UNREAD + " (Phi-3 has no attention biases)"),
    "resid_pdrop": DROPOUT, "embd_pdrop": DROPOUT, "attention_dropout": DROPOUT, "initializer_range": INIT,
}


def read_config(raw: dict) -> ModelConfig:
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"phi3: hidden_act {act!r} is not supported; expected 'silu'")
    d, heads, n_layers = require(raw, "hidden_size"), require(raw, "num_attention_heads"), require(raw, "num_hidden_layers")
    theta, partial = rope_parameters(raw)
    head_dim = d // heads
    window = raw.get("sliding_window")
    return ModelConfig(
        family="phi3", model_type="phi3", n_layers=n_layers, n_heads=heads,
        n_kv_heads=raw.get("num_key_value_heads") or heads, d_model=d, head_dim=head_dim,
        d_ff=require(raw, "intermediate_size"), vocab_size=require(raw, "vocab_size"),
        max_positions=raw.get("max_position_embeddings", 4096), positional="rope", norm="rmsnorm",
        norm_placement="pre", causal=True, is_encoder_decoder=False, activation="silu", gated_ffn=True,
        norm_eps=raw.get("rms_norm_eps", 1e-5), rope_theta=theta, rotary_dim=rotary_dim(head_dim, partial),
        qkv_bias=False, out_bias=False, ffn_bias=False, norm_bias=False,
        sliding_window=None if window is None else int(window), layer_types=() if window is None else ("sliding",) * n_layers,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"), pad_token_id=raw.get("pad_token_id"),
    )
