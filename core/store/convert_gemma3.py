"""A gemma3 GGUF -> a Hugging Face Gemma 3 (text) folder: config.json from the gemma3.* metadata, tensor names, and the
norms' stored offset undone.

The names and config keys follow transformers' own GGUF reader (integrations/ggml.py, "gemma3";
modeling_gguf_pytorch_utils.py, Gemma2TensorProcessor): llama.cpp stores each RMSNorm's weight as 1 + γ, as
Gemma's norm multiplies by (1 + γ), so γ = stored − 1; q and k rows are not permuted (no rotary interleaving for
gemma). What the GGUF does not carry (the local layers' RoPE base, the query scale, the local/global pattern)
takes Gemma3TextConfig's defaults, as transformers' loader does, written out here so config.json states them.
"""

from __future__ import annotations

import numpy as np

from .errors import WeightsError

# GGUF tensor name -> Hugging Face Gemma 3 name; {} is the layer index.
GEMMA3_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.attn_q_norm.weight": "model.layers.{}.self_attn.q_norm.weight",
    "blk.{}.attn_k_norm.weight": "model.layers.{}.self_attn.k_norm.weight",
    "blk.{}.post_attention_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.pre_feedforward_layernorm.weight",
    "blk.{}.post_ffw_norm.weight": "model.layers.{}.post_feedforward_layernorm.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
}

# Gemma3TextConfig's defaults for what a gemma3 GGUF leaves out (transformers' loader falls back to the same)
LOCAL_ROPE_THETA = 10000.0     # the sliding layers' RoPE base
QUERY_PRE_ATTN_SCALAR = 256    # scores scaled by 256^-½
GLOBAL_EVERY = 6               # every 6th layer is global (full attention), the rest local (sliding)


def gemma3_config_from_gguf(reader, value) -> dict:
    """config.json for a gemma3 GGUF; `value(reader, key, default)` reads one metadata field."""
    n_layers = value(reader, "gemma3.block_count")
    heads = value(reader, "gemma3.attention.head_count")
    window = value(reader, "gemma3.attention.sliding_window")
    if window is None:
        raise WeightsError("the gemma3 GGUF has no gemma3.attention.sliding_window; its local layers need it")
    rope_theta = value(reader, "gemma3.rope.freq_base", 1_000_000.0)
    vocab = value(reader, "gemma3.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    eos = value(reader, "tokenizer.ggml.eos_token_id")
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": value(reader, "gemma3.embedding_length"),
        "intermediate_size": value(reader, "gemma3.feed_forward_length"),
        "num_hidden_layers": n_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": value(reader, "gemma3.attention.head_count_kv", heads),
        "head_dim": value(reader, "gemma3.attention.key_length"),
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": value(reader, "gemma3.attention.layer_norm_rms_epsilon"),
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_ROPE_THETA},
        },
        "query_pre_attn_scalar": QUERY_PRE_ATTN_SCALAR,
        "sliding_window": window,
        "layer_types": ["full_attention" if (i + 1) % GLOBAL_EVERY == 0 else "sliding_attention"
                        for i in range(n_layers)],
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "max_position_embeddings": value(reader, "gemma3.context_length"),
        "vocab_size": vocab,
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": value(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": value(reader, "tokenizer.ggml.padding_token_id", eos),
        "torch_dtype": "float32",
        "use_cache": True,
    }


def gemma3_expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    d, f, v, dk = config["hidden_size"], config["intermediate_size"], config["vocab_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * dk, config["num_key_value_heads"] * dk
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, d)
    per_layer = {
        "input_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (q, d),
        "self_attn.k_proj.weight": (kv, d),
        "self_attn.v_proj.weight": (kv, d),
        "self_attn.o_proj.weight": (d, q),
        "self_attn.q_norm.weight": (dk,),
        "self_attn.k_norm.weight": (dk,),
        "post_attention_layernorm.weight": (d,),
        "pre_feedforward_layernorm.weight": (d,),
        "post_feedforward_layernorm.weight": (d,),
        "mlp.gate_proj.weight": (f, d),
        "mlp.up_proj.weight": (f, d),
        "mlp.down_proj.weight": (d, f),
    }
    for i in range(config["num_hidden_layers"]):
        shapes.update({f"model.layers.{i}.{k}": s for k, s in per_layer.items()})
    return shapes


def gemma3_tensor(name: str, weight: np.ndarray, config: dict) -> np.ndarray:
    """γ = stored − 1 for every RMSNorm weight (llama.cpp stores Gemma's 1 + γ)."""
    return weight - 1 if name.endswith("norm.weight") else weight
