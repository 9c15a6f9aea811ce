"""Loading refuses what it cannot load exactly, and says which file and tensor are wrong."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from core import CheckpointError, ConfigError, load_model
from core.analysis.inspect import parameter_counts
from tests import tiny


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return Path(tiny.save(tiny.llama(tie_word_embeddings=False), str(tmp_path_factory.mktemp("llama"))))


def copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "model"))


def edit_tensors(folder: Path, change) -> None:
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def edit_config(folder: Path, change) -> None:
    raw = json.loads((folder / "config.json").read_text())
    change(raw)
    (folder / "config.json").write_text(json.dumps(raw))


def test_loads_and_reports_config(llama_folder):
    model = load_model(llama_folder, device="cpu")
    c = model.config
    assert (c.family, c.positional, c.norm, c.norm_placement, c.causal, c.is_encoder_decoder) == \
        ("llama", "rope", "rmsnorm", "pre", True, False)
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.head_dim) == (2, 4, 2, 48, 12)
    assert model.device.type == "cpu" and model.dtype == torch.float32
    assert model.tokenizer is None


def test_missing_tensor(llama_folder, tmp_path):
    folder = copy(llama_folder, tmp_path)
    edit_tensors(folder, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor layers\.1\.mlp\.down_proj\.weight"):
        load_model(folder)


def test_unexpected_tensor(llama_folder, tmp_path):
    folder = copy(llama_folder, tmp_path)
    edit_tensors(folder, lambda t: t.update({"model.layers.0.self_attn.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors.*model\.safetensors: tensor 'model\.layers\.0\.self_attn\.extra\.weight'"):
        load_model(folder)


def test_shape_mismatch(llama_folder, tmp_path):
    folder = copy(llama_folder, tmp_path)
    edit_config(folder, lambda raw: raw.update(intermediate_size=64))
    with pytest.raises(CheckpointError, match=r"shape mismatch: model\.safetensors: tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' \[96, 48\]"):
        load_model(folder)


def test_unknown_architecture(llama_folder, tmp_path):
    folder = copy(llama_folder, tmp_path)
    edit_config(folder, lambda raw: raw.update(model_type="mamba", architectures=["MambaForCausalLM"]))
    with pytest.raises(ConfigError, match=r"unknown architecture model_type='mamba'.*supported model types: bert, bloom, gemma, gemma2, gemma3_text, gpt2, gpt_neox, llama, marian, "
                       r"mistral, opt, phi3, qwen2, qwen3, t5"):
        load_model(folder)


def test_pickle_checkpoints_are_refused_unread(tmp_path, llama_folder):
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(llama_folder / "config.json", folder)
    # not a valid pickle at all: loading must refuse it by name, never try to read it
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04this would be unpickled")
    with pytest.raises(CheckpointError, match=r"only pickle checkpoints \(pytorch_model\.bin\); they are refused and never unpickled"):
        load_model(folder)


def test_malformed_config(llama_folder, tmp_path):
    folder = copy(llama_folder, tmp_path)
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    with pytest.raises(ConfigError, match=r"config\.json: malformed JSON"):
        load_model(folder)
    edit_config_text = json.dumps({"model_type": "llama", "num_attention_heads": 4})
    (folder / "config.json").write_text(edit_config_text)
    with pytest.raises(ConfigError, match=r"config\.json has no 'hidden_size'"):
        load_model(folder)


def test_corrupt_safetensors(llama_folder, tmp_path):
    folder = copy(llama_folder, tmp_path)
    (folder / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        load_model(folder)


def test_sharded_checkpoint(llama_folder, tmp_path):
    folder = tmp_path / "sharded"
    folder.mkdir()
    shutil.copy(llama_folder / "config.json", folder)
    tensors = load_file(llama_folder / "model.safetensors")
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, folder / file, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, ks in halves.items() for k in ks}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    x = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(load_model(folder)(x).logits, load_model(llama_folder)(x).logits, atol=0, rtol=0)


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "marian", "gpt_neox", "bloom", "t5", "gemma3", "opt"])
def test_parameter_counts_add_up(family):
    hf = tiny.gemma(3) if family == "gemma3" else getattr(tiny, family)()
    model = load_model(tiny.save(hf))
    counts = parameter_counts(model)
    parts = ("embeddings", "attention", "feed_forward", "norms", "lm_head", "position_bias")
    assert sum(counts[p] for p in parts) == counts["total"]
    d, c = model.config.d_model, model.config
    if c.n_kv_heads == c.n_heads and c.head_dim * c.n_heads == d and not c.is_encoder_decoder:
        biases = 4 * d if c.qkv_bias else 0
        assert counts["per_layer"]["attention"] == 4 * d * d + biases  # W^Q, W^K, W^V, W^O


def test_a_folder_given_by_path_is_checked_against_its_manifest(llama_folder, tmp_path):
    from core.store.manifest import write_manifest
    folder = tmp_path / "copy"
    shutil.copytree(llama_folder, folder)
    write_manifest(folder, "copy", {"type": "local", "path": str(folder)}, "test")
    load_model(folder)  # intact: loads
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF  # one flipped byte inside the last tensor
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"does not match its manifest:\n  - model\.safetensors: sha256"):
        load_model(folder)
