"""GPT-NeoX (Pythia): parallel attention and MLP (both read the block's input), rotary positions on the first
rotary_pct of each head's dims, LayerNorm, exact GELU, q/k/v fused per head, an untied head."""
from __future__ import annotations

from ..config import ModelConfig
from .table import CHECKED, DROPOUT, IMPLEMENTED, INIT, SCALED_ROPE, activation, refused, per_head_qkv, qkv_per_head, \
    require, rope_parameters, rotary_dim, rows

MODEL_TYPES = ("gpt_neox",)
PREFIXES = ("gpt_neox.",)
IGNORE = (r"\.attention\.(masked_)?bias$", r"\.attention\.rotary_emb\.inv_freq$", r"rotary_emb\.inv_freq$")
TRANSFORMS = {r"\.attn\.qkv\.(weight|bias)$": per_head_qkv}   # stored [H, 3, d_k] rows
TO_CHECKPOINT = {r"\.attn\.qkv\.(weight|bias)$": qkv_per_head}

B, L = "stack.blocks.{}", "layers.{}"
WEIGHTS = {
    "stack.embed.tokens.weight": ["embed_in.weight"],
    **rows(f"{B}.attn_norm", f"{L}.input_layernorm"),
    **rows(f"{B}.attn.qkv", f"{L}.attention.query_key_value"),
    **rows(f"{B}.attn.out", f"{L}.attention.dense"),
    **rows(f"{B}.ffn_norm", f"{L}.post_attention_layernorm"),
    **rows(f"{B}.ffn.up", f"{L}.mlp.dense_h_to_4h"),
    **rows(f"{B}.ffn.down", f"{L}.mlp.dense_4h_to_h"),
    **rows("stack.final_norm", "final_layer_norm"),
    "lm_head.weight": ["embed_out.weight", "lm_head.weight"],
}

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu"}


def unlike(key: str, default: float):
    """Without rope_parameters, transformers' GPT-NeoX reads rotary_pct and rotary_emb_base, never the generic
    partial_rotary_factor and rope_theta: a generic one that disagrees with its GPT-NeoX name is refused."""
    return refused(lambda value, raw: not raw.get("rope_parameters") and value != raw.get(key, default),
                   f"transformers' GPT-NeoX reads {key} ({default} by default) instead; expected the two to agree")


FIELDS = {
    "hidden_size": IMPLEMENTED, "num_attention_heads": IMPLEMENTED, "num_hidden_layers": IMPLEMENTED,
    "intermediate_size": IMPLEMENTED, "max_position_embeddings": IMPLEMENTED, "layer_norm_eps": IMPLEMENTED,
    "attention_bias": IMPLEMENTED, "use_parallel_residual": IMPLEMENTED, "tie_word_embeddings": IMPLEMENTED,
    "rotary_pct": IMPLEMENTED, "rotary_emb_base": IMPLEMENTED, "hidden_act": CHECKED,
    "partial_rotary_factor": unlike("rotary_pct", 0.25), "rope_theta": unlike("rotary_emb_base", 10000.0),
    "rope_parameters": SCALED_ROPE, "rope_scaling": SCALED_ROPE,
    "attention_dropout": DROPOUT, "hidden_dropout": DROPOUT, "attention_probs_dropout_prob": DROPOUT,
    "hidden_dropout_prob": DROPOUT, "initializer_range": INIT,
}


def read_config(raw: dict) -> ModelConfig:
    d, heads = require(raw, "hidden_size"), require(raw, "num_attention_heads")
    theta, partial = rope_parameters(raw)
    if raw.get("rope_parameters") is None and raw.get("rotary_pct") is None:
        partial = 0.25   # transformers' default for GPT-NeoX when config.json does not say
    bias = bool(raw.get("attention_bias", True))
    return ModelConfig(
        family="gpt_neox", model_type="gpt_neox", n_layers=require(raw, "num_hidden_layers"), n_heads=heads,
        n_kv_heads=heads, d_model=d, head_dim=d // heads, d_ff=require(raw, "intermediate_size"),
        vocab_size=require(raw, "vocab_size"), max_positions=raw.get("max_position_embeddings", 2048),
        positional="rope", norm="layernorm", norm_placement="pre", causal=True, is_encoder_decoder=False,
        activation=activation(raw, "hidden_act", ACTIVATIONS, "gelu"), norm_eps=raw.get("layer_norm_eps", 1e-5),
        rope_theta=theta, rotary_dim=rotary_dim(d // heads, partial), qkv_bias=bias, out_bias=bias,
        parallel_block=bool(raw.get("use_parallel_residual", True)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"), pad_token_id=raw.get("pad_token_id"),
    )
