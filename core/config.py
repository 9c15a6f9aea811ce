"""The model config: one dataclass that every family's config reader fills from config.json."""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass


class ConfigError(ValueError):
    """config.json is missing, malformed, or describes something this core cannot build."""


class IndexRangeError(ValueError, IndexError):
    """An index (a layer, a head, a position) that is not an int in 0..n-1. A ValueError, the core's one exception
    for a refused argument; also an IndexError, so that code written against either catches it."""


def check_index(value, n: int, what: str, where: str) -> int:
    """value, an int in 0..n-1, or an IndexRangeError naming the range: "layer 5 is out of range: the model has
    layers 0..3". Negative indices are refused, not counted from the end."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):   # numpy's ints are Integral too
        raise IndexRangeError(f"{what} must be an int in 0..{n - 1} ({where} 0..{n - 1}), got {value!r}")
    value = int(value)
    if not 0 <= value < n:
        raise IndexRangeError(f"{what} {value} is out of range: {where} 0..{n - 1}")
    return value


@dataclass
class ModelConfig:
    family: str                      # a module of core/families: "gpt2", "llama", "bert", "marian", "t5", ...
    n_layers: int                    # blocks in the main stack (the decoder for seq2seq)
    n_heads: int                     # query heads h
    n_kv_heads: int                  # key/value heads (< n_heads: grouped-query attention)
    d_model: int                     # d
    head_dim: int                    # d_k = d_v, read from config, not derived
    d_ff: int                        # feed-forward width
    vocab_size: int
    max_positions: int
    positional: str                  # "learned" | "sinusoidal" | "rope" | "none" (no positions added to the
                                     # embeddings: a lab model without positions, or one whose score_bias says them)
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
    # The named terms of the one attention function and block; each family's reader says which it uses.
    attn_scale: float | None = None  # the factor on QKᵀ when it is not 1/√d_k: 1 (T5), query_pre_attn_scalar^-½ (Gemma)
    attn_softcap: float | None = None   # scores → c·tanh(scores / c) after scaling, before the mask (Gemma 2)
    attention_sinks: str = ""        # one more entry in each softmax's denominator, with no value: "logit", a
                                     # learned logit per head (gpt-oss); "key", a learned key per head, scored by
                                     # each query as a key is (a key-only sink token); "": none
    score_bias: str = "none"         # a term added to the scores: "alibi" (−m_h·(i − j), BLOOM) or "relative"
                                     # (T5's learned bias per head and bucket of j − i, shared by a stack's layers)
    relative_buckets: int = 32       # T5: buckets of relative distance
    relative_max_distance: int = 128  # T5: distances past this share the last bucket
    sliding_window: int | None = None  # "sliding" layers mask keys w or more positions back (i − j ≥ w)
    layer_types: tuple[str, ...] = ()  # "full" | "sliding" per layer of the main stack; () means all "full"
    rotary_dim: int = 0              # RoPE rotates the first rotary_dim dims of each head, rounded up to an even
                                     # count (one pair per frequency, as transformers does); 0: all of them
    rope_local_theta: float = 0.0    # the RoPE base of "sliding" layers when it differs (Gemma 3); 0: rope_theta
    qk_norm: bool = False            # an RMSNorm over d_k on each head's q and k, before RoPE (Qwen3, Gemma 3)
    attn_output_gate: bool = False   # z_h ← z_h ⊙ σ(x·W_g,h): a sigmoid gate on each head's output, elementwise, from
                                     # the layer's input, before W_O (Qiu et al. 2025, their G1; a weight `gate`)
    differential_attention: bool = False  # heads 2i, 2i+1 form one: (softmax(Q₁K₁ᵀs) − λ·softmax(Q₂K₂ᵀs))·[V₁ V₂],
                                     # then an RMSNorm ×(1 − λ_init) (Ye et al. 2025; core.model.Attention)
    parallel_block: bool = False     # x + attn(norm₁(x)) + mlp(norm₂(x)): both sublayers read the block's input
    sandwich_norm: bool = False      # a norm on each sublayer's output too, before it joins the residual (Gemma 2/3)
    norm_offset: float = 0.0         # norms scale by (offset + γ): 1 for Gemma's (1 + γ)
    position_offset: int = 0         # learned positions are read at position + offset (OPT: 2)
    final_softcap: float | None = None  # logits → c·tanh(logits / c) (Gemma 2)
    lm_head_scale: float = 1.0       # hidden × this before the vocabulary projection (T5 with tied embeddings: d^-½)
    encoder_head_dim: int = 0        # seq2seq: the encoder's d_k when it is not d_model / its heads (T5's d_kv)
    unread_fields: tuple[str, ...] = ()  # config.json fields in no table of the family (families/table.py):
                                     # not read, so a number they would change is not changed here

    def __post_init__(self):
        problem = self.variant_problem()
        if problem:
            raise ConfigError(problem)

    def variant_problem(self) -> str | None:
        """Why the gated or differential attention term cannot be built with this config, in words; None if it
        can (or neither is on)."""
        for name in ("attn_output_gate", "differential_attention"):
            if not isinstance(getattr(self, name), bool):
                return f"{name} must be True or False, got {getattr(self, name)!r}"
        if not self.differential_attention:
            return None
        if self.n_heads % 2:
            return (f"differential attention pairs the heads (heads 2i and 2i+1 form differential head i), so "
                    f"n_heads must be even; got {self.n_heads}")
        if self.n_kv_heads != self.n_heads:
            return (f"differential attention pairs each query head with its own key/value head here: n_kv_heads must "
                    f"equal n_heads ({self.n_heads}); got {self.n_kv_heads}")
        if self.attention_sinks:
            return (f"differential attention has no form here with a sink in each softmax "
                    f"(attention_sinks={self.attention_sinks!r})")
        return None

    @property
    def score_scale(self) -> float:
        """The factor on QKᵀ in eq. 2.1: 1/√d_k unless the family says otherwise."""
        if self.attn_scale is not None:
            return self.attn_scale
        return self.head_dim ** -0.5 if self.scale_attention else 1.0

    def layer_type(self, layer: int) -> str:
        """"full" or "sliding" (a window of sliding_window keys) for one layer of the main stack."""
        return self.layer_types[layer] if self.layer_types else "full"

    def layer_window(self, layer: int) -> int | None:
        """The sliding window w of `layer` (its query i reads no key j with i − j ≥ w), or None on a "full" layer."""
        return self.sliding_window if self.layer_type(layer) == "sliding" else None

    def local_rope(self, layer: int) -> bool:
        """`layer` rotates with the "sliding" layers' own RoPE base (rope_local_theta, Gemma 3), not rope_theta."""
        return bool(self.rope_local_theta) and self.rope_local_theta != self.rope_theta \
            and self.layer_type(layer) == "sliding"

    def layer_rope_theta(self, layer: int) -> float:
        """The RoPE base θ that `layer` rotates with (local_rope: the sliding layers' own)."""
        return self.rope_local_theta if self.local_rope(layer) else self.rope_theta

    @property
    def kv_group(self) -> int:
        """How many query heads read each key/value head (1 without grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    def kv_head(self, head: int) -> int:
        """The key/value head that query head `head` reads (grouped-query attention: heads g·j .. g·j + g − 1 read
        kv head j, g = kv_group)."""
        return head // self.kv_group

    def check_layer(self, layer, stack: str = "the model") -> int:
        """layer, an int in 0..n_layers-1, or an IndexRangeError naming the range."""
        return check_index(layer, self.n_layers, "layer", f"{stack} has layers")

    def check_head(self, layer, head, stack: str = "the model") -> tuple[int, int]:
        """(layer, head), each in range, or an IndexRangeError naming the range."""
        layer = self.check_layer(layer, stack)
        return layer, check_index(head, self.n_heads, "head", f"layer {layer} has heads")

    @property
    def eos_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, (list, tuple)) else [self.eos_token_id]


def encoder_config(cfg: ModelConfig) -> ModelConfig:
    """The seq2seq encoder's own shape: bidirectional, its own depth, width and head count."""
    heads = cfg.encoder_n_heads or cfg.n_heads
    head_dim = cfg.encoder_head_dim or cfg.d_model // heads
    return dataclasses.replace(cfg, n_layers=cfg.n_encoder_layers, n_heads=heads, n_kv_heads=heads,
                               d_ff=cfg.encoder_d_ff or cfg.d_ff, head_dim=head_dim, causal=False,
                               layer_types=(), sliding_window=None)
