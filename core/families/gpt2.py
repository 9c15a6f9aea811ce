"""GPT-2: learned absolute positions, Pre-LN LayerNorm, GELU (tanh), fused qkv stored as Conv1D, tied LM head."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .table import require, rows

MODEL_TYPES = ("gpt2",)
PREFIXES = ("transformer.",)
IGNORE = (r"^h\.\d+\.attn\.(masked_)?bias$", r"^lm_head\.weight$")
# Conv1D stores [in, out]; nn.Linear wants [out, in]
TRANSFORMS = {r"\.(attn\.qkv|attn\.out|ffn\.up|ffn\.down)\.weight$": lambda w, cfg: w.t()}
TO_CHECKPOINT = TRANSFORMS  # a transpose undoes itself

B = "stack.blocks.{}"
WEIGHTS = {
    "stack.embed.tokens.weight": ["wte.weight"],
    "stack.embed.positions.weight": ["wpe.weight"],
    **rows(f"{B}.attn_norm", "h.{}.ln_1"),
    **rows(f"{B}.attn.qkv", "h.{}.attn.c_attn"),
    **rows(f"{B}.attn.out", "h.{}.attn.c_proj"),
    **rows(f"{B}.ffn_norm", "h.{}.ln_2"),
    **rows(f"{B}.ffn.up", "h.{}.mlp.c_fc"),
    **rows(f"{B}.ffn.down", "h.{}.mlp.c_proj"),
    **rows("stack.final_norm", "ln_f"),
}

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def read_config(raw: dict) -> ModelConfig:
    if not raw.get("scale_attn_weights", True) or raw.get("scale_attn_by_inverse_layer_idx", False):
        raise ConfigError("gpt2: only the standard 1/√d_k attention scaling is supported")
    act = raw.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise ConfigError(f"gpt2: activation_function {act!r} is not supported; expected one of {sorted(ACTIVATIONS)}")
    d, heads = require(raw, "n_embd"), require(raw, "n_head")
    return ModelConfig(
        family="gpt2", model_type="gpt2", n_layers=require(raw, "n_layer"), n_heads=heads, n_kv_heads=heads,
        d_model=d, head_dim=d // heads, d_ff=raw.get("n_inner") or 4 * d, vocab_size=require(raw, "vocab_size"),
        max_positions=require(raw, "n_positions"), positional="learned", norm="layernorm", norm_placement="pre",
        causal=True, is_encoder_decoder=False, activation=ACTIVATIONS[act],
        norm_eps=raw.get("layer_norm_epsilon", 1e-5), tie_word_embeddings=True,
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"), pad_token_id=raw.get("pad_token_id"),
    )
