"""The Masks tab's `window_mask` endpoint through gradio_client: a sliding window and a local + global mask run on
the loaded model, its figures holding the run's own numbers (mask, one head's weights, KL per position, the cost
counted), a family's own window said and reproduced, an encoder's window symmetric and measured on its output,
and bad settings named in the note."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402

from tests import tiny  # noqa: E402
from tests.ui.test_families_in_app import char_tokenizer  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app, plotly_array  # noqa: E402

TEXT = "The lighthouse keeper rowed out to the rocks at dawn. When the storm passed, she lit the lamp again."
W, G, LAYER, HEAD = 4, 2, 1, 2


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("window-models")
    llama, bert = str(build_tiny_llama(root / "tiny-llama")), str(build_tiny_bert(root / "tiny-bert"))
    gemma2 = root / "gemma2"
    hf = tiny.family_pair("gemma2")[0]
    tiny.save(hf, str(gemma2))
    char_tokenizer(hf.config).save_pretrained(gemma2)
    demo, url, services = launch_app([llama, bert, str(gemma2)], llama)
    yield dict(llama=llama, bert=bert, gemma2=str(gemma2), services=services, client=Client(url, verbose=False))
    demo.close()


def traces(plot: dict) -> list[dict]:
    return json.loads(plot["plot"])["data"]


def test_window_mask_shows_the_runs_own_numbers(served):
    note, mask, weights, kl, cost, words = served["client"].predict(served["llama"], TEXT, LAYER, HEAD, W, G,
                                                                     api_name="/window_mask")
    model = served["services"].models.get(served["llama"])
    ids = torch.tensor([model.tokenizer(TEXT).input_ids])
    n = ids.shape[1]
    assert f"{n} tokens, window w = {W} + {G} global tokens" in note
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = (j <= i) & ((i - j < W) | (j < G))
    z = plotly_array(traces(mask)[0]["z"]).astype(np.float64)
    assert np.isnan(z[j > i]).all() and (z[allowed] == 1).all() and (z[(j <= i) & ~allowed] == 0).all()
    with torch.inference_mode():
        full = model(ids, capture_attention=True)
        windowed = model(ids, capture_attention=True, window=W, global_tokens=G)
    panels = [plotly_array(t["z"]).astype(np.float64) for t in traces(weights)]
    causal = j <= i
    np.testing.assert_allclose(panels[0][causal], full.attentions[LAYER][0, HEAD].numpy()[causal], atol=1e-5)
    np.testing.assert_allclose(panels[1][causal], windowed.attentions[LAYER][0, HEAD].numpy()[causal], atol=1e-5)
    np.testing.assert_allclose(panels[2][causal], (panels[1] - panels[0])[causal], atol=1e-5)
    assert (panels[1][causal & ~allowed] == 0).all()
    p, q = torch.log_softmax(full.logits[0], -1), torch.log_softmax(windowed.logits[0], -1)
    expected = (p.exp() * (p - q)).sum(-1).numpy()
    shown = plotly_array(traces(kl)[0]["y"])
    np.testing.assert_allclose(shown, expected, atol=1e-5)
    assert f"mean {expected.mean():.4f} nats over {n} positions" in words
    bars = {t["name"]: plotly_array(t["y"]) for t in traces(cost)}
    assert list(bars["full"]) == [n * (n + 1) // 2] * 2 and list(bars["windowed"]) == [int(allowed.sum())] * 2
    scores = 2 * model.config.n_heads * np.array([n * (n + 1) // 2, allowed.sum()])
    assert f"{scores[0]:,} scores with the model's own masks and {scores[1]:,} with the window" in words
    assert "has no window of its own" in words


def test_a_familys_own_window_is_said_and_reproduced(served):
    out = served["client"].predict(served["gemma2"], "the lamp at dawn, the lamp at dusk.", 1, 0, 4, 0,
                                   api_name="/window_mask")
    words = out[-1]
    assert re.search(r"has its own window of 4 keys on 2 of its 4 layers", words)
    assert "so the demo's window is the family's own (eq. 6.5)" in words


def test_the_window_on_an_encoder_is_symmetric_and_measured_on_its_output(served):
    note, mask, weights, change, cost, words = served["client"].predict(served["bert"], TEXT, LAYER, HEAD, W, G,
                                                                         api_name="/window_mask")
    model = served["services"].models.get(served["bert"])
    ids = torch.tensor([model.tokenizer(TEXT).input_ids])
    n = ids.shape[1]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = (np.abs(i - j) < W) | (j < G) | (i < G)
    z = plotly_array(traces(mask)[0]["z"]).astype(np.float64)
    assert (z[allowed] == 1).all() and (z[~allowed] == 0).all() and "symmetric" in note
    with torch.inference_mode():
        h = model(ids).hidden_states[0]
        hw = model(ids, window=W, global_tokens=G).hidden_states[0]
    shown = plotly_array(traces(change)[0]["y"])
    np.testing.assert_allclose(shown, ((hw - h).norm(dim=-1) / h.norm(dim=-1)).numpy(), atol=1e-5)
    cosine = float(h.mean(0) @ hw.mean(0) / (h.mean(0).norm() * hw.mean(0).norm()))
    assert f"cosine {cosine:.4f}" in words
    bars = {t["name"]: plotly_array(t["y"]) for t in traces(cost)}
    assert list(bars["full"]) == [n * n] * 2 and list(bars["windowed"]) == [int(allowed.sum())] * 2


@pytest.mark.parametrize(("model", "window", "glob", "message"), [
    ("llama", 0, 0, "Window w must be between 1 and 256, got 0"),
    ("llama", 4, -1, "Global tokens g must be between 0 and 256, got -1"),
    ("bert", 4, 300, "Global tokens g must be between 0 and 256, got 300"),
])
def test_bad_settings_are_named_in_the_note(served, model, window, glob, message):
    note, *figures, words = served["client"].predict(served[model], TEXT, 0, 0, window, glob,
                                                     api_name="/window_mask")
    assert note.startswith("⚠️ The window demo did not run") and message in note and words == ""
    for plot in figures:   # each figure in its stated empty state
        assert not traces(plot) and "Not computed" in plot["plot"]
