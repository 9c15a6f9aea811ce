"""Marian (the encoder-decoder of "Attention is all you need"): sinusoidal positions, Post-LN, scaled
embeddings, encoder self-attention, decoder causal self-attention + cross-attention, final_logits_bias."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .table import CHECKED, DROPOUT, IMPLEMENTED, INIT, UNREAD, alias_of, ignored, is_false, refused, require, rows

MODEL_TYPES = ("marian",)
PREFIXES = ("model.",)
IGNORE = (r"embed_positions\.weight$", r"^lm_head\.weight$")
TRANSFORMS = {r"^lm_head\.bias$": lambda b, cfg: b.reshape(-1)}  # final_logits_bias is stored [1, vocab]
TO_CHECKPOINT = {r"^lm_head\.bias$": lambda b, cfg: b.reshape(1, -1)}

E, D = "encoder.layers.{}", "decoder.layers.{}"


def sublayers(ours: str, theirs: str, cross: bool) -> dict:
    out = {
        **rows(f"{ours}.attn.qkv", tuple(f"{theirs}.self_attn.{p}_proj" for p in "qkv")),
        **rows(f"{ours}.attn.out", f"{theirs}.self_attn.out_proj"),
        **rows(f"{ours}.attn_norm", f"{theirs}.self_attn_layer_norm"),
        **rows(f"{ours}.ffn.up", f"{theirs}.fc1"),
        **rows(f"{ours}.ffn.down", f"{theirs}.fc2"),
        **rows(f"{ours}.ffn_norm", f"{theirs}.final_layer_norm"),
    }
    if cross:
        out.update({
            **rows(f"{ours}.cross.q", f"{theirs}.encoder_attn.q_proj"),
            **rows(f"{ours}.cross.kv", (f"{theirs}.encoder_attn.k_proj", f"{theirs}.encoder_attn.v_proj")),
            **rows(f"{ours}.cross.out", f"{theirs}.encoder_attn.out_proj"),
            **rows(f"{ours}.cross_norm", f"{theirs}.encoder_attn_layer_norm"),
        })
    return out


WEIGHTS = {
    # one embedding matrix shared by encoder, decoder and (when tied) the LM head
    "stack.embed.tokens.weight": ["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"],
    **sublayers("encoder.blocks.{}", E, cross=False),
    **sublayers("stack.blocks.{}", D, cross=True),
    # only lab models trained as Pre-LN have these (core/lab/train.py); the names are those of MBart's final norms
    **rows("encoder.final_norm", "encoder.layer_norm"),
    **rows("stack.final_norm", "decoder.layer_norm"),
    "lm_head.weight": ["lm_head.weight"],
    "lm_head.bias": ["final_logits_bias"],
}

ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh"}


BART = ignored("a BART-era key older Marian configs carry; " + UNREAD + " (Marian is Post-LN, without an "
               "embedding norm, with fixed sinusoids)")
FIELDS = {
    "d_model": IMPLEMENTED, "encoder_layers": IMPLEMENTED, "decoder_layers": IMPLEMENTED,
    "encoder_attention_heads": IMPLEMENTED, "decoder_attention_heads": IMPLEMENTED, "encoder_ffn_dim": IMPLEMENTED,
    "decoder_ffn_dim": IMPLEMENTED, "max_position_embeddings": IMPLEMENTED, "scale_embedding": IMPLEMENTED,
    "tie_word_embeddings": IMPLEMENTED, "decoder_start_token_id": IMPLEMENTED, "activation_function": CHECKED,
    "hidden_size": alias_of("d_model"), "num_hidden_layers": alias_of("encoder_layers"),
    "num_attention_heads": alias_of("encoder_attention_heads"),
    "share_encoder_decoder_embeddings": refused(is_false, "separate encoder and decoder vocabularies are not "
                                                          "implemented; expected true"),
    "decoder_vocab_size": refused(lambda value, raw: value not in (None, raw.get("vocab_size")),
                                  "an output vocabulary apart from the shared one is not implemented; expected "
                                  "vocab_size"),
    "add_cross_attention": ignored("the encoder-decoder has its cross-attention anyway; " + UNREAD),
    "dropout": DROPOUT, "attention_dropout": DROPOUT, "activation_dropout": DROPOUT, "classif_dropout": DROPOUT,
    "encoder_layerdrop": ignored("layer drop is for training; in eval every layer runs"),
    "decoder_layerdrop": ignored("layer drop is for training; in eval every layer runs"),
    "init_std": INIT, "normalize_before": BART, "add_final_layer_norm": BART, "normalize_embedding": BART,
    "static_position_embeddings": BART, "add_bias_logits": BART, "extra_pos_embeddings": BART,
}


def read_config(raw: dict) -> ModelConfig:
    act = ACTIVATIONS.get(raw.get("activation_function", "swish"))
    if act is None:
        raise ConfigError(f"marian: activation_function {raw.get('activation_function')!r} is not supported; "
                          f"expected one of {sorted(ACTIVATIONS)}")
    d, heads = require(raw, "d_model"), require(raw, "decoder_attention_heads")
    return ModelConfig(
        family="marian", model_type="marian", n_layers=require(raw, "decoder_layers"), n_heads=heads, n_kv_heads=heads,
        d_model=d, head_dim=d // heads, d_ff=require(raw, "decoder_ffn_dim"), vocab_size=require(raw, "vocab_size"),
        max_positions=raw.get("max_position_embeddings", 512), positional="sinusoidal", norm="layernorm",
        norm_placement="post", causal=True, is_encoder_decoder=True, activation=act, norm_eps=1e-5,
        final_norm=False, embed_scale=d ** 0.5 if raw.get("scale_embedding", False) else 1.0,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)), lm_head_bias=True,
        n_encoder_layers=require(raw, "encoder_layers"), encoder_d_ff=require(raw, "encoder_ffn_dim"),
        encoder_n_heads=require(raw, "encoder_attention_heads"), pad_token_id=raw.get("pad_token_id"),
        eos_token_id=raw.get("eos_token_id"), bos_token_id=raw.get("bos_token_id"),
        decoder_start_token_id=raw.get("decoder_start_token_id", raw.get("pad_token_id")),
    )
