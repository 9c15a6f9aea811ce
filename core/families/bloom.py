"""BLOOM: ALiBi (a per-head slope times the distance, added to the scores; no position embedding), a LayerNorm
on the embeddings, Pre-LN LayerNorm blocks, GELU (tanh), q/k/v fused per head, the head tied to the embeddings."""
from __future__ import annotations

from ..config import ModelConfig
from .table import DROPOUT, IMPLEMENTED, INIT, UNREAD, ignored, is_false, is_true, per_head_qkv, qkv_per_head, \
    refused, require, rows

MODEL_TYPES = ("bloom",)
PREFIXES = ("transformer.",)
IGNORE = (r"^lm_head\.weight$",)
TRANSFORMS = {r"\.attn\.qkv\.(weight|bias)$": per_head_qkv}   # stored [H, 3, d_k] rows
TO_CHECKPOINT = {r"\.attn\.qkv\.(weight|bias)$": qkv_per_head}

B, L = "stack.blocks.{}", "h.{}"
WEIGHTS = {
    "stack.embed.tokens.weight": ["word_embeddings.weight"],
    **rows("stack.embed.norm", "word_embeddings_layernorm"),
    **rows(f"{B}.attn_norm", f"{L}.input_layernorm"),
    **rows(f"{B}.attn.qkv", f"{L}.self_attention.query_key_value"),
    **rows(f"{B}.attn.out", f"{L}.self_attention.dense"),
    **rows(f"{B}.ffn_norm", f"{L}.post_attention_layernorm"),
    **rows(f"{B}.ffn.up", f"{L}.mlp.dense_h_to_4h"),
    **rows(f"{B}.ffn.down", f"{L}.mlp.dense_4h_to_h"),
    **rows("stack.final_norm", "ln_f"),
}


MEGATRON = ignored("a Megatron-DeepSpeed training setting; " + UNREAD)
FIELDS = {
    "hidden_size": IMPLEMENTED, "n_embed": IMPLEMENTED, "n_head": IMPLEMENTED, "num_attention_heads": IMPLEMENTED,
    "n_layer": IMPLEMENTED, "num_hidden_layers": IMPLEMENTED, "layer_norm_epsilon": IMPLEMENTED,
    "seq_length": IMPLEMENTED,
    "apply_residual_connection_post_layernorm": refused(is_true, "a residual taken after the norm is not "
                                                                "implemented; expected false"),
    "tie_word_embeddings": refused(is_false, "an output matrix apart from the word embeddings is not implemented; "
                                             "expected true"),
    "pretraining_tp": ignored("read only with slow_but_exact, which is refused where it would apply"),
    "slow_but_exact": refused(lambda value, raw: bool(value) and (raw.get("pretraining_tp") or 1) > 1,
                              "with pretraining_tp > 1, transformers sums the output projections in slices and drops "
                              "their biases; not implemented; expected false"),
    "n_inner": ignored(UNREAD + " (the MLP is 4·hidden_size wide)"),
    "attention_softmax_in_fp32": MEGATRON, "masked_softmax_fusion": MEGATRON, "bias_dropout_fusion": MEGATRON,
    "skip_bias_add": MEGATRON, "skip_bias_add_qkv": MEGATRON, "offset_alibi": MEGATRON,
    "attention_dropout": DROPOUT, "hidden_dropout": DROPOUT, "initializer_range": INIT,
}


def read_config(raw: dict) -> ModelConfig:
    d, heads = require(raw, "hidden_size", "n_embed"), require(raw, "n_head", "num_attention_heads")
    return ModelConfig(
        family="bloom", model_type="bloom", n_layers=require(raw, "n_layer", "num_hidden_layers"), n_heads=heads,
        n_kv_heads=heads, d_model=d, head_dim=d // heads, d_ff=4 * d, vocab_size=require(raw, "vocab_size"),
        max_positions=raw.get("seq_length") or 2048, positional="none", score_bias="alibi", norm="layernorm",
        norm_placement="pre", causal=True, is_encoder_decoder=False, activation="gelu_tanh",
        norm_eps=raw.get("layer_norm_epsilon", 1e-5), embed_norm=True, tie_word_embeddings=True,
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"), pad_token_id=raw.get("pad_token_id"),
    )
