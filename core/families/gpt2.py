"""GPT-2: learned absolute positions, Pre-LN LayerNorm, GELU (tanh), fused qkv stored as Conv1D, tied LM head."""
from __future__ import annotations

from ..config import ConfigError, ModelConfig
from .table import CHECKED, DROPOUT, IMPLEMENTED, INIT, alias_of, ignored, is_false, is_true, refused, require, rows

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


HEAD = "GPT2DoubleHeadsModel's multiple-choice head, which is not built"
FIELDS = {
    "n_embd": IMPLEMENTED, "n_head": IMPLEMENTED, "n_layer": IMPLEMENTED, "n_positions": IMPLEMENTED,
    "n_inner": IMPLEMENTED, "layer_norm_epsilon": IMPLEMENTED, "activation_function": CHECKED,
    "hidden_size": alias_of("n_embd"), "num_attention_heads": alias_of("n_head"),
    "num_hidden_layers": alias_of("n_layer"), "max_position_embeddings": alias_of("n_positions"),
    "scale_attn_weights": refused(is_false, "scores without the 1/√d_k scale are not implemented; expected true"),
    "scale_attn_by_inverse_layer_idx": refused(is_true, "a further 1/(layer+1) on layer i's scores is not "
                                                        "implemented; expected false"),
    "tie_word_embeddings": refused(is_false, "an output matrix apart from wte is not implemented (GPT-2's head "
                                             "here is wte); expected true"),
    "reorder_and_upcast_attn": ignored("the same scores computed in float32 in another order: equal up to rounding"),
    "attn_pdrop": DROPOUT, "embd_pdrop": DROPOUT, "resid_pdrop": DROPOUT, "initializer_range": INIT,
    "summary_first_dropout": DROPOUT, "summary_last_dropout": DROPOUT, "summary_type": ignored(HEAD),
    "summary_use_proj": ignored(HEAD), "summary_activation": ignored(HEAD), "summary_proj_to_labels": ignored(HEAD),
    "n_ctx": ignored("an older copy of n_positions that transformers does not read"),
}


def read_config(raw: dict) -> ModelConfig:
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
