"""Small helpers that write weight-name table rows and config-field tables; a family file uses them to stay short."""
from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple

from ..config import ConfigError

log = logging.getLogger(__name__)


def require(raw: dict, *keys: str):
    """Read the first of `keys` present in config.json, or say which key is missing."""
    for key in keys:
        if raw.get(key) is not None:
            return raw[key]
    raise ConfigError(f"config.json has no {' or '.join(repr(k) for k in keys)} (model_type {raw.get('model_type')!r})")


def rows(ours: str, *theirs, bias: bool = True) -> dict[str, list]:
    """weight (and bias) rows for one of our modules. Each of `theirs` is a checkpoint module name, or a tuple
    of names whose tensors are concatenated; several are alternatives tried in order."""
    def named(alt, leaf):
        return tuple(f"{n}.{leaf}" for n in alt) if isinstance(alt, tuple) else f"{alt}.{leaf}"
    out = {f"{ours}.weight": [named(alt, "weight") for alt in theirs]}
    if bias:
        out[f"{ours}.bias"] = [named(alt, "bias") for alt in theirs]
    return out


def per_head_qkv(w, cfg):
    """Fused q/k/v rows stored per head, [H, 3, d_k, ...] (GPT-NeoX, BLOOM), → ours, [3, H, d_k, ...]."""
    return w.reshape(cfg.n_heads, 3, cfg.head_dim, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


def qkv_per_head(w, cfg):
    """The inverse of per_head_qkv, for saving in the checkpoint's layout."""
    return w.reshape(3, cfg.n_heads, cfg.head_dim, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


def rope_parameters(raw: dict, layer_type: str | None = None) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from the top level (transformers 4) or rope_parameters (transformers 5,
    possibly one dict per layer type). Only the default RoPE is implemented: check_fields refuses a scaled one
    (SCALED_ROPE) before this is read."""
    params = raw.get("rope_parameters") or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    theta = params.get("rope_theta") or raw.get("rope_theta") or raw.get("rotary_emb_base") or 10000.0
    partial = params.get("partial_rotary_factor") or raw.get("partial_rotary_factor") or raw.get("rotary_pct") or 1.0
    return float(theta), float(partial)


def rotary_dim(head_dim: int, partial: float) -> int:
    """How many of a head's dims RoPE rotates (all, or the first partial · d_k)."""
    return 0 if partial >= 1.0 else int(head_dim * partial)


def activation(raw: dict, key: str, known: dict[str, str], default: str) -> str:
    """Our activation name for config.json's `key`, or a refusal that names the supported ones."""
    name = raw.get(key) or default
    if name not in known:
        raise ConfigError(f"{raw.get('model_type')}: {key} {name!r} is not supported; expected one of {sorted(known)}")
    return known[name]


# ---- config.json fields: each family's FIELDS table sorts every field it may meet into one of three kinds ----

class Field(NamedTuple):
    """How the loader treats one config.json field.

    implemented  read_config reads it; `why` may say where its value is checked.
    refused      the values for which when(value, raw) holds change the numbers in a way the core does not
                 implement: check_fields stops the load naming the field, its value and `why` (what would
                 work). Other values are read, or are the behaviour the core has anyway.
    ignored      changes no number the core computes, for the reason `why`: in every case, or only where
                 when(value, raw) holds (elsewhere the field is read).
    """
    status: str
    why: str = ""
    when: Callable[[Any, dict], bool] | None = None


IMPLEMENTED = Field("implemented")
CHECKED = Field("implemented", "read_config checks its value and names it when it is not supported")


def refused(when: Callable[[Any, dict], bool], why: str) -> Field:
    return Field("refused", why, when)


def ignored(why: str, when: Callable[[Any, dict], bool] | None = None) -> Field:
    return Field("ignored", why, when)


def is_true(value, raw) -> bool:
    return bool(value)


def is_false(value, raw) -> bool:
    return value is False


def not_in(*allowed) -> Callable[[Any, dict], bool]:
    return lambda value, raw: value not in allowed


def model_type_in(*types: str) -> Callable[[Any, dict], bool]:
    return lambda value, raw: raw.get("model_type") in types


def alias_of(key: str) -> Field:
    """transformers' attribute_map name for `key`: read config.json's `key`, refuse the pair when they disagree."""
    return refused(lambda value, raw: key in raw and value != raw[key],
                   f"transformers' alias of {key}, which read_config reads; the two must agree")


def rope_dicts(value) -> list[dict]:
    """A rope_parameters/rope_scaling value as its dicts: one, or one per layer type (Gemma 3)."""
    if not isinstance(value, dict):
        return []
    nested = [v for v in value.values() if isinstance(v, dict)]
    return nested or [value]


def scaled_rope(value, raw) -> bool:
    return any((d.get("rope_type") or d.get("type") or "default") != "default" for d in rope_dicts(value))


def partial_rope(value, raw) -> bool:
    return any(d.get("partial_rotary_factor") not in (None, 1, 1.0) for d in rope_dicts(value))


SCALED_ROPE = refused(scaled_rope, "a rope type other than 'default' (linear, dynamic, yarn, longrope, llama3, …) "
                                   "is not implemented; only the default RoPE θ_i = base^(-2i/d) is")
WHOLE_ROPE = "RoPE on part of each head is not implemented for this family; expected partial_rotary_factor 1.0"
DROPOUT = ignored("dropout: the core runs in eval mode, where dropout is the identity")
INIT = ignored("an initialisation scale for training; the weights come from the checkpoint")
UNREAD = "transformers' model of this family does not read it, so neither does the core"

# The generic PreTrainedConfig keys (and those older transformers versions wrote into every config.json);
# a family's FIELDS entry for the same name wins.
OUTPUTS = ignored("a transformers output switch: what is returned, not what is computed")
LABELS = ignored("a classification head's setting; no classification head is built")
GENERATION = ignored("a generation default of transformers' generate(); generation here takes its own arguments")
PRECISION = ignored("the checkpoint's storage precision; load_model's dtype chooses the one computed in")
PROVENANCE = ignored("where the config came from; no number depends on it")
TOKENS = ignored("a special-token id the tokenizer reads; no number depends on it")
MORE_THAN_ONE = refused(lambda value, raw: isinstance(value, int) and value > 1,
                        "a mixture of experts (routed feed-forward layers) is not implemented; the core has one "
                        "dense feed-forward per block")
COMMON: dict[str, Field] = {
    "model_type": Field("implemented", "chooses the family (core.families.family_for)"),
    "attention_explorer": Field("implemented", "this project's lab overrides, checked by core.loading.with_overrides"),
    "vocab_size": IMPLEMENTED, "bos_token_id": IMPLEMENTED, "eos_token_id": IMPLEMENTED, "pad_token_id": IMPLEMENTED,
    "num_experts": MORE_THAN_ONE, "num_local_experts": MORE_THAN_ONE, "num_experts_per_tok": MORE_THAN_ONE,
    "add_cross_attention": refused(is_true, "cross-attention inside a decoder-only or encoder stack is not "
                                            "implemented (encoder-decoders come from their own families); "
                                            "expected false"),
    "cross_attention_hidden_size": ignored("read only with add_cross_attention, which is refused"),
    "is_decoder": ignored("the family fixes which stacks are causal; transformers' causal-LM and seq2seq classes "
                          "set it per stack"),
    "is_encoder_decoder": ignored("the family fixes whether it is an encoder-decoder"),
    "decoder_start_token_id": ignored("the first decoder token of an encoder-decoder's generation; a decoder-only "
                                      "family has none"),
    "architectures": ignored("names transformers' head class; the family's weight table reads what the files hold"),
    "auto_map": ignored("classes of remote code; none is run, the family's own tables read the checkpoint"),
    "_name_or_path": PROVENANCE, "name_or_path": PROVENANCE, "_commit_hash": PROVENANCE,
    "transformers_version": PROVENANCE,
    "dtype": PRECISION, "torch_dtype": PRECISION, "use_bfloat16": PRECISION,
    "output_attentions": OUTPUTS, "output_hidden_states": OUTPUTS, "return_dict": OUTPUTS, "output_scores": OUTPUTS,
    "return_dict_in_generate": OUTPUTS, "torchscript": OUTPUTS,
    "id2label": LABELS, "label2id": LABELS, "num_labels": LABELS, "_num_labels": LABELS, "problem_type": LABELS,
    "finetuning_task": LABELS, "classifier_dropout": LABELS,
    "chunk_size_feed_forward": ignored("runs the feed-forward over chunks of positions; each position's result "
                                       "is the same"),
    "use_cache": ignored("transformers' KV-cache switch; generation here keeps its own cache, whose logits equal "
                         "the uncached ones"),
    "cache_implementation": GENERATION,
    "gradient_checkpointing": ignored("a training memory trade; the same numbers"),
    "tf_legacy_loss": ignored("a loss setting; nothing here computes transformers' loss"),
    "attn_implementation": ignored("transformers' attention kernel; the core has its own"),
    "_attn_implementation_autoset": ignored("transformers' attention kernel; the core has its own"),
    "tie_encoder_decoder": ignored(UNREAD + " (transformers 5)"),
    "pruned_heads": ignored(UNREAD + " (transformers 5); a pruned checkpoint's shapes are checked tensor by tensor"),
    "tokenizer_class": ignored("a tokenizer setting"), "prefix": ignored("a pipeline's input prefix"),
    "task_specific_params": ignored("pipeline settings per task"),
    "sep_token_id": TOKENS, "unk_token_id": TOKENS, "cls_token_id": TOKENS, "mask_token_id": TOKENS,
    **{key: GENERATION for key in (
        "assistant_confidence_threshold", "assistant_lookbehind", "bad_words_ids", "begin_suppress_tokens",
        "diversity_penalty", "do_sample", "early_stopping", "encoder_no_repeat_ngram_size",
        "encoder_repetition_penalty", "epsilon_cutoff", "eta_cutoff", "exponential_decay_length_penalty",
        "forced_bos_token_id", "forced_eos_token_id", "length_penalty", "max_length", "min_length",
        "no_repeat_ngram_size", "num_assistant_tokens", "num_assistant_tokens_schedule", "num_beam_groups",
        "num_beams", "num_return_sequences", "remove_invalid_values", "repetition_penalty", "suppress_tokens",
        "target_lookbehind", "temperature", "top_k", "top_p", "typical_p")},
}


def check_fields(raw: dict, fields: dict[str, Field]) -> tuple[str, ...]:
    """Refuse config.json's fields whose values the core does not implement, all of them in one message that names
    each field, its value and what would work. Return the fields in no table, in config.json's order: they are not
    read, so a config.json with extra keys still loads, but a key a newer transformers reads may change numbers the
    core does not change; each is logged as a warning and the loader keeps the names (ModelConfig.unread_fields)
    for the model card. tests/core/test_config_fields.py keeps the tables complete for transformers' own keys."""
    known = {**COMMON, **fields}
    wrong, unread = [], []
    for name, value in raw.items():
        field = known.get(name)
        if field is None:
            unread.append(name)
            log.warning("%s: config.json field %s=%s is in no field table of its family; the core does not read it, "
                        "so if it changes transformers' numbers it does not change ours",
                        raw.get("model_type"), name, shown(value))
        elif field.status == "refused" and field.when(value, raw):
            wrong.append(f"{name}={shown(value)} ({field.why})")
    if wrong:
        raise ConfigError(f"{raw.get('model_type')}: " + "; ".join(wrong))
    return tuple(unread)


def shown(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"
