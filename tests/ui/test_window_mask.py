"""The window demo's service on a tiny model of every decoder family: the windowed run's weights read only the
window (and the global keys), the KL is 0 where the window hides nothing and equals the definition elsewhere, the
cost is counted from the masks, and a family's own window is reproduced by the demo's."""
from __future__ import annotations

import pytest
import torch

from tests import tiny
from ui.services.masks import attention_cost, local_global_mask, own_window_check, window_effect

IDS = [5, 17, 42, 8, 63, 21, 9, 77, 30, 11, 54, 2, 19]
W, G = 3, 2
WINDOWED = ("mistral-window", "qwen3-window", "phi3-window", "gemma2", "gemma3")


@pytest.mark.parametrize("name", list(tiny.FAMILY_DECODERS))
def test_window_effect_on_every_decoder_family(name):
    model = tiny.family_pair(name)[1]
    layer, head, n = 1, 1, len(IDS)
    result = window_effect(model, IDS, layer, head, W, G)
    mask = local_global_mask(n, W, G).numpy()
    full, windowed = result["weights"]
    assert (windowed[~mask] == 0).all() and (abs(windowed.sum(-1) - 1) < 1e-5).all()
    assert (full[~result["own_mask"]] == 0).all()
    # positions 0..W+G−1 see every earlier key under the window too: the same distribution, KL 0
    kl = result["kl"]
    assert abs(kl[:W + G]).max() < 1e-5 and kl[W + G:].max() > 1e-4
    with torch.inference_mode():
        batch = torch.tensor([IDS])
        p = torch.log_softmax(model(batch).logits.float(), -1)[0]
        q = torch.log_softmax(model(batch, window=W, global_tokens=G).logits.float(), -1)[0]
    torch.testing.assert_close(torch.tensor(kl), (p.exp() * (p - q)).sum(-1), atol=1e-5, rtol=1e-4)
    cost = result["cost"]
    assert cost["per_layer"]["full"][layer] == int(result["own_mask"].sum()) and cost["per_layer"]["windowed"][layer] <= int(mask.sum())
    check = own_window_check(model, IDS)
    assert (check is not None) == (name in WINDOWED)
    if check is not None:
        assert check["mask_equal"] and check["reproduced"]
        assert (check["full_layer"] is None) == (name in ("mistral-window", "phi3-window"))


def test_cost_is_counted_from_the_masks():
    cfg = tiny.family_pair("qwen3")[1].config          # every layer full: T(T+1)/2 scores a head
    n = 10
    cost = attention_cost(cfg, n, 3, 1, 2)
    # query i reads min(i + 1, 3) window keys, plus key 0 when it lies outside them (i ≥ 3)
    per_head = sum(min(i + 1, 3) + (i >= 3) for i in range(n))
    assert cost["per_layer"] == {"full": [55] * cfg.n_layers, "windowed": [per_head] * cfg.n_layers}
    assert cost["scores"] == (55 * cfg.n_layers * cfg.n_heads, per_head * cfg.n_layers * cfg.n_heads)
    assert cost["bytes"] == (2 * cost["scores"][0], 2 * cost["scores"][1])


@pytest.fixture(scope="module")
def tiny_bert():
    hf = tiny.bert(mlm=False)
    from core import load_model

    return load_model(tiny.save(hf), device="cpu", dtype=torch.float32)


def test_window_effect_on_an_encoder_is_symmetric_and_measures_the_output(tiny_bert):
    model, layer, head, n = tiny_bert, 1, 2, len(IDS)
    result = window_effect(model, IDS, layer, head, W, G)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    expected = ((i - j).abs() < W) | (j < G) | (i < G)
    assert (result["mask"] == expected.numpy()).all() and not result["causal"] and result["own_mask"].all()
    full, windowed = result["weights"]
    assert (windowed[~expected.numpy()] == 0).all() and (windowed[expected.numpy()] > 0).all()
    assert (full > 0).all() and result["kl"] is None
    with torch.inference_mode():
        batch = torch.tensor([IDS])
        h = model(batch).hidden_states[0]
        hw = model(batch, window=W, global_tokens=G).hidden_states[0]
    change = ((hw - h).norm(dim=-1) / h.norm(dim=-1)).numpy()
    assert abs(result["change"] - change).max() < 1e-5 and change.min() > 1e-4
    cosine = float(h.mean(0) @ hw.mean(0) / (h.mean(0).norm() * hw.mean(0).norm()))
    assert result["cosine"] == pytest.approx(cosine, abs=1e-6) and result["cosine"] < 1 - 1e-6
    cost = result["cost"]
    assert cost["per_layer"] == {"full": [n * n] * 2, "windowed": [int(expected.sum())] * 2}
    assert cost["dense"] == n * n * model.config.n_heads * 2 * 4


def test_a_window_wider_than_the_text_changes_nothing_on_an_encoder(tiny_bert):
    result = window_effect(tiny_bert, IDS, 0, 0, len(IDS), 0)
    assert result["mask"].all() and abs(result["change"]).max() < 1e-5
    assert result["cosine"] == pytest.approx(1.0, abs=1e-6)


def test_the_service_mask_is_the_models_own():
    n = 9
    assert torch.equal(local_global_mask(n, 3, 2, causal=False), local_global_mask(n, 3, 2, causal=False).T)
    causal = local_global_mask(n, 3, 2)
    assert not causal.triu(1).any() and torch.equal(causal, causal & local_global_mask(n, 3, 2, causal=False))
