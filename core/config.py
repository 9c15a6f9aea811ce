"""The model config: one dataclass that every family's config reader fills from config.json."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


class ConfigError(ValueError):
    """config.json is missing, malformed, or describes something this core cannot build."""


@dataclass
class ModelConfig:
    family: str                      # "gpt2" | "llama" | "bert" | "marian"
    n_layers: int                    # blocks in the main stack (the decoder for seq2seq)
    n_heads: int                     # query heads h
    n_kv_heads: int                  # key/value heads (< n_heads: grouped-query attention)
    d_model: int                     # d
    head_dim: int                    # d_k = d_v, read from config, not derived
    d_ff: int                        # feed-forward width
    vocab_size: int
    max_positions: int
    positional: str                  # "learned" | "sinusoidal" | "rope" | "none" (a lab model without positions)
    norm: str                        # "layernorm" | "rmsnorm"
    norm_placement: str              # "pre" (x + f(norm(x))) | "post" (norm(x + f(x)))
    causal: bool                     # the main stack masks future positions
    is_encoder_decoder: bool
    activation: str = "gelu"         # key of core.layers.ACTIVATIONS
    gated_ffn: bool = False          # SwiGLU: down(act(gate(x)) * up(x))
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    qkv_bias: bool = True
    out_bias: bool = True
    ffn_bias: bool = True
    norm_bias: bool = True           # LayerNorm has a bias; RMSNorm has none
    final_norm: bool = True          # a norm after the last block (Pre-LN stacks)
    embed_norm: bool = False         # a norm right after the embeddings (BERT)
    embed_scale: float = 1.0         # Marian multiplies token embeddings by √d
    type_vocab_size: int = 0         # BERT token-type (segment) embeddings
    has_lm_head: bool = True
    tie_word_embeddings: bool = True
    lm_head_transform: bool = False  # BERT MLM head: dense → act → LayerNorm before the vocabulary projection
    lm_head_bias: bool = False       # BERT's decoder bias, Marian's final_logits_bias
    n_encoder_layers: int = 0        # seq2seq only
    encoder_d_ff: int = 0
    encoder_n_heads: int = 0
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    decoder_start_token_id: int | None = None
    model_type: str = ""
    scale_attention: bool = True     # QKᵀ/√d_k; False only for a lab model trained without it
    dropout: float = 0.0             # on each sublayer's output and on the embeddings, in training only

    @property
    def eos_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, (list, tuple)) else [self.eos_token_id]


def encoder_config(cfg: ModelConfig) -> ModelConfig:
    """The seq2seq encoder's own shape: bidirectional, its own depth, width and head count."""
    heads = cfg.encoder_n_heads or cfg.n_heads
    return dataclasses.replace(cfg, n_layers=cfg.n_encoder_layers, n_heads=heads, n_kv_heads=heads,
                               d_ff=cfg.encoder_d_ff or cfg.d_ff, head_dim=cfg.d_model // heads, causal=False)
