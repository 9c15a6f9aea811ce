"""The sink endpoints through gradio_client, on tiny random models: `sink_scores` draws the core's attention on
token 0 per layer × head (an encoder's [CLS] and [SEP] beside it) with the share of heads above ε in the note;
`streaming_perplexity` draws the core's loss per position through the window beside full attention; an encoder, a
window out of range and a text over the limit are answered in words; the map is a short event, the window a heavy
job."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402

from core.analysis.sinks import sink_scores, streaming_perplexity  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app, plotly_array  # noqa: E402
from ui.services.sinks import EPSILON, MAX_STREAMING_TOKENS  # noqa: E402
from ui.services.text import encode  # noqa: E402

TEXT = "The keeper lit the lamp. The keeper lit the lamp again at dawn, and the boats came home. " * 3


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("sinks-app-models")
    llama, bert = str(build_tiny_llama(root / "tiny-llama")), str(build_tiny_bert(root / "tiny-bert"))
    demo, url, services = launch_app([llama, bert], llama)
    yield dict(llama=llama, bert=bert, services=services, client=Client(url, verbose=False), demo=demo)
    demo.close()


def traces(figure: dict, kind: str) -> list[dict]:
    return [t for t in json.loads(figure["plot"])["data"] if t["type"] == kind]


def test_sink_scores_draws_the_cores_attention_on_the_first_token(served):
    model = served["services"].models.get(served["llama"])
    note, figure = served["client"].predict(served["llama"], TEXT, api_name="/sink_scores")
    ids = encode(model, TEXT).ids
    first = sink_scores(model, [torch.tensor(ids)]).first.mean.numpy()
    (tiles,) = traces(figure, "heatmap")
    np.testing.assert_allclose(plotly_array(tiles["z"]), first.T, atol=1e-6)
    above = int((first > EPSILON).sum())
    assert f"**{above} of {first.size} heads ({above / first.size:.0%})**" in note
    assert f"queries 1–{len(ids) - 1}" in note


def test_an_encoders_sink_map_has_cls_and_sep(served):
    model = served["services"].models.get(served["bert"])
    note, figure = served["client"].predict(served["bert"], TEXT, api_name="/sink_scores")
    scores = sink_scores(model, [torch.tensor(encode(model, TEXT).ids)])
    cls, sep = traces(figure, "heatmap")
    np.testing.assert_allclose(plotly_array(cls["z"]), scores.first.mean.numpy().T, atol=1e-6)
    np.testing.assert_allclose(plotly_array(sep["z"]), scores.sep.mean.numpy().T, atol=1e-6)
    assert "[CLS]" in note and "[SEP]" in note


def test_streaming_perplexity_draws_the_cores_loss_through_the_window(served):
    model = served["services"].models.get(served["llama"])
    note, figure = served["client"].predict(served["llama"], TEXT, 8, 2, "cache", api_name="/streaming_perplexity")
    ids = torch.tensor(encode(model, TEXT).ids)
    run = streaming_perplexity(model, ids, 8, 2, "cache")
    full = streaming_perplexity(model, ids, len(ids), 0, "text")
    windowed, whole = traces(figure, "scatter")
    np.testing.assert_allclose(plotly_array(windowed["y"]), run.loss.numpy(), atol=1e-5)
    np.testing.assert_allclose(plotly_array(whole["y"]), full.loss.numpy(), atol=1e-5)
    assert f"**Perplexity {run.perplexity:.2f}**" in note and "renumbered inside the cache" in note


def test_what_the_window_cannot_read_is_answered_in_words(served):
    client = served["client"]
    note, figure = client.predict(served["bert"], TEXT, 8, 2, "text", api_name="/streaming_perplexity")
    assert "encoder" in note and not json.loads(figure["plot"])["data"]
    note, _ = client.predict(served["llama"], TEXT, 0, 2, "text", api_name="/streaming_perplexity")
    assert f"Window must be between 1 and {MAX_STREAMING_TOKENS}" in note
    note, _ = client.predict(served["llama"], "the lamp " * MAX_STREAMING_TOKENS, 8, 2, "text",
                             api_name="/streaming_perplexity")
    assert f"at most {MAX_STREAMING_TOKENS:,} tokens" in note


def test_both_endpoints_are_named_and_the_window_is_a_heavy_job(served):
    names = set(served["client"].view_api(return_format="dict", print_info=False)["named_endpoints"])
    assert {"/sink_scores", "/streaming_perplexity"} <= names
    fns = {fn.api_name: fn for fn in served["demo"].fns.values() if fn.api_name}
    assert fns["sink_scores"].queue and fns["streaming_perplexity"].queue
    assert fns["streaming_perplexity"].concurrency_id == fns["patch_sweep"].concurrency_id  # a heavy job
    assert fns["sink_scores"].concurrency_id == fns["head_atlas"].concurrency_id            # one pass
