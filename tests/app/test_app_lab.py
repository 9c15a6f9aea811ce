"""The Lab tab's endpoints through gradio_client, on the real app (ui.page.build_page with app.launch_options, as
tests/app/test_app_api.py launches it) with a tiny random Llama as the page's model and a temporary weights folder.

Tiny configs (1 layer, d_model 32, 20 steps) keep every run under a few seconds."""

from __future__ import annotations

import json
import os
import time

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402

# task, family, layers, d_model, heads, d_ff, dropout, positions, norm, causal mask, 1/√d_k, seed, steps, lr
TINY = ["reverse", "marian", 1, 32, 2, 64, 0.0, "default", "default", True, True, 0, 20, 3e-3]
LAB_ENV = {"ATTN_LAB_EVAL_EXAMPLES": "16", "ATTN_LAB_JOBS": "2"}


def fields(**kw):
    names = ["task", "family", "layers", "d_model", "heads", "d_ff", "dropout", "positions", "norm", "causal", "scale",
             "seed", "steps", "lr"]
    values = dict(zip(names, TINY))
    values.update(kw)
    return [values[n] for n in names]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-app")
    weights = root / "weights"
    with pytest.MonkeyPatch.context() as patch:  # the settings hold for the module, then go back
        for name, value in {**LAB_ENV, "ATTN_WEIGHTS_DIR": str(weights)}.items():
            patch.setenv(name, value)
        llama = str(build_tiny_llama(root / "tiny-llama"))
        demo, url, services = launch_app([llama], llama)
        yield demo, url, weights, services.models
        demo.close()


@pytest.fixture(scope="module")
def client(server):
    return Client(server[1], verbose=False)


@pytest.fixture(scope="module")
def trained(client):
    """One tiny run of this client's session, streamed: every output the stream sent."""
    job = client.submit(*fields(), "10, 20", api_name="/train")
    job.result(timeout=120)
    return job.outputs()


def test_the_lab_endpoints_are_named_and_queued(server, client):
    names = set(client.view_api(return_format="dict", print_info=False)["named_endpoints"])
    assert {"/train", "/compare", "/stop_training", "/lab_runs", "/lab_attention", "/save_run"} <= names
    fns = {fn.api_name: fn for fn in server[0].fns.values() if fn.api_name}
    for name in ("train", "compare", "lab_attention"):
        assert fns[name].queue and isinstance(fns[name].concurrency_limit, int), name


def test_train_streams_steps_losses_and_exact_match_and_ends_with_the_run_id(trained):
    assert len(trained) >= 2
    status, curves, snapshots, latest, run_id = trained[-1]
    assert run_id == "run1" and "done, step 20 / 20" in status
    run = latest["runs"][0]
    assert latest["done"] and run["step"] == 20 and run["eval_step"] == 20
    assert run["train_loss"] > 0 and run["held_loss"] > 0 and 0 <= run["exact_match"] <= 1 and run["tokens_per_s"] > 0
    assert trained[0][4] == "" and trained[0][3]["done"] is False  # the first update comes before the run ends
    figure = json.loads(curves["plot"])
    names = [t["name"] for t in figure["data"]]
    assert names[0] == "run1 reverse, marian: training" and "run1 reverse, marian: held-out" in names
    shots = json.loads(snapshots["plot"])
    assert shots["layout"]["meta"]["rows"] == ["step 10", "step 20"] and shots["layout"]["meta"]["cols"] == ["layer 0"]


def test_lab_runs_lists_the_session_runs(client, trained):
    table, findings = client.predict(api_name="/lab_runs")
    assert table["headers"][:3] == ["run", "label", "task"]
    row = table["data"][0]
    assert row[0] == "run1" and row[5] == "done" and row[4] == 20
    assert Client(client.src, verbose=False).predict(api_name="/lab_runs")[0]["data"] in ([], [[]]), \
        "another session sees none of them"


def test_lab_attention_gives_encoder_decoder_and_cross_attention_with_token_labels(client, trained):
    note, encoder, decoder, cross = client.predict("run1", "abcdefgh", api_name="/lab_attention")
    assert "**run1** (reverse) answers" in note
    cross = json.loads(cross["plot"])
    assert len(cross["data"]) == 2  # 1 layer × 2 heads
    assert cross["data"][0]["x"] == [f"{i} {c}" for i, c in enumerate("abcdefgh")] + ["8 <eos>"]
    assert cross["data"][0]["y"][0] == "0 <bos>"
    assert cross["layout"]["meta"]["keys"] == 9
    assert json.loads(encoder["plot"])["layout"]["meta"]["queries"] == 9
    assert json.loads(decoder["plot"])["layout"]["meta"]["rows"] == ["layer 0"]
    with pytest.raises(AppError, match="outside the lab's vocabulary"):
        client.predict("run1", "abc!", api_name="/lab_attention")
    with pytest.raises(AppError, match="no run 'run42'"):
        client.predict("run42", "abc", api_name="/lab_attention")


@pytest.mark.parametrize("bad,message", [
    (dict(heads=3), "multiple of n_heads"), (dict(d_ff=0), "d_ff must be between 1 and"),
    (dict(task="poetry"), "Unknown task 'poetry'"), (dict(layers=9), "Layers must be between 1 and 4"),
    (dict(task=["reverse"]), "Task: choose one value, not a list")])
def test_bad_configs_are_answered_with_a_message(client, bad, message):
    with pytest.raises(AppError, match=message):
        client.predict(*fields(**bad), "", api_name="/train")


def test_save_run_puts_it_in_the_weight_store_where_the_app_loads_it(server, client, trained):
    message = client.predict("run1", "lab-reverse", api_name="/save_run")
    folder = server[2] / "lab-reverse"
    assert "Saved **lab-reverse**" in message and (folder / "model.safetensors").is_file()
    assert "`weights/lab-reverse`" in message and str(folder) not in message  # no server path in a message
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["source"]["type"] == "trained" and manifest["source"]["task"] == "reverse"
    store = server[3]  # the page's picker lists store.names(); the browser test picks it there
    assert "lab-reverse" in store.names()
    assert store.get("lab-reverse").config.is_encoder_decoder
    assert "trained in the lab on reverse (seed 0)" in store.source("lab-reverse")
    with pytest.raises(AppError, match="already exists"):
        client.predict("run1", "lab-reverse", api_name="/save_run")
    with pytest.raises(AppError, match="letters, digits"):
        client.predict("run1", "no spaces", api_name="/save_run")


def test_stop_ends_a_long_run_and_one_job_per_session(server):
    session = Client(server[1], verbose=False)
    job = session.submit(*fields(steps=3000), "", api_name="/train")
    deadline = time.monotonic() + 60
    while len(job.outputs()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(AppError, match="This session is already training"):
        session.predict(*fields(), "", api_name="/train")
    assert session.predict(api_name="/stop_training") == "Stopping…"
    status, _, _, latest, run_id = job.result(timeout=60)
    assert run_id == "run1" and latest["runs"][0]["status"] == "stopped" and latest["runs"][0]["step"] < 3000
    table, _ = session.predict(api_name="/lab_runs")
    assert table["data"][0][5] == "stopped"


def test_compare_trains_both_and_writes_its_finding_from_the_numbers(server):
    session = Client(server[1], verbose=False)
    status, curves, latest, run_ids = session.predict(*fields(steps=10), "causal_mask", api_name="/compare")
    assert run_ids == "run1, run2" and [r["label"] for r in latest["runs"]] == ["causal mask", "no causal mask"]
    a, b = latest["runs"]
    assert latest["finding"].startswith("Without the causal mask the training loss fell to ")
    assert f"{100 * b['exact_match']:.0f} % (masked: {100 * a['exact_match']:.0f} %)" in latest["finding"]
    assert "Compared on: decoder only" in status
    assert len({t["legendgroup"] for t in json.loads(curves["plot"])["data"]}) == 2
    table, findings = session.predict(api_name="/lab_runs")
    assert [r[0] for r in table["data"]] == ["run1", "run2"] and latest["finding"] in findings


def test_cancelling_the_stream_ends_the_training_thread(server):
    """What Stop's cancels= and a closed page do: the event's generator is closed, and the job with it."""
    session = Client(server[1], verbose=False)
    job = session.submit(*fields(steps=3000), "", api_name="/train")
    deadline = time.monotonic() + 60
    while len(job.outputs()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    job.cancel()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = session.predict(api_name="/lab_runs")[0]["data"][0][5]
        if status == "stopped":
            break
        time.sleep(0.2)
    assert status == "stopped"


def test_lab_induction_traces_the_saved_run_and_one_trained_here(server):
    """The saved attention-only run's circuit (core.lab.induction, tested against its own numbers in
    tests/core/test_induction.py) as the page draws it; a short run of the same config trained in this session and
    traced; a run of another shape refused in words."""
    session = Client(server[1], verbose=False)
    note, heads, feeds = session.predict("saved: induction", api_name="/lab_induction")
    assert "**L0 H3** is a previous-token head" in note and "**L1 H1** an induction head" in note
    assert "L0 H3 feeds L1 H1's keys more than any other earlier head" in note and "Olsson" in note
    assert json.loads(heads["plot"])["layout"]["meta"]["panels"] == ["L0 H3: previous-token head",
                                                                     "L1 H1: induction head"]
    assert json.loads(feeds["plot"])["data"][0]["y"][0] == "L0 H3"
    with pytest.raises(AppError, match="traced on a two-layer decoder"):
        session.predict("saved: reverse", api_name="/lab_induction")
    with pytest.raises(AppError, match="Steps must be"):
        session.predict(0, 5, api_name="/lab_induction_train")
    note, heads, feeds, pick = session.predict(1, 100, api_name="/lab_induction_train")
    assert note.startswith("**run1**: on 16 fresh texts") and pick == "run1"
    assert "no circuit formed (scores: " in note and "Olsson" not in note       # 100 steps learn no circuit
    assert json.loads(heads["plot"])["layout"]["meta"]["panels"][0].startswith("L0 H")
