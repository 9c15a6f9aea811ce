"""Llama-style decoders (Llama, TinyLlama, SmolLM2, Mistral, Qwen2): RoPE, RMSNorm, SwiGLU, grouped-query attention."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .table import require, rows

MODEL_TYPES = ("llama", "mistral", "qwen2")
PREFIXES = ("model.",)
IGNORE = (r"rotary_emb\.inv_freq$", r"^lm_head\.weight$")
TRANSFORMS = {}

B, L = "stack.blocks.{}", "layers.{}"
WEIGHTS = {
    "stack.embed.tokens.weight": ["embed_tokens.weight"],
    **rows(f"{B}.attn_norm", f"{L}.input_layernorm", bias=False),
    **rows(f"{B}.attn.qkv", tuple(f"{L}.self_attn.{p}_proj" for p in "qkv")),
    **rows(f"{B}.attn.out", f"{L}.self_attn.o_proj"),
    **rows(f"{B}.ffn_norm", f"{L}.post_attention_layernorm", bias=False),
    **rows(f"{B}.ffn.up", (f"{L}.mlp.gate_proj", f"{L}.mlp.up_proj")),  # gate first: see FeedForward
    **rows(f"{B}.ffn.down", f"{L}.mlp.down_proj"),
    **rows("stack.final_norm", "norm", bias=False),
    **rows("lm_head", "lm_head", bias=False),
}


def rope_theta(raw: dict) -> float:
    """rope_theta sits at the top level (transformers 4) or in rope_parameters (transformers 5)."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ConfigError(f"{raw.get('model_type')}: rope type {rope_type!r} is not supported; only 'default' RoPE is")
    return float(params.get("rope_theta") or raw.get("rope_theta") or 10000.0)


def read_config(raw: dict) -> ModelConfig:
    model_type = raw["model_type"]
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"{model_type}: hidden_act {act!r} is not supported; expected 'silu'")
    d, heads = require(raw, "hidden_size"), require(raw, "num_attention_heads")
    qwen = model_type == "qwen2"  # Qwen2 has q/k/v biases and none on o_proj
    bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        family="llama", model_type=model_type, n_layers=require(raw, "num_hidden_layers"), n_heads=heads,
        n_kv_heads=raw.get("num_key_value_heads") or heads, d_model=d, head_dim=raw.get("head_dim") or d // heads,
        d_ff=require(raw, "intermediate_size"), vocab_size=require(raw, "vocab_size"),
        max_positions=raw.get("max_position_embeddings", 2048), positional="rope", norm="rmsnorm",
        norm_placement="pre", causal=True, is_encoder_decoder=False, activation="silu", gated_ffn=True,
        norm_eps=raw.get("rms_norm_eps", 1e-6), rope_theta=rope_theta(raw), qkv_bias=qwen or bias,
        out_bias=bias and not qwen, ffn_bias=bool(raw.get("mlp_bias", False)), norm_bias=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"), pad_token_id=raw.get("pad_token_id"),
    )
