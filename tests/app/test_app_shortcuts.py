"""The shortcut endpoints through gradio_client, on tiny random models: `shortcut_report` draws the core's exact
effects against each method's estimates with ρ, overlap and cost in the titles and the warning in the note;
`approximate_sweep` returns the core's estimated map and its CSV; an encoder, an over-long prompt and the flow
graph on the residual stream are answered in words."""

from __future__ import annotations

import csv
import json
import os

import pytest
import torch

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402

from core.analysis import patching, shortcuts  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app, plotly_array  # noqa: E402
from ui.services.patching import MAX_PATCH_TOKENS, prepare_pair  # noqa: E402

CLEAN, CORRUPTED = "the bread is warm and the lamp", "the bread is warm and the shop"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("shortcut-app-models")
    llama, bert = str(build_tiny_llama(root / "tiny-llama")), str(build_tiny_bert(root / "tiny-bert"))
    demo, url, services = launch_app([llama, bert], llama)
    yield dict(llama=llama, bert=bert, model=services.models.get(llama), client=Client(url, verbose=False),
               demo=demo)
    demo.close()


def test_shortcut_report_draws_the_cores_exact_effects_against_each_method(served):
    model, client = served["model"], served["client"]
    pair = prepare_pair(model, CLEAN, CORRUPTED, "", "")
    clean, corrupted = pair.ids
    note, figure = client.predict(served["llama"], CLEAN, CORRUPTED, "", "", "z", "denoise",
                                  api_name="/shortcut_report")
    assert "can look right and still rank the wrong heads" in note and "k = " in note
    truth = patching.patch_sweep(model, clean, corrupted, pair.answer, pair.foil, "z", "denoise")
    cells = shortcuts.changed_cells(model, clean, corrupted, "z").flatten()
    data = json.loads(figure["plot"])
    points = [t for t in data["data"] if t["mode"] == "markers"]
    assert [t["name"] for t in points] == list(shortcuts.METHODS)
    torch.testing.assert_close(torch.tensor(plotly_array(points[0]["x"]), dtype=torch.float32),
                               truth.scores.flatten()[cells], atol=1e-5, rtol=0)
    atp = shortcuts.approximate_sweep(model, clean, corrupted, pair.answer, pair.foil, "z", "denoise", "atp")
    torch.testing.assert_close(torch.tensor(plotly_array(points[0]["y"]), dtype=torch.float32),
                               atp.scores.flatten()[cells], atol=1e-5, rtol=0)
    assert all(name.startswith("L") and " H" in name for name in points[0]["customdata"])
    titles = [a["text"] for a in data["layout"]["annotations"] if a.get("name") != "title"]
    assert len(titles) == 4 and all("ρ " in t and "overlap" in t and "passes" in t for t in titles)


def test_approximate_sweep_returns_the_cores_map_and_its_csv(served):
    model, client = served["model"], served["client"]
    pair = prepare_pair(model, CLEAN, CORRUPTED, "", "")
    clean, corrupted = pair.ids
    note, figure, path = client.predict(served["llama"], CLEAN, CORRUPTED, "", "", "resid_pre", "noise", "atp",
                                        api_name="/approximate_sweep")
    expected = shortcuts.approximate_sweep(model, clean, corrupted, pair.answer, pair.foil, "resid_pre", "noise")
    heatmap = next(t for t in json.loads(figure["plot"])["data"] if t["type"] == "heatmap")
    torch.testing.assert_close(torch.tensor(plotly_array(heatmap["z"]), dtype=torch.float32), expected.scores)
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(line for line in f if not line.startswith("#")))
    assert len(rows) == 1 + model.config.n_layers
    assert float(rows[1][-1]) == pytest.approx(expected.scores[0, -1].item(), abs=1e-5)
    assert "AtP" in note


def test_what_the_shortcuts_cannot_measure_is_answered_in_words(served):
    client = served["client"]
    note, _ = client.predict(served["bert"], CLEAN, CORRUPTED, "", "", "z", "denoise", api_name="/shortcut_report")
    assert "decoder" in note
    long = "the bread is warm " * MAX_PATCH_TOKENS
    note, _, path = client.predict(served["llama"], long, long, "", "", "z", "denoise", "atp",
                                   api_name="/approximate_sweep")
    assert f"at most {MAX_PATCH_TOKENS} tokens" in note and path is None
    note, _, _ = client.predict(served["llama"], CLEAN, CORRUPTED, "", "", "resid_pre", "denoise", "flow",
                                api_name="/approximate_sweep")
    assert "Method" in note and "resid_pre" in note


def test_both_endpoints_are_named_and_queued_apart_from_the_short_events(served):
    names = set(served["client"].view_api(return_format="dict", print_info=False)["named_endpoints"])
    assert {"/shortcut_report", "/approximate_sweep"} <= names
    fns = {fn.api_name: fn for fn in served["demo"].fns.values() if fn.api_name}
    assert fns["shortcut_report"].queue and fns["approximate_sweep"].queue
    assert fns["shortcut_report"].concurrency_id == fns["patch_sweep"].concurrency_id       # a heavy job
    assert fns["approximate_sweep"].concurrency_id == fns["flow_graph"].concurrency_id      # a few passes
