"""Llama-style decoders (Llama, TinyLlama, SmolLM2, Mistral, Qwen2, Qwen3): RoPE, RMSNorm, SwiGLU, grouped-query
attention. Mistral adds a sliding window on every layer; Qwen3 an RMSNorm on each head's q and k (QK-norm)."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .table import CHECKED, DROPOUT, IMPLEMENTED, INIT, SCALED_ROPE, UNREAD, WHOLE_ROPE, ignored, model_type_in, \
    not_in, partial_rope, refused, require, rope_parameters, rows, scaled_rope

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


def no_window(value, raw: dict) -> bool:
    """Whether read_config reads no window: Llama has none; Qwen2/Qwen3 read one only with use_sliding_window."""
    return raw.get("model_type") == "llama" or (raw.get("model_type") in ("qwen2", "qwen3")
                                                 and not raw.get("use_sliding_window"))


def unwindowed_qwen_or_other(value, raw: dict) -> bool:
    return raw.get("model_type") == "mistral" or no_window(value, raw)


FIELDS = {
    "hidden_size": IMPLEMENTED, "num_attention_heads": IMPLEMENTED, "num_hidden_layers": IMPLEMENTED,
    "num_key_value_heads": IMPLEMENTED, "head_dim": IMPLEMENTED, "intermediate_size": IMPLEMENTED,
    "max_position_embeddings": IMPLEMENTED, "rms_norm_eps": IMPLEMENTED,
    "mlp_bias": ignored("only Llama's MLP reads it (Mistral, Qwen2 and Qwen3 have none)",
                        model_type_in("mistral", "qwen2", "qwen3")),
    "tie_word_embeddings": IMPLEMENTED, "rope_theta": IMPLEMENTED, "hidden_act": CHECKED,
    "attention_bias": ignored("Qwen2 always has q/k/v biases and none on o_proj; Mistral has none",
                              model_type_in("qwen2", "mistral")),
    "rope_parameters": refused(lambda value, raw: scaled_rope(value, raw) or partial_rope(value, raw),
                               f"{SCALED_ROPE.why}; {WHOLE_ROPE}"),
    "rope_scaling": SCALED_ROPE,
    "partial_rotary_factor": refused(not_in(None, 1, 1.0), WHOLE_ROPE),
    "sliding_window": ignored("Llama has no window, and Qwen2/Qwen3 (as transformers) read it only with "
                              "use_sliding_window=true", no_window),
    "use_sliding_window": ignored("read by Qwen2/Qwen3 only", model_type_in("llama", "mistral")),
    # where read (Qwen2/Qwen3 with a window), read_config checks layer_types names every layer with a known type
    "max_window_layers": ignored("read only where Qwen2/Qwen3 use a window", unwindowed_qwen_or_other),
    "layer_types": ignored("Llama and Mistral (one mask for every layer) have no per-layer types; Qwen2/Qwen3 "
                           "read them only with use_sliding_window=true", unwindowed_qwen_or_other),
    "pretraining_tp": ignored(UNREAD + " (transformers 5 computes the plain matrix product)"),
    "attention_dropout": DROPOUT, "initializer_range": INIT,
}


def read_config(raw: dict) -> ModelConfig:
    model_type = raw["model_type"]
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"{model_type}: hidden_act {act!r} is not supported; expected 'silu'")
    d, heads, n_layers = require(raw, "hidden_size"), require(raw, "num_attention_heads"), require(raw, "num_hidden_layers")
    theta, _ = rope_parameters(raw)
    qwen2 = model_type == "qwen2"  # Qwen2 has q/k/v biases and none on o_proj
    bias = bool(raw.get("attention_bias", False)) and model_type != "mistral"   # as transformers reads them
    types, window = layer_types(raw, n_layers)
    return ModelConfig(
        family="llama", model_type=model_type, n_layers=n_layers, n_heads=heads,
        n_kv_heads=raw.get("num_key_value_heads") or heads, d_model=d, head_dim=raw.get("head_dim") or d // heads,
        d_ff=require(raw, "intermediate_size"), vocab_size=require(raw, "vocab_size"),
        max_positions=raw.get("max_position_embeddings", 2048), positional="rope", norm="rmsnorm",
        norm_placement="pre", causal=True, is_encoder_decoder=False, activation="silu", gated_ffn=True,
        norm_eps=raw.get("rms_norm_eps", 1e-6), rope_theta=theta, qkv_bias=qwen2 or bias,
        out_bias=bias and not qwen2, ffn_bias=bool(raw.get("mlp_bias", False)) and model_type == "llama", norm_bias=False,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), qk_norm=model_type == "qwen3",
        sliding_window=window, layer_types=types,
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"), pad_token_id=raw.get("pad_token_id"),
    )
