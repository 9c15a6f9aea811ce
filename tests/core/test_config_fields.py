"""Every config.json field of every supported family is implemented, refused by name, or ignored with a reason.

The field tables are FIELDS in each core/families module (plus table.COMMON); the loader runs them through
table.check_fields. Here: transformers' own config classes have no field outside the tables; each refusal stops a
load naming the field and its value; a sample of ignored fields changes no logit, in transformers or here; and a
sample of refused values does change transformers' logits."""
import json
import logging
from pathlib import Path

import pytest
import torch
import transformers as tf

from core import ConfigError, load_model
from core.families import FAMILIES
from core.families.table import CHECKED, COMMON, Field, shown
from core.loading import read_config
from tests import tiny

MODEL_TYPES = sorted(FAMILIES)


def default_raw(model_type: str, **changes) -> dict:
    """transformers' config class for `model_type` with its defaults, as the config.json it would save."""
    raw = json.loads(tf.AutoConfig.for_model(model_type).to_json_string(use_diff=False))
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not DROP}


DROP = object()   # a value for default_raw's changes that removes the field


def write(folder: Path, raw: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def unsorted(raw: dict) -> list[str]:
    known = {**COMMON, **FAMILIES[raw["model_type"]].FIELDS}
    return sorted(set(raw) - set(known))


# config.json of real checkpoints, as published: bigscience/bloom-560m, HuggingFaceTB/SmolLM2-135M-Instruct,
# nreimers/MiniLM-L6-H384-uncased (all-MiniLM-L6-v2)
REAL = {
    "bloom-560m": {
        "_name_or_path": "bigscience/bloom-560m", "apply_residual_connection_post_layernorm": False,
        "architectures": ["BloomForCausalLM"], "attention_dropout": 0.0, "attention_softmax_in_fp32": True,
        "bias_dropout_fusion": True, "bos_token_id": 1, "eos_token_id": 2, "hidden_dropout": 0.0, "hidden_size": 1024,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "masked_softmax_fusion": True, "model_type": "bloom",
        "n_head": 16, "n_inner": None, "n_layer": 24, "offset_alibi": 100, "pad_token_id": 3, "pretraining_tp": 1,
        "skip_bias_add": True, "skip_bias_add_qkv": False, "slow_but_exact": False, "transformers_version": "4.26.0",
        "unk_token_id": 0, "use_cache": True, "vocab_size": 250880},
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 100000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}, "max_position_embeddings": 8192,
        "vocab_size": 49152, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
        "torch_dtype": "float32", "use_cache": True},
    "minilm-l6": {
        "_name_or_path": "nreimers/MiniLM-L6-H384-uncased", "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": False, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "hidden_size": 384, "initializer_range": 0.02, "intermediate_size": 1536,
        "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
        "num_hidden_layers": 6, "pad_token_id": 0, "position_embedding_type": "absolute",
        "transformers_version": "4.8.2", "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522},
}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_field_of_transformers_config_is_in_a_table(model_type, tmp_path, caplog):
    raw = default_raw(model_type)
    assert unsorted(raw) == [], f"{model_type}: fields in no FIELDS table (implemented, refused or ignored)"
    with caplog.at_level(logging.INFO, logger="core.families.table"):
        cfg, family = read_config(write(tmp_path, raw))   # transformers' defaults load, nothing refused
    assert family is FAMILIES[model_type] and cfg.model_type == model_type
    assert "in no field table" not in caplog.text


def test_the_cores_docstring_names_every_model_type_it_loads():
    import re

    import core
    said = set(re.findall(r"[a-z0-9_]+", core.__doc__))
    assert sorted(set(FAMILIES) - said) == [], "core/__init__.py's docstring misses these model types"


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_checkpoint_configs_are_in_the_tables(name, tmp_path):
    assert unsorted(REAL[name]) == []
    read_config(write(tmp_path, REAL[name]))


@pytest.mark.parametrize("module", sorted({m for m in FAMILIES.values()}, key=lambda m: m.__name__) + [None],
                         ids=lambda m: "COMMON" if m is None else m.__name__.rsplit(".", 1)[-1])
def test_each_entry_is_well_formed(module):
    for name, field in (COMMON if module is None else module.FIELDS).items():
        assert isinstance(field, Field) and field.status in ("implemented", "refused", "ignored"), name
        if field.status == "refused":
            assert callable(field.when) and field.why, f"{name}: a refusal needs its values and its reason"
        if field.status == "ignored":
            assert field.why, f"{name}: an ignored field needs the reason it changes no number"


def gpt_neox_generic(field: str, value) -> dict:
    """A Pythia-style config.json (rotary_pct, no rope_parameters) with a generic RoPE field added."""
    return default_raw("gpt_neox", rope_parameters=DROP, rotary_pct=0.25, rotary_emb_base=10000, **{field: value})


LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 48, "long_factor": [2.0] * 48,
            "original_max_position_embeddings": 4096}
# (module whose FIELDS holds the entry, or "COMMON"; field; model type; the config.json change)
REFUSALS = [
    ("COMMON", "num_experts", "qwen3", {"num_experts": 8}),
    ("COMMON", "num_local_experts", "mistral", {"num_local_experts": 8}),
    ("COMMON", "num_experts_per_tok", "mistral", {"num_experts_per_tok": 2}),
    ("COMMON", "add_cross_attention", "gpt2", {"add_cross_attention": True}),
    ("gpt2", "scale_attn_weights", "gpt2", {"scale_attn_weights": False}),
    ("gpt2", "scale_attn_by_inverse_layer_idx", "gpt2", {"scale_attn_by_inverse_layer_idx": True}),
    ("gpt2", "tie_word_embeddings", "gpt2", {"tie_word_embeddings": False}),
    ("gpt2", "hidden_size", "gpt2", {"hidden_size": 99}),
    ("gpt2", "num_attention_heads", "gpt2", {"num_attention_heads": 5}),
    ("gpt2", "num_hidden_layers", "gpt2", {"num_hidden_layers": 3}),
    ("gpt2", "max_position_embeddings", "gpt2", {"max_position_embeddings": 7}),
    ("gpt2", "activation_function", "gpt2", {"activation_function": "swiglu"}),
    ("bert", "position_embedding_type", "bert", {"position_embedding_type": "relative_key"}),
    ("bert", "is_decoder", "bert", {"is_decoder": True}),
    ("bert", "tie_word_embeddings", "bert", {"tie_word_embeddings": False, "architectures": ["BertForMaskedLM"]}),
    ("bert", "hidden_act", "bert", {"hidden_act": "mish"}),
    ("bloom", "apply_residual_connection_post_layernorm", "bloom", {"apply_residual_connection_post_layernorm": True}),
    ("bloom", "tie_word_embeddings", "bloom", {"tie_word_embeddings": False}),
    ("bloom", "slow_but_exact", "bloom", {"slow_but_exact": True, "pretraining_tp": 2}),
    ("gemma", "rope_parameters", "gemma", {"rope_parameters": {"rope_type": "linear", "factor": 8.0,
                                                               "rope_theta": 10000.0}}),
    ("gemma", "rope_parameters", "gemma2", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                "partial_rotary_factor": 0.5}}),
    ("gemma", "rope_parameters", "gemma3_text", {"rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}}),
    ("gemma", "rope_scaling", "gemma3_text", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
    ("gemma", "partial_rotary_factor", "gemma", {"partial_rotary_factor": 0.5}),
    ("gemma", "use_bidirectional_attention", "gemma3_text", {"use_bidirectional_attention": True}),
    ("gemma", "hidden_act", "gemma", {"hidden_act": "relu"}),
    ("gemma", "hidden_activation", "gemma2", {"hidden_activation": "relu"}),
    ("gemma", "layer_types", "gemma2", {"layer_types": ["full_attention"] * 3}),
    ("gpt_neox", "partial_rotary_factor", "gpt_neox", gpt_neox_generic("partial_rotary_factor", 0.5)),
    ("gpt_neox", "rope_theta", "gpt_neox", gpt_neox_generic("rope_theta", 500000.0)),
    ("gpt_neox", "rope_parameters", "gpt_neox", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                                                     "rope_theta": 10000.0}}),
    ("gpt_neox", "rope_scaling", "gpt_neox", {"rope_scaling": {"type": "linear", "factor": 2.0}}),
    ("gpt_neox", "hidden_act", "gpt_neox", {"hidden_act": "mish"}),
    ("llama", "rope_parameters", "llama", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                                               "rope_theta": 500000.0}}),
    ("llama", "rope_parameters", "llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                               "partial_rotary_factor": 0.5}}),
    ("llama", "rope_scaling", "qwen2", {"rope_scaling": {"type": "yarn", "factor": 4.0}}),
    ("llama", "partial_rotary_factor", "mistral", {"partial_rotary_factor": 0.5}),
    ("llama", "hidden_act", "llama", {"hidden_act": "gelu"}),
    ("llama", "layer_types", "qwen3", {"use_sliding_window": True, "sliding_window": 4,
                                       "layer_types": ["chunked_attention"] * 32}),
    ("marian", "share_encoder_decoder_embeddings", "marian", {"share_encoder_decoder_embeddings": False}),
    ("marian", "decoder_vocab_size", "marian", {"decoder_vocab_size": 12}),
    ("marian", "hidden_size", "marian", {"hidden_size": 7}),
    ("marian", "num_hidden_layers", "marian", {"num_hidden_layers": 99}),
    ("marian", "num_attention_heads", "marian", {"num_attention_heads": 3}),
    ("marian", "activation_function", "marian", {"activation_function": "mish"}),
    ("opt", "word_embed_proj_dim", "opt", {"word_embed_proj_dim": 512}),
    ("opt", "layer_norm_elementwise_affine", "opt", {"layer_norm_elementwise_affine": False}),
    ("opt", "activation_function", "opt", {"activation_function": "mish"}),
    ("phi3", "rope_parameters", "phi3", {"rope_parameters": LONGROPE}),
    ("phi3", "rope_scaling", "phi3", {"rope_scaling": {"type": "su", "short_factor": [1.0] * 48,
                                                       "long_factor": [2.0] * 48}}),
    ("phi3", "head_dim", "phi3", {"head_dim": 64}),
    ("phi3", "hidden_act", "phi3", {"hidden_act": "gelu"}),
    ("t5", "feed_forward_proj", "t5", {"feed_forward_proj": "gated-mish"}),
    ("t5", "hidden_size", "t5", {"hidden_size": 7}),
    ("t5", "num_attention_heads", "t5", {"num_attention_heads": 3}),
    ("t5", "num_hidden_layers", "t5", {"num_hidden_layers": 3}),
    ("t5", "head_dim", "t5", {"head_dim": 3}),
]
MODULES = {"COMMON": None, **{m.__name__.rsplit(".", 1)[-1]: m for m in FAMILIES.values()}}


def test_every_refusal_and_every_checked_field_has_a_case():
    cases = {(table, field) for table, field, _, _ in REFUSALS}
    for table, module in MODULES.items():
        fields = COMMON if module is None else module.FIELDS
        for name, field in fields.items():
            if field.status == "refused" or field == CHECKED:
                assert (table, name) in cases, f"{table}.FIELDS[{name!r}] has no refusal case here"


@pytest.mark.parametrize("table,field,model_type,change", REFUSALS,
                         ids=[f"{m}-{f}-{i}" for i, (_, f, m, _) in enumerate(REFUSALS)])
def test_a_refusal_names_the_field_and_its_value(table, field, model_type, change, tmp_path):
    raw = change if "model_type" in change else default_raw(model_type, **change)
    with pytest.raises(ConfigError) as err:
        read_config(write(tmp_path, raw))
    message = str(err.value)
    assert field in message and str(tmp_path / "config.json") in message
    fields = COMMON if MODULES[table] is None else MODULES[table].FIELDS
    if fields[field].status == "refused":   # check_fields' own message: the value and what would work
        assert f"{field}={shown(raw[field])} ({fields[field].why})" in message


def test_all_refused_fields_are_named_in_one_message(tmp_path):
    raw = default_raw("opt", word_embed_proj_dim=512, layer_norm_elementwise_affine=False, num_local_experts=4)
    with pytest.raises(ConfigError) as err:
        read_config(write(tmp_path, raw))
    for named in ("word_embed_proj_dim=512 (", "layer_norm_elementwise_affine=False (", "num_local_experts=4 ("):
        assert named in str(err.value)


def test_an_unknown_field_is_a_warning_and_kept_on_the_config(tmp_path, caplog):
    raw = default_raw("llama", some_future_flag=True, another_new_knob=[1, 2])
    with caplog.at_level(logging.WARNING, logger="core.families.table"):
        cfg, _ = read_config(write(tmp_path, raw))
    assert cfg.family == "llama"
    assert cfg.unread_fields == ("some_future_flag", "another_new_knob")
    warned = {r.getMessage() for r in caplog.records if r.levelno == logging.WARNING}
    assert any("some_future_flag=True is in no field table" in m for m in warned), warned
    assert any("another_new_knob=[1, 2] is in no field table" in m for m in warned), warned


def test_a_config_of_known_fields_has_no_unread_field(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="core.families.table"):
        cfg, _ = read_config(write(tmp_path, default_raw("gpt2")))
    assert cfg.unread_fields == () and caplog.records == []


def test_a_loaded_model_keeps_its_unread_fields(tmp_path, caplog):
    folder = Path(tiny.save(tiny.gpt2(), str(tmp_path / "model")))
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "some_future_flag": True}))
    with caplog.at_level(logging.WARNING, logger="core.families.table"):
        model = load_model(folder, device="cpu", dtype=torch.float32)
    assert model.config.unread_fields == ("some_future_flag",)
    assert "some_future_flag=True is in no field table" in caplog.text


# ---- ignored fields change no number: transformers' logits with and without them are equal, and so are ours ----

IGNORED = [
    ("gpt2 dropouts", tiny.gpt2, {"attn_pdrop": 0.5, "resid_pdrop": 0.5, "embd_pdrop": 0.5}),
    ("gpt2 reorder_and_upcast_attn", tiny.gpt2, {"reorder_and_upcast_attn": True}),
    ("gpt2 use_cache, initializer_range, n_ctx", tiny.gpt2, {"use_cache": False, "initializer_range": 0.9,
                                                             "n_ctx": 3}),
    ("qwen2 sliding_window without use_sliding_window", lambda: tiny.llama("qwen2"),
     {"sliding_window": 2, "max_window_layers": 0}),
    ("opt dropout and layerdrop", tiny.opt, {"dropout": 0.5, "attention_dropout": 0.5, "layerdrop": 0.9}),
    ("bloom pretraining_tp without slow_but_exact", tiny.bloom, {"pretraining_tp": 2}),
    ("gemma 1 query_pre_attn_scalar", lambda: tiny.gemma(1), {"query_pre_attn_scalar": 7}),
    ("phi3 original_max_position_embeddings", tiny.phi3, {"original_max_position_embeddings": 8}),
]


@pytest.mark.parametrize("builder,change", [c[1:] for c in IGNORED], ids=[c[0] for c in IGNORED])
def test_an_ignored_field_changes_no_logit(builder, change, tmp_path):
    hf = builder()
    folder = Path(tiny.save(hf, str(tmp_path / "model")))
    raw = json.loads((folder / "config.json").read_text())
    fields = {**COMMON, **FAMILIES[raw["model_type"]].FIELDS}
    for name, value in change.items():   # each is ignored in this config, by the table's own condition
        field = fields[name]
        assert field.status == "ignored" and (field.when is None or field.when(value, {**raw, **change})), name
    ids = torch.randint(3, tiny.VOCAB, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = hf(ids).logits
        (folder / "config.json").write_text(json.dumps({**raw, **change}))
        theirs = type(hf).from_pretrained(folder, attn_implementation="eager").eval()(ids).logits
        ours = load_model(folder, device="cpu", dtype=torch.float32)(ids)
    torch.testing.assert_close(theirs, before, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.logits, before, rtol=1e-4, atol=1e-4)


# ---- a sample of refusals is not over-cautious: transformers' logits do change with the refused value ----

CHANGING = [
    ("gpt2 scale_attn_by_inverse_layer_idx", tiny.gpt2, {"scale_attn_by_inverse_layer_idx": True}),
    ("bloom slow_but_exact with pretraining_tp 2", tiny.bloom, {"slow_but_exact": True, "pretraining_tp": 2}),
    ("bloom apply_residual_connection_post_layernorm", tiny.bloom, {"apply_residual_connection_post_layernorm": True}),
]


@pytest.mark.parametrize("builder,change", [c[1:] for c in CHANGING], ids=[c[0] for c in CHANGING])
def test_a_refused_value_changes_transformers_logits(builder, change, tmp_path):
    hf = builder()
    folder = Path(tiny.save(hf, str(tmp_path / "model")))
    raw = {**json.loads((folder / "config.json").read_text()), **change}
    (folder / "config.json").write_text(json.dumps(raw))
    ids = torch.randint(3, tiny.VOCAB, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = hf(ids).logits
        after = type(hf).from_pretrained(folder, attn_implementation="eager").eval()(ids).logits
    assert (after - before).abs().max() > 1e-3
    with pytest.raises(ConfigError, match="|".join(change)):
        load_model(folder, device="cpu")
