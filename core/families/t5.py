"""T5 (and Flan-T5): an encoder-decoder whose positions are a learned bias per head and bucket of relative distance,
one table per stack shared by its layers; no 1/√d_k; RMSNorm without mean or bias; Pre-LN; no biases anywhere;
ReLU or a gated GELU (tanh) feed-forward. With tied embeddings the decoder's output is scaled by d^-½ first."""
from __future__ import annotations

import dataclasses

from ..config import ConfigError, ModelConfig
from .table import CHECKED, DROPOUT, Field, IMPLEMENTED, INIT, UNREAD, alias_of, ignored, require, rows

MODEL_TYPES = ("t5",)
PREFIXES = ()
IGNORE = (r"^decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight$",)
TRANSFORMS = {}


def sublayers(ours: str, theirs: str, cross: bool) -> dict:
    attn, ffn = f"{theirs}.layer.0", f"{theirs}.layer.{2 if cross else 1}"
    out = {
        **rows(f"{ours}.attn_norm", f"{attn}.layer_norm", bias=False),
        **rows(f"{ours}.attn.qkv", tuple(f"{attn}.SelfAttention.{p}" for p in "qkv"), bias=False),
        **rows(f"{ours}.attn.out", f"{attn}.SelfAttention.o", bias=False),
        **rows(f"{ours}.ffn_norm", f"{ffn}.layer_norm", bias=False),
        # gated: wi_0 is the gate, wi_1 the up projection (gate rows first, as FeedForward reads them)
        **rows(f"{ours}.ffn.up", (f"{ffn}.DenseReluDense.wi_0", f"{ffn}.DenseReluDense.wi_1"),
               f"{ffn}.DenseReluDense.wi", bias=False),
        **rows(f"{ours}.ffn.down", f"{ffn}.DenseReluDense.wo", bias=False),
    }
    if cross:
        out.update({
            **rows(f"{ours}.cross_norm", f"{theirs}.layer.1.layer_norm", bias=False),
            **rows(f"{ours}.cross.q", f"{theirs}.layer.1.EncDecAttention.q", bias=False),
            **rows(f"{ours}.cross.kv", (f"{theirs}.layer.1.EncDecAttention.k", f"{theirs}.layer.1.EncDecAttention.v"),
                   bias=False),
            **rows(f"{ours}.cross.out", f"{theirs}.layer.1.EncDecAttention.o", bias=False),
        })
    return out


WEIGHTS = {
    "stack.embed.tokens.weight": ["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"],
    "encoder.score_bias.table.weight": ["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
    "stack.score_bias.table.weight": ["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
    **sublayers("encoder.blocks.{}", "encoder.block.{}", cross=False),
    **sublayers("stack.blocks.{}", "decoder.block.{}", cross=True),
    **rows("encoder.final_norm", "encoder.final_layer_norm", bias=False),
    **rows("stack.final_norm", "decoder.final_layer_norm", bias=False),
    "lm_head.weight": ["lm_head.weight"],
}

def WITH_CHECKPOINT(cfg: ModelConfig, names: set[str]) -> ModelConfig:
    """A file with its own lm_head.weight uses it (transformers keeps a distinct one whatever the tying flag);
    one without reads the embeddings."""
    return dataclasses.replace(cfg, tie_word_embeddings="lm_head.weight" not in names)


FEED_FORWARD = {"relu": ("relu", False), "gated-gelu": ("gelu_tanh", True), "gated-silu": ("silu", True),
                "gated-relu": ("relu", True), "gelu": ("gelu", False)}

DERIVED = ignored("transformers derives it from feed_forward_proj, overwriting config.json's value")
FIELDS = {
    "d_model": IMPLEMENTED, "d_kv": IMPLEMENTED, "d_ff": IMPLEMENTED, "num_heads": IMPLEMENTED,
    "num_layers": IMPLEMENTED, "num_decoder_layers": IMPLEMENTED, "n_positions": IMPLEMENTED,
    "relative_attention_num_buckets": IMPLEMENTED, "relative_attention_max_distance": IMPLEMENTED,
    "layer_norm_epsilon": IMPLEMENTED, "scale_decoder_outputs": IMPLEMENTED, "decoder_start_token_id": IMPLEMENTED,
    "tie_word_embeddings": Field("implemented", "says whether the decoder output is scaled by d^-½; the files say "
                                                "whether the head is the embeddings (WITH_CHECKPOINT)"),
    "feed_forward_proj": CHECKED, "dense_act_fn": DERIVED, "is_gated_act": DERIVED,
    "hidden_size": alias_of("d_model"), "num_attention_heads": alias_of("num_heads"),
    "num_hidden_layers": alias_of("num_layers"), "head_dim": alias_of("d_kv"),
    "add_cross_attention": ignored("the encoder-decoder has its cross-attention anyway; " + UNREAD),
    "output_past": ignored("an older name of use_cache: transformers' KV-cache switch"),
    "dropout_rate": DROPOUT, "initializer_factor": INIT,
}


def read_config(raw: dict) -> ModelConfig:
    kind = raw.get("feed_forward_proj", "relu")
    if kind not in FEED_FORWARD:
        raise ConfigError(f"t5: feed_forward_proj {kind!r} is not supported; expected one of {sorted(FEED_FORWARD)}")
    act, gated = FEED_FORWARD[kind]
    d, heads, d_kv = require(raw, "d_model"), require(raw, "num_heads"), require(raw, "d_kv")
    # transformers 5 writes the output scaling as scale_decoder_outputs; original configs say it by tying
    scaled = raw.get("scale_decoder_outputs", raw.get("tie_word_embeddings", True) is not False)
    n_layers = require(raw, "num_layers")
    return ModelConfig(
        family="t5", model_type="t5", n_layers=raw.get("num_decoder_layers") or n_layers, n_heads=heads,
        n_kv_heads=heads, d_model=d, head_dim=d_kv, d_ff=require(raw, "d_ff"), vocab_size=require(raw, "vocab_size"),
        max_positions=raw.get("n_positions", 512), positional="none", score_bias="relative",
        relative_buckets=raw.get("relative_attention_num_buckets", 32),
        relative_max_distance=raw.get("relative_attention_max_distance", 128), norm="rmsnorm", norm_placement="pre",
        causal=True, is_encoder_decoder=True, activation=act, gated_ffn=gated, norm_eps=raw.get("layer_norm_epsilon", 1e-6),
        qkv_bias=False, out_bias=False, ffn_bias=False, norm_bias=False, attn_scale=1.0,
        tie_word_embeddings=raw.get("tie_word_embeddings", True) is not False, lm_head_scale=d ** -0.5 if scaled else 1.0,
        n_encoder_layers=n_layers, encoder_d_ff=require(raw, "d_ff"), encoder_n_heads=heads, encoder_head_dim=d_kv,
        pad_token_id=raw.get("pad_token_id"), eos_token_id=raw.get("eos_token_id"), bos_token_id=raw.get("bos_token_id"),
        decoder_start_token_id=raw.get("decoder_start_token_id", raw.get("pad_token_id", 0)),
    )
