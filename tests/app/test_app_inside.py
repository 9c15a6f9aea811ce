"""The Inside tab's endpoints through gradio_client, on tiny random models: every stage's figure holds the pass's
own numbers, the .npz has every stage, a score's parts add up to it, and bad settings are named."""

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
from gradio_client.exceptions import AppError  # noqa: E402

from core.analysis import anatomy  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app, plotly_array  # noqa: E402
from ui import links  # noqa: E402

TEXT = "the bread is warm and the lamp"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("inside-models")
    llama, bert = str(build_tiny_llama(root / "tiny-llama")), str(build_tiny_bert(root / "tiny-bert"))
    demo, url, services = launch_app([llama, bert], llama)
    yield dict(llama=llama, bert=bert, services=services, client=Client(url, verbose=False),
               model=services.models.get(llama))
    demo.close()


def traces(plot: dict) -> list[dict]:
    return json.loads(plot["plot"])["data"]


def test_the_walk_shows_the_passes_own_numbers_stage_by_stage(served):
    model = served["services"].models.get(served["llama"])
    ids = torch.tensor([model.tokenizer(TEXT).input_ids])
    expected = anatomy.forward_stages(model, ids, 1, 2)
    result = served["client"].predict(served["llama"], TEXT, 1, 2, -1, 1.0, 5, 0.9, api_name="/forward_walk")
    overview, *stages, npz = result
    assert len(stages) == 16 and f"{ids.shape[1]} tokens through layer 1, head 2" in overview
    notes, figures = stages[0::2], stages[1::2]
    # stage 3: q, k, v of head 2 and its key/value head, shared under GQA
    qkv = [t for t in traces(figures[2]) if t["type"] == "heatmap"]
    np.testing.assert_allclose(plotly_array(qkv[0]["z"]), expected.q.numpy(), atol=1e-5)
    np.testing.assert_allclose(plotly_array(qkv[2]["z"]), expected.v.numpy(), atol=1e-5)
    assert f"read key/value head {expected.kv_head}" in notes[2]
    # stage 5: the softmax panel is the pass's weights, and the note's variance is measured
    softmax = [t for t in traces(figures[4]) if t["type"] == "heatmap"][-1]
    np.testing.assert_allclose(plotly_array(softmax["z"]), expected.probs.numpy(), atol=1e-5)
    variance = float(expected.scores[expected.mask].var())
    assert f"**{variance:.1f}** with d_k = {expected.q.shape[-1]}" in notes[4]
    # stage 8: top-k 5 keeps at most 5 tokens, and the bars are the temperature-1 distribution
    assert re.search(r"\b[1-5] tokens survive top-k and top-p", notes[7]), notes[7]
    probs = torch.softmax(expected.logits[-1], -1).topk(10).values.numpy()
    np.testing.assert_allclose(plotly_array(traces(figures[7])[0]["x"]), probs, atol=1e-5)
    saved = np.load(npz)
    for name in ("embeddings", "q", "k_unrotated", "probs", "mlp_gate", "mlp_hidden", "logits"):
        np.testing.assert_allclose(saved[name], getattr(expected, name).numpy(), atol=1e-6, err_msg=name)


def test_a_scores_parts_add_up_and_the_geometry_is_drawn(served):
    client = served["client"]
    note, decomposition, lines = client.predict(served["llama"], TEXT, 1, 0, -1, 2, api_name="/score_anatomy")
    found = re.search(r"is \*\*([+-][\d.]+)\*\*.*add up to \*\*([+-][\d.]+)\*\*", note)
    assert found and found.group(1) == found.group(2), note
    names = [t["name"] for t in traces(lines)]
    assert names == ["the score (after RoPE)", "without the rotation (content alone)",
                     "what the rotation adds (position)"]
    # split by heads, against the query's mean key: the two sides' bars each add up to the relative score
    note, bars, _ = client.predict(served["llama"], TEXT, 1, 0, -1, 2, "heads", True, api_name="/score_anatomy")
    relative = float(re.search(r"is \*\*([+-][\d.]+)\*\*", note).group(1))
    sides = traces(bars)
    assert len(sides) == 2 and "mean over its keys" in note
    for side in sides:
        assert sum(plotly_array(side["x"])) == pytest.approx(relative, abs=2e-3)
    assert any(label.startswith("L0 H") for side in sides for label in side["y"])
    note, scatter = client.predict(served["llama"], TEXT, 1, 0, api_name="/qk_geometry")
    assert [t["name"] for t in traces(scatter)] == ["queries", "keys"] and "variance" in note
    # an encoder without an LM head: the walk ends at the stack's output, and says so
    result = client.predict(served["bert"], TEXT, 0, 0, 2, 1.0, 0, 1.0, api_name="/forward_walk")
    assert "no LM head" in result[1 + 2 * 7]


def test_qk_attribution_gives_the_cores_split_as_numbers(served):
    """The API-only `qk_attribution`: the core's qk_attribution matrix and labels for the same pair, which add up
    to the score (or to the relative score, beside the plain one); bad input answered in words."""
    from core.analysis import qk

    client, model = served["client"], served["model"]
    ids = torch.tensor([model.tokenizer(TEXT).input_ids])
    last = ids.shape[1] - 1
    for relative in (False, True):
        found = client.predict(served["llama"], TEXT, 1, 0, -1, 2, "heads", relative, api_name="/qk_attribution")
        core = qk.qk_attribution(model, ids, 1, 0, last, 2, by="head", relative=relative)
        assert found["query"] == last and found["key"] == 2 and found["relative"] is relative
        assert found["query_labels"] == core.query_labels and found["key_labels"] == core.key_labels
        np.testing.assert_allclose(found["matrix"], core.matrix.numpy(), atol=1e-6)
        assert np.sum(found["matrix"]) == pytest.approx(found["score"], abs=1e-4)
        assert ("pair_score" in found) is relative
    by_layer = client.predict(served["llama"], TEXT, 1, 0, -1, 2, "layers", False, api_name="/qk_attribution")
    assert "L0 attn" in by_layer["query_labels"] and np.sum(by_layer["matrix"]) == pytest.approx(found["pair_score"],
                                                                                                   abs=1e-4)
    with pytest.raises(AppError, match="Split the score by must be one of"):
        client.predict(served["llama"], TEXT, 1, 0, -1, 2, "tokens", False, api_name="/qk_attribution")


@pytest.mark.parametrize("args,words", [
    ((9, 0, -1, 1.0, 0, 1.0), "Layer must be between 0 and 1"),
    ((0, 9, -1, 1.0, 0, 1.0), "Head must be between 0 and 3"),
    ((0, 0, 99, 1.0, 0, 1.0), "Token to follow must be between -1 and"),
    ((0, 0, -1, 3.0, 0, 1.0), "Temperature"),
])
def test_bad_settings_are_named(served, args, words):
    with pytest.raises(AppError, match=words):
        served["client"].predict(served["llama"], TEXT, *args, api_name="/forward_walk")


def test_a_link_opens_the_tab_on_a_token():
    url, _ = links.make("http://h/", "m", "inside", 1, 2, TEXT, None, 3)
    assert "tab=inside" in url and "layer=1" in url and "head=2" in url and "token=3" in url
    state = links.parse({"tab": "inside", "token": "3", "layer": "1"}, ["m"], lambda _: (2, 4), "m")
    assert (state.tab, state.token, state.layer, state.messages) == ("inside", 3, 1, [])


def test_no_note_names_a_server_folder(served):
    """The tiny model is a folder under the temporary directory: the notes name it as public_text does."""
    import tempfile

    result = served["client"].predict(served["llama"], TEXT, 0, 0, -1, 1.0, 0, 1.0, api_name="/forward_walk")
    notes = [value for value in result if isinstance(value, str) and " " in value]
    assert notes and not any(tempfile.gettempdir() + "/" in note for note in notes)
