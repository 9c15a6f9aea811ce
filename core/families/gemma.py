"""Gemma, Gemma 2 and Gemma 3 (text): the Llama layout with norms that scale by (1 + γ), GeGLU, embeddings × √d,
and the head tied to the embeddings. Gemma 2 and 3 add a norm on each sublayer's output (sandwich), the scale
query_pre_attn_scalar^-½, and local layers (a sliding window) alternating with global ones; Gemma 2 soft-caps the
scores and the final logits; Gemma 3 normalises each head's q and k and gives its local layers their own RoPE base."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .table import CHECKED, DROPOUT, IMPLEMENTED, INIT, SCALED_ROPE, WHOLE_ROPE, activation, ignored, is_true, \
    model_type_in, not_in, partial_rope, refused, require, rope_parameters, rows, scaled_rope

MODEL_TYPES = ("gemma", "gemma2", "gemma3_text")
PREFIXES = ("model.language_model.", "model.")
IGNORE = (r"rotary_emb\.\w*inv_freq$", r"^lm_head\.weight$")
TRANSFORMS = {}

B, L = "stack.blocks.{}", "layers.{}"
WEIGHTS = {
    "stack.embed.tokens.weight": ["embed_tokens.weight"],
    **rows(f"{B}.attn_norm", f"{L}.input_layernorm", bias=False),
    **rows(f"{B}.attn.qkv", tuple(f"{L}.self_attn.{p}_proj" for p in "qkv")),
    **rows(f"{B}.attn.out", f"{L}.self_attn.o_proj"),
    **rows(f"{B}.attn.q_norm", f"{L}.self_attn.q_norm", bias=False),
    **rows(f"{B}.attn.k_norm", f"{L}.self_attn.k_norm", bias=False),
    # Gemma 2/3 name the norm after attention "post_attention" and the one before the MLP "pre_feedforward";
    # Gemma 1, like Llama, calls the norm before the MLP "post_attention"
    **rows(f"{B}.attn_post_norm", f"{L}.post_attention_layernorm", bias=False),
    **rows(f"{B}.ffn_norm", f"{L}.pre_feedforward_layernorm", f"{L}.post_attention_layernorm", bias=False),
    **rows(f"{B}.ffn_post_norm", f"{L}.post_feedforward_layernorm", bias=False),
    **rows(f"{B}.ffn.up", (f"{L}.mlp.gate_proj", f"{L}.mlp.up_proj")),
    **rows(f"{B}.ffn.down", f"{L}.mlp.down_proj"),
    **rows("stack.final_norm", "norm", bias=False),
    **rows("lm_head", "lm_head", bias=False),
}

ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu_tanh"}  # Gemma's "gelu" is
# the tanh form: transformers rewrites it so
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}


def layer_types(raw: dict, n_layers: int) -> tuple[str, ...]:
    """config.json's layer_types, or transformers' default: Gemma 2 local on even layers; Gemma 3 global on every
    sliding_window_pattern-th layer (6 by default), local on the rest."""
    named = raw.get("layer_types")
    if named:
        if len(named) != n_layers or set(named) - set(LAYER_TYPES):
            raise ConfigError(f"{raw['model_type']}: layer_types must name {n_layers} layers, each one of "
                              f"{sorted(LAYER_TYPES)}; got {named!r}")
        return tuple(LAYER_TYPES[t] for t in named)
    pattern = 2 if raw["model_type"] == "gemma2" else raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6
    return tuple("sliding" if (i + 1) % pattern else "full" for i in range(n_layers))


GEMMA1 = model_type_in("gemma")
FIELDS = {
    "hidden_size": IMPLEMENTED, "num_attention_heads": IMPLEMENTED, "num_hidden_layers": IMPLEMENTED,
    "num_key_value_heads": IMPLEMENTED, "head_dim": IMPLEMENTED, "intermediate_size": IMPLEMENTED,
    "max_position_embeddings": IMPLEMENTED, "rms_norm_eps": IMPLEMENTED, "attention_bias": IMPLEMENTED,
    "tie_word_embeddings": IMPLEMENTED, "rope_theta": IMPLEMENTED, "rope_local_base_freq": IMPLEMENTED,
    "hidden_act": CHECKED, "hidden_activation": CHECKED, "layer_types": CHECKED,
    "sliding_window_pattern": IMPLEMENTED, "_sliding_window_pattern": IMPLEMENTED,
    "rope_parameters": refused(lambda value, raw: scaled_rope(value, raw) or partial_rope(value, raw),
                               f"{SCALED_ROPE.why}; {WHOLE_ROPE}"),
    "rope_scaling": SCALED_ROPE,
    "partial_rotary_factor": refused(not_in(None, 1, 1.0), WHOLE_ROPE),
    "use_bidirectional_attention": refused(is_true, "attention without the causal mask (an embedding model) is "
                                                    "not implemented; expected false or null"),
    "query_pre_attn_scalar": ignored("Gemma 1 scales by head_dim^-½; Gemma 2 and 3 read it", GEMMA1),
    "attn_logit_softcapping": ignored("Gemma 1 caps no scores; Gemma 2 and 3 read it", GEMMA1),
    "final_logit_softcapping": ignored("Gemma 1 caps no logits; Gemma 2 and 3 read it", GEMMA1),
    "sliding_window": ignored("Gemma 1 has no local layers; Gemma 2 and 3 read it", GEMMA1),
    "attention_dropout": DROPOUT, "initializer_range": INIT,
}


def read_config(raw: dict) -> ModelConfig:
    model_type = raw["model_type"]
    later = model_type != "gemma"          # Gemma 2 and 3
    d, heads, n_layers = require(raw, "hidden_size"), require(raw, "num_attention_heads"), require(raw, "num_hidden_layers")
    act_key = "hidden_activation" if later or raw.get("hidden_activation") else "hidden_act"
    act = activation(raw, act_key, ACTIVATIONS, "gelu_pytorch_tanh")
    head_dim = raw.get("head_dim") or d // heads
    theta, _ = rope_parameters(raw, "full_attention" if model_type == "gemma3_text" else None)
    local_theta = 0.0
    if model_type == "gemma3_text":
        nested = (raw.get("rope_parameters") or {}).get("sliding_attention")
        local_theta = rope_parameters(raw, "sliding_attention")[0] if isinstance(nested, dict) else \
            float(raw.get("rope_local_base_freq", 10000.0))
        if not isinstance(nested, dict) and raw.get("rope_theta") is None and not raw.get("rope_parameters"):
            theta = 1_000_000.0   # Gemma 3's global layers' default base
    types = layer_types(raw, n_layers) if later else ()
    window = raw.get("sliding_window") if later else None
    scalar = raw.get("query_pre_attn_scalar")
    return ModelConfig(
        family="gemma", model_type=model_type, n_layers=n_layers, n_heads=heads,
        n_kv_heads=raw.get("num_key_value_heads") or heads, d_model=d, head_dim=head_dim,
        d_ff=require(raw, "intermediate_size"), vocab_size=require(raw, "vocab_size"),
        max_positions=raw.get("max_position_embeddings", 8192), positional="rope", norm="rmsnorm",
        norm_placement="pre", causal=True, is_encoder_decoder=False, activation=act, gated_ffn=True,
        norm_eps=raw.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_local_theta=local_theta,
        qkv_bias=bool(raw.get("attention_bias", False)), out_bias=bool(raw.get("attention_bias", False)),
        ffn_bias=False, norm_bias=False, norm_offset=1.0, embed_scale=d ** 0.5,
        attn_scale=scalar ** -0.5 if later and scalar else None, attn_softcap=raw.get("attn_logit_softcapping") if later else None,
        final_softcap=raw.get("final_logit_softcapping") if later else None, sandwich_norm=later,
        qk_norm=model_type == "gemma3_text", sliding_window=None if window is None else int(window),
        layer_types=types,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"), pad_token_id=raw.get("pad_token_id"),
    )
