"""A window on an encoder (Longformer's local + global pattern): the mask is symmetric, |i − j| < w, and the first
g tokens are global both ways (they see every key, every query sees them); forward(window=w, global_tokens=g) on a
tiny BERT equals transformers' BERT given that mask as a 4-D additive attention mask, padding included."""
from __future__ import annotations

import pytest
import torch

from core import load_model
from core.attention import local_global_mask, sliding_window_mask
from tests import tiny

W, G = 3, 2
IDS = torch.tensor([[5, 17, 42, 8, 63, 21, 9, 77, 30, 11, 54, 2, 19]])


def hand_built(n: int, window: int, global_tokens: int) -> torch.Tensor:
    """The band and the global rows and columns, cell by cell."""
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            allowed[i, j] = abs(i - j) < window or i < global_tokens or j < global_tokens
    return allowed


@pytest.fixture(scope="module")
def bert_pair():
    hf = tiny.bert(mlm=False)
    return hf, load_model(tiny.save(hf), device="cpu", dtype=torch.float32)


@pytest.mark.parametrize(("window", "global_tokens"), [(1, 0), (3, 0), (3, 2), (5, 1), (20, 0)])
def test_the_encoder_mask_is_a_symmetric_band_with_global_rows_and_columns(window, global_tokens):
    n = 9
    mask = local_global_mask(n, n, window, global_tokens, bidirectional=True)
    assert torch.equal(mask, hand_built(n, window, global_tokens))
    assert torch.equal(mask, mask.T)
    # the causal one keeps its old meaning: i − j < w, later keys left to the causal mask
    causal = local_global_mask(n, n, window, global_tokens)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    assert torch.equal(causal, (i - j < window) | (j < global_tokens))
    assert torch.equal(sliding_window_mask(n, n, window, bidirectional=True), (i - j).abs() < window)


def test_the_last_queries_of_a_longer_run_keep_their_places():
    # 4 queries after 6 cached keys: rows are places 6..9 of the full mask
    full = local_global_mask(10, 10, 3, 2, bidirectional=True)
    assert torch.equal(local_global_mask(4, 10, 3, 2, bidirectional=True), full[6:])


def additive(allowed: torch.Tensor) -> torch.Tensor:
    """[1, 1, T, T] float: 0 where allowed, the float minimum elsewhere (transformers' own convention)."""
    return torch.zeros(1, 1, *allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


def test_a_windowed_bert_equals_transformers_with_the_same_mask(bert_pair):
    hf, ours = bert_pair
    n = IDS.shape[1]
    with torch.inference_mode():
        seam = ours(IDS, window=W, global_tokens=G, capture_attention=True)
        reference = hf(IDS, attention_mask=additive(hand_built(n, W, G)), output_attentions=True)
        plain = ours(IDS).hidden_states
    torch.testing.assert_close(seam.hidden_states, reference.last_hidden_state, atol=1e-5, rtol=0)
    for layer, theirs in zip(seam.attentions, reference.attentions):
        torch.testing.assert_close(layer, theirs, atol=1e-6, rtol=0)
        assert (layer[0][:, ~hand_built(n, W, G)] == 0).all()
    assert (seam.hidden_states - plain).abs().max() > 1e-3   # the window hides keys on 13 tokens


def test_a_windowed_bert_with_padding_equals_transformers(bert_pair):
    hf, ours = bert_pair
    ids = torch.cat([IDS, IDS.flip(-1)])
    padding = torch.ones_like(ids)
    padding[1, -4:] = 0                                         # the second row's last 4 tokens are padding
    n = ids.shape[1]
    allowed = hand_built(n, W, G)[None] & padding.bool()[:, None, :]     # [2, T, T]
    with torch.inference_mode():
        seam = ours(ids, attention_mask=padding, window=W, global_tokens=G).hidden_states
        reference = hf(ids, attention_mask=torch.cat([additive(a) for a in allowed])).last_hidden_state
    real = padding.bool()
    torch.testing.assert_close(seam[real], reference[real], atol=1e-5, rtol=0)


def test_a_window_on_an_encoder_decoder_is_refused():
    _, model = tiny.family_pair("t5-relu")
    with pytest.raises(ValueError, match="is an encoder-decoder"):
        model(IDS, window=3)
