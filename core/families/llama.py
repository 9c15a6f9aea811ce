"""Llama-style decoders (Llama, TinyLlama, SmolLM2, Mistral, Qwen2, Qwen3): RoPE, RMSNorm, SwiGLU, grouped-query
attention. Mistral adds a sliding window on every layer; Qwen3 an RMSNorm on each head's q and k (QK-norm)."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .table import require, rope_parameters, rows

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
PREFIXES = ("model.",)
IGNORE = (r"rotary_emb\.inv_freq$", r"^lm_head\.weight$")
TRANSFORMS = {}

B, L = "stack.blocks.{}", "layers.{}"
WEIGHTS = {
    "stack.embed.tokens.weight": ["embed_tokens.weight"],
    **rows(f"{B}.attn_norm", f"{L}.input_layernorm", bias=False),
    **rows(f"{B}.attn.qkv", tuple(f"{L}.self_attn.{p}_proj" for p in "qkv")),
    **rows(f"{B}.attn.out", f"{L}.self_attn.o_proj"),
    **rows(f"{B}.attn.q_norm", f"{L}.self_attn.q_norm", bias=False),
    **rows(f"{B}.attn.k_norm", f"{L}.self_attn.k_norm", bias=False),
    **rows(f"{B}.ffn_norm", f"{L}.post_attention_layernorm", bias=False),
    **rows(f"{B}.ffn.up", (f"{L}.mlp.gate_proj", f"{L}.mlp.up_proj")),  # gate first: see FeedForward
    **rows(f"{B}.ffn.down", f"{L}.mlp.down_proj"),
    **rows("stack.final_norm", "norm", bias=False),
    **rows("lm_head", "lm_head", bias=False),
}

LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}


def layer_types(raw: dict, n_layers: int) -> tuple[tuple[str, ...], int | None]:
    """Which layers attend within a window, and its width. Mistral: every layer when sliding_window is set.
    Qwen2/Qwen3: only with use_sliding_window, the layers config.json's layer_types names, or else those from
    max_window_layers on; without use_sliding_window their sliding_window field is ignored, as transformers does."""
    window = raw.get("sliding_window")
    if raw["model_type"] in ("qwen2", "qwen3"):
        if not raw.get("use_sliding_window") or window is None:
            return (), None
        named = raw.get("layer_types")
        if named:
            unknown = sorted(set(named) - set(LAYER_TYPES))
            if unknown or len(named) != n_layers:
                raise ConfigError(f"{raw['model_type']}: layer_types must name {n_layers} layers, each one of "
                                  f"{sorted(LAYER_TYPES)}; got {named!r}")
            return tuple(LAYER_TYPES[t] for t in named), int(window)
        first = raw.get("max_window_layers", n_layers)
        return tuple("sliding" if i >= first else "full" for i in range(n_layers)), int(window)
    if window is None or raw["model_type"] == "llama":
        return (), None
    return ("sliding",) * n_layers, int(window)


def read_config(raw: dict) -> ModelConfig:
    model_type = raw["model_type"]
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"{model_type}: hidden_act {act!r} is not supported; expected 'silu'")
    d, heads, n_layers = require(raw, "hidden_size"), require(raw, "num_attention_heads"), require(raw, "num_hidden_layers")
    theta, partial = rope_parameters(raw)
    if partial != 1.0:
        raise ConfigError(f"{model_type}: partial_rotary_factor {partial} is not supported here; expected 1.0")
    qwen2 = model_type == "qwen2"  # Qwen2 has q/k/v biases and none on o_proj
    bias = bool(raw.get("attention_bias", False))
    types, window = layer_types(raw, n_layers)
    return ModelConfig(
        family="llama", model_type=model_type, n_layers=n_layers, n_heads=heads,
        n_kv_heads=raw.get("num_key_value_heads") or heads, d_model=d, head_dim=raw.get("head_dim") or d // heads,
        d_ff=require(raw, "intermediate_size"), vocab_size=require(raw, "vocab_size"),
        max_positions=raw.get("max_position_embeddings", 2048), positional="rope", norm="rmsnorm",
        norm_placement="pre", causal=True, is_encoder_decoder=False, activation="silu", gated_ffn=True,
        norm_eps=raw.get("rms_norm_eps", 1e-6), rope_theta=theta, qkv_bias=qwen2 or bias,
        out_bias=bias and not qwen2, ffn_bias=bool(raw.get("mlp_bias", False)), norm_bias=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), qk_norm=model_type == "qwen3",
        sliding_window=window, layer_types=types,
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"), pad_token_id=raw.get("pad_token_id"),
    )
