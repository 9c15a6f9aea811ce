"""BERT encoders: learned positions + token types, Post-LN, exact GELU, bidirectional, optional MLM head."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .table import CHECKED, DROPOUT, IMPLEMENTED, INIT, TOKENS, Field, is_true, not_in, refused, require, rows

MODEL_TYPES = ("bert",)
PREFIXES = ("bert.",)
IGNORE = (r"^pooler\.", r"^cls\.seq_relationship\.", r"^cls\.predictions\.decoder\.weight$",
          r"^embeddings\.position_ids$")
TRANSFORMS = {}
MLM_ARCHITECTURES = ("BertForMaskedLM", "BertForPreTraining")

B, L = "stack.blocks.{}", "encoder.layer.{}"
WEIGHTS = {
    "stack.embed.tokens.weight": ["embeddings.word_embeddings.weight"],
    "stack.embed.positions.weight": ["embeddings.position_embeddings.weight"],
    "stack.embed.token_types.weight": ["embeddings.token_type_embeddings.weight"],
    **rows("stack.embed.norm", "embeddings.LayerNorm"),
    **rows(f"{B}.attn.qkv", tuple(f"{L}.attention.self.{p}" for p in ("query", "key", "value"))),
    **rows(f"{B}.attn.out", f"{L}.attention.output.dense"),
    **rows(f"{B}.attn_norm", f"{L}.attention.output.LayerNorm"),
    **rows(f"{B}.ffn.up", f"{L}.intermediate.dense"),
    **rows(f"{B}.ffn.down", f"{L}.output.dense"),
    **rows(f"{B}.ffn_norm", f"{L}.output.LayerNorm"),
    **rows("lm_head.dense", "cls.predictions.transform.dense"),
    **rows("lm_head.norm", "cls.predictions.transform.LayerNorm"),
    "lm_head.bias": ["cls.predictions.bias", "cls.predictions.decoder.bias"],
}


def mlm(raw: dict) -> bool:
    return any(a in MLM_ARCHITECTURES for a in raw.get("architectures") or ())


FIELDS = {
    "hidden_size": IMPLEMENTED, "num_attention_heads": IMPLEMENTED, "num_hidden_layers": IMPLEMENTED,
    "intermediate_size": IMPLEMENTED, "max_position_embeddings": IMPLEMENTED, "type_vocab_size": IMPLEMENTED,
    "layer_norm_eps": IMPLEMENTED, "hidden_act": CHECKED,
    "architectures": Field("implemented", "an MLM class name (BertForMaskedLM, BertForPreTraining) builds the head"),
    "position_embedding_type": refused(not_in("absolute", None), "relative position embeddings are not implemented; "
                                                           "expected 'absolute'"),
    "is_decoder": refused(is_true, "a causal BERT decoder is not implemented; expected false (an encoder)"),
    "tie_word_embeddings": refused(lambda value, raw: value is False and mlm(raw),
                                   "an MLM output matrix apart from the word embeddings is not implemented; "
                                   "expected true"),
    "attention_probs_dropout_prob": DROPOUT, "hidden_dropout_prob": DROPOUT, "initializer_range": INIT,
    "bos_token_id": TOKENS, "eos_token_id": TOKENS,
}


def read_config(raw: dict) -> ModelConfig:
    act = raw.get("hidden_act", "gelu")
    act = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "silu": "silu"}.get(act)
    if act is None:
        raise ConfigError(f"bert: hidden_act {raw.get('hidden_act')!r} is not supported; expected gelu, relu, "
                          "gelu_new or silu")
    d, heads = require(raw, "hidden_size"), require(raw, "num_attention_heads")
    return ModelConfig(
        family="bert", model_type="bert", n_layers=require(raw, "num_hidden_layers"), n_heads=heads, n_kv_heads=heads,
        d_model=d, head_dim=d // heads, d_ff=require(raw, "intermediate_size"), vocab_size=require(raw, "vocab_size"),
        max_positions=raw.get("max_position_embeddings", 512), positional="learned", norm="layernorm",
        norm_placement="post", causal=False, is_encoder_decoder=False, activation=act,
        norm_eps=raw.get("layer_norm_eps", 1e-12), final_norm=False, embed_norm=True,
        type_vocab_size=raw.get("type_vocab_size", 2), has_lm_head=mlm(raw), tie_word_embeddings=True,
        lm_head_transform=True, lm_head_bias=True, pad_token_id=raw.get("pad_token_id"),
    )
