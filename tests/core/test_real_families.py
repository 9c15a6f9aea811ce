"""The smallest real checkpoint of each new family against transformers on the same folder, fp32 and eager.

These weights come from the Hugging Face Hub only (no PyPI wheel bundles them): without the hub, or without the
licence accepted and HF_TOKEN set for a gated one, each test skips and says which source failed and why. The tiny
random configs of tests/core/test_families.py are what CI checks.
"""
import pytest
import torch

from core import load_model
from core.store import WeightsUnavailable, ensure

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.real_weights]

# at most ~1.5 GB on disk each; Phi-3-mini (7.6 GB) and Gemma 2 2B (10 GB) are in the registry but not fetched here.
# Gemma 3 270M, which PyPI bundles, has its own and stricter module (tests/core/test_real_gemma3.py: 700 tokens,
# past its window, against transformers reading the GGUF it came from)
CAUSAL = ["pythia-70m", "bloom-560m", "opt-125m", "tinymistral-248m", "qwen3-0.6b"]
SEQ2SEQ = ["flan-t5-small"]
TEXT = "The quick brown fox jumps over the lazy dog because it was late for"
LOGITS_TOL, ATTENTION_TOL = 1e-3, 1e-4   # fp32 over hundreds of millions of weights: rounding grows with depth


def folder_or_skip(name):
    try:
        return ensure(name)
    except WeightsUnavailable as error:
        pytest.skip(f"{name}: no weight source reachable, so its real-checkpoint parity cannot run here:\n{error}")


@pytest.mark.parametrize("name", CAUSAL)
def test_real_decoder_matches_transformers(name):
    folder = folder_or_skip(name)
    ours = load_model(folder, device="cpu", dtype=torch.float32)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                               dtype=torch.float32).eval()
    ids = ours.tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        ref = theirs(ids, output_attentions=True)
    out = ours(ids, capture_attention=True)
    assert (out.logits - ref.logits).abs().max().item() <= LOGITS_TOL
    for layer, (a, b) in enumerate(zip(out.attentions, ref.attentions)):
        assert (a - b).abs().max().item() <= ATTENTION_TOL, f"attention layer {layer}"
    assert torch.equal(ours.generate(ids, 16), theirs.generate(ids, max_new_tokens=16, do_sample=False)[:, :ids.shape[1] + 16])


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_real_seq2seq_matches_transformers(name):
    folder = folder_or_skip(name)
    ours = load_model(folder, device="cpu", dtype=torch.float32)
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager",
                                                                dtype=torch.float32).eval()
    ids = ours.tokenizer("translate English to German: " + TEXT, return_tensors="pt").input_ids
    decoder_ids = torch.tensor([[ours.config.decoder_start_token_id]])
    with torch.no_grad():
        ref = theirs(input_ids=ids, decoder_input_ids=decoder_ids, output_attentions=True)
    out = ours(ids, decoder_input_ids=decoder_ids, capture_attention=True)
    assert (out.logits - ref.logits).abs().max().item() <= LOGITS_TOL
    for a, b in zip(out.encoder_attentions, ref.encoder_attentions):
        assert (a - b).abs().max().item() <= ATTENTION_TOL
