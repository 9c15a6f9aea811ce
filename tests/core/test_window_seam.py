"""forward(window=w) on a full-attention model equals the same weights with the family's own sliding window, and
global_tokens keeps keys 0..g−1 visible to every query."""
from __future__ import annotations

import pytest
import torch

from core import load_model
from tests import tiny

W = 4
IDS = torch.tensor([[5, 17, 42, 8, 63, 21, 9, 77, 30, 11, 54, 2, 19]])


@pytest.fixture(scope="module")
def full_and_windowed():
    """A Mistral-layout model without a window, the same weights saved with sliding_window=W, and transformers' own."""
    full = tiny.mistral(sliding_window=None)
    windowed = tiny.mistral(sliding_window=W)
    windowed.load_state_dict(full.state_dict())
    ours = load_model(tiny.save(full), device="cpu", dtype=torch.float32)
    theirs = load_model(tiny.save(windowed), device="cpu", dtype=torch.float32)
    return ours, theirs, windowed


def test_window_on_a_full_model_equals_the_familys_own_window(full_and_windowed):
    ours, theirs, hf = full_and_windowed
    assert ours.config.layer_types in ((), ("full",) * 3) and set(theirs.config.layer_types) == {"sliding"}
    with torch.inference_mode():
        seam = ours(IDS, window=W).logits
        own = theirs(IDS).logits
        plain = ours(IDS).logits
        reference = hf(IDS).logits
    torch.testing.assert_close(seam, own, atol=1e-5, rtol=0)
    torch.testing.assert_close(seam, reference, atol=1e-5, rtol=0)
    assert (seam - plain).abs().max() > 1e-3  # the window hides keys on 13 tokens, so the run changes


def test_global_tokens_stay_visible_and_the_rest_is_windowed(full_and_windowed):
    ours = full_and_windowed[0]
    with torch.inference_mode():
        probs = ours(IDS, window=W, global_tokens=2, capture_attention=True).attentions
    n = IDS.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = (j <= i) & ((i - j < W) | (j < 2))
    for layer in probs:
        assert (layer[0][:, ~allowed] == 0).all()
        assert (layer[0][:, allowed] > 0).all()


def test_window_refuses_what_it_cannot_be():
    _, model = tiny.family_pair("t5-relu")
    with pytest.raises(ValueError, match="is an encoder-decoder"):
        model(IDS, window=3)
    with pytest.raises(ValueError, match="w ≥ 1"):
        tiny.family_pair("qwen3")[1](IDS, window=0)
