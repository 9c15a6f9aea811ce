"""The Patching tab's endpoints through gradio_client, on tiny random models: the sweep's numbers are the core's,
logit attribution adds up, the flow graph's data is its kept edges, and every pair the tab cannot measure is
answered in the note (different token counts side by side, an answer of several tokens, an encoder)."""

from __future__ import annotations

import csv
import json
import os
import re

import pytest
import torch

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from core.analysis import patching  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app, plotly_array  # noqa: E402
from ui import links  # noqa: E402

CLEAN, CORRUPTED = "the bread is warm and the lamp", "the bread is warm and the shop"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("patching-models")
    llama, bert = str(build_tiny_llama(root / "tiny-llama")), str(build_tiny_bert(root / "tiny-bert"))
    demo, url, services = launch_app([llama, bert], llama)
    yield dict(llama=llama, bert=bert, model=services.models.get(llama), client=Client(url, verbose=False))
    demo.close()


def ids_of(model, text):
    return torch.tensor([model.tokenizer(text).input_ids])


def csv_rows(path):
    with open(path, encoding="utf-8") as f:
        return list(csv.reader(line for line in f if not line.startswith("#")))


def test_the_sweep_endpoint_shows_the_cores_numbers(served):
    model, client = served["model"], served["client"]
    clean, corrupted = ids_of(model, CLEAN), ids_of(model, CORRUPTED)
    assert clean.shape == corrupted.shape, "the test's pair must have one token count"
    with torch.inference_mode():
        answer = int(model(clean).logits[0, -1].argmax())
        ranked = model(corrupted).logits[0, -1].topk(2).indices.tolist()
    foil = ranked[1] if ranked[0] == answer else ranked[0]
    expected = patching.patch_sweep(model, clean, corrupted, answer, foil, "resid_pre")
    note, figure, path = client.predict(served["llama"], CLEAN, CORRUPTED, "", "", "resid_pre", "denoise", 0,
                                        api_name="/patch_sweep")
    assert f"**{expected.clean_metric:+.3f}** on the clean prompt" in note
    assert f"**{expected.corrupted_metric:+.3f}** on the corrupted one" in note
    heatmap = next(t for t in json.loads(figure["plot"])["data"] if t["type"] == "heatmap")
    torch.testing.assert_close(torch.tensor(plotly_array(heatmap["z"]), dtype=torch.float32), expected.scores)
    rows = csv_rows(path)
    assert rows[0][0] == "layer \\ position" and len(rows) == 1 + model.config.n_layers
    assert float(rows[1][-1]) == pytest.approx(expected.scores[0, -1].item(), abs=1e-5)
    # one layer's heads × positions, noising
    note, figure, path = client.predict(served["llama"], CLEAN, CORRUPTED, "", "", "z_by_position", "noise", 1,
                                        api_name="/patch_sweep")
    assert "of layer 1" in note
    assert len(csv_rows(path)) == 1 + model.config.n_heads


def test_a_pair_the_tab_cannot_measure_is_answered_in_the_note(served):
    client = served["client"]
    note, figure, path = client.predict(served["llama"], CLEAN, "the bread", "", "", "z", "denoise", 0,
                                        api_name="/patch_sweep")
    assert "same number of tokens" in note and "| position | clean | corrupted |" in note
    assert path is None
    assert re.search(r"\| 3 \| war \|\s+\|", note), note      # the clean token beside an empty cell
    note, _, _ = client.predict(served["llama"], CLEAN, CORRUPTED, " lighthouse keeper", "", "z", "denoise", 0,
                                api_name="/patch_sweep")
    assert "Answer must be one token" in note and "splits into" in note
    note, _, _ = client.predict(served["bert"], CLEAN, CORRUPTED, "", "", "z", "denoise", 0, api_name="/patch_sweep")
    assert "encoder" in note and "predicts no next token" in note
    note, _, _ = client.predict(served["llama"], "<img src=x onerror=alert(1)>", CORRUPTED, "", "", "z", "denoise", 0,
                                api_name="/patch_sweep")
    assert "<" not in note and "&lt;" in note   # the markup is listed token by token, as text


@pytest.mark.parametrize("args,words", [
    (("bogus", "denoise", 0), "What to patch: .*not in the list of choices"),
    (("z", "both", 0), "Direction: .*not in the list of choices"),
    (("z_by_position", "denoise", 99), "Layer"),
    (("z", ["denoise"], 0), "choose one value"),
])
def test_bad_settings_get_a_message_naming_the_field(served, args, words):
    with pytest.raises(AppError, match=words):
        served["client"].predict(served["llama"], CLEAN, CORRUPTED, "", "", *args, api_name="/patch_sweep")


def test_logit_attribution_endpoint_adds_up(served):
    note, figure, path = served["client"].predict(served["llama"], CLEAN, CORRUPTED, "", "",
                                                  api_name="/logit_attribution")
    found = re.search(r"sum \*\*([+-][\d.]+)\*\*, the model's own difference \*\*([+-][\d.]+)\*\*", note)
    assert found and found.group(1) == found.group(2), note
    rows = csv_rows(path)
    parts = {name: float(value) for name, value in rows[1:]}
    total = parts.pop("total")
    assert sum(parts.values()) == pytest.approx(total, abs=1e-4)


def test_flow_graph_endpoint_keeps_edges_above_the_threshold(served):
    client = served["client"]
    note, figure, path = client.predict(served["llama"], CLEAN, 0.02, api_name="/flow_graph")
    rows = csv_rows(path)
    assert rows[0][:3] == ["kind", "layer", "head"]
    assert rows[1:] and all(float(r[-1]) >= 0.02 for r in rows[1:])
    assert f"**{len(rows) - 1} edges**" in note
    _, _, higher = client.predict(served["llama"], CLEAN, 0.2, api_name="/flow_graph")
    assert len(csv_rows(higher)) <= len(rows)
    with pytest.raises(AppError, match="Threshold"):
        client.predict(served["llama"], CLEAN, 3.0, api_name="/flow_graph")


def test_a_link_carries_both_prompts_when_short():
    url, note = links.make("http://h/", "m", "patching", 2, None, CLEAN, CORRUPTED)
    assert "tab=patching" in url and "layer=2" in url and "corrupted=the+bread" in url and not note
    state = links.parse({"tab": "patching", "text": CLEAN, "corrupted": CORRUPTED}, ["m"], lambda _: (2, 4), "m")
    assert (state.tab, state.text, state.corrupted, state.messages) == ("patching", CLEAN, CORRUPTED, [])
    _, note = links.make("http://h/", "m", "patching", 0, None, CLEAN, "x" * 700)
    assert "corrupted prompt is longer" in note
