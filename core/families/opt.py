"""OPT: learned positions read at position + 2, ReLU, LayerNorm, Pre-LN or Post-LN by do_layer_norm_before,
the head tied to the embeddings."""
from __future__ import annotations

from ..config import ModelConfig
from .table import CHECKED, DROPOUT, IMPLEMENTED, INIT, activation, ignored, is_false, refused, require, rows

MODEL_TYPES = ("opt",)
PREFIXES = ("model.decoder.", "decoder.")
IGNORE = (r"^lm_head\.weight$",)
TRANSFORMS = {}

B, L = "stack.blocks.{}", "layers.{}"
WEIGHTS = {
    "stack.embed.tokens.weight": ["embed_tokens.weight"],
    "stack.embed.positions.weight": ["embed_positions.weight"],
    **rows(f"{B}.attn_norm", f"{L}.self_attn_layer_norm"),
    **rows(f"{B}.attn.qkv", tuple(f"{L}.self_attn.{p}_proj" for p in "qkv")),
    **rows(f"{B}.attn.out", f"{L}.self_attn.out_proj"),
    **rows(f"{B}.ffn_norm", f"{L}.final_layer_norm"),
    **rows(f"{B}.ffn.up", f"{L}.fc1"),
    **rows(f"{B}.ffn.down", f"{L}.fc2"),
    **rows("stack.final_norm", "final_layer_norm"),
}

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "silu": "silu"}
POSITION_OFFSET = 2  # OPT's table has two rows before position 0


FIELDS = {
    "hidden_size": IMPLEMENTED, "num_attention_heads": IMPLEMENTED, "num_hidden_layers": IMPLEMENTED,
    "ffn_dim": IMPLEMENTED, "max_position_embeddings": IMPLEMENTED, "do_layer_norm_before": IMPLEMENTED,
    "_remove_final_layer_norm": IMPLEMENTED, "enable_bias": IMPLEMENTED, "tie_word_embeddings": IMPLEMENTED,
    "activation_function": CHECKED,
    "word_embed_proj_dim": refused(lambda value, raw: value not in (None, raw.get("hidden_size")),
                                   "embeddings narrower than hidden_size, with project_in/project_out layers "
                                   "(opt-350m), are not implemented; expected hidden_size"),
    "layer_norm_elementwise_affine": refused(is_false, "LayerNorm without γ and β is not implemented; expected true"),
    "dropout": DROPOUT, "attention_dropout": DROPOUT, "activation_dropout": DROPOUT,
    "layerdrop": ignored("layer drop is for training; in eval every layer runs"), "init_std": INIT,
}


def read_config(raw: dict) -> ModelConfig:
    d = require(raw, "hidden_size")
    heads, pre = require(raw, "num_attention_heads"), bool(raw.get("do_layer_norm_before", True))
    bias = bool(raw.get("enable_bias", True))
    return ModelConfig(
        family="opt", model_type="opt", n_layers=require(raw, "num_hidden_layers"), n_heads=heads, n_kv_heads=heads,
        d_model=d, head_dim=d // heads, d_ff=require(raw, "ffn_dim"), vocab_size=require(raw, "vocab_size"),
        max_positions=raw.get("max_position_embeddings", 2048), positional="learned", norm="layernorm",
        norm_placement="pre" if pre else "post", causal=True, is_encoder_decoder=False,
        activation=activation(raw, "activation_function", ACTIVATIONS, "relu"), norm_eps=1e-5,
        qkv_bias=bias, out_bias=bias, ffn_bias=bias, position_offset=POSITION_OFFSET,
        final_norm=pre and not raw.get("_remove_final_layer_norm", False),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"), pad_token_id=raw.get("pad_token_id"),
    )
