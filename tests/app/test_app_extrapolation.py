"""The Lab's `extrapolation` endpoint through gradio_client on the real app (a tiny random Llama as the page's
model): a short run streams its progress and each kind as it finishes, the learned table's refusal reaches the
note and the figure, bad settings are named, and cancelling stops the training thread and frees the session."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402


@pytest.fixture(scope="module")
def client(tiny_llama_api_app):
    return Client(tiny_llama_api_app[0], verbose=False)  # the API modules' shared app (tests/conftest.py)


def training_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "extrapolation" and t.is_alive()]


def test_a_short_run_streams_each_kind_and_the_learned_refusal(client):
    job = client.submit(["none", "learned"], 10, 0, api_name="/extrapolation")
    status, note, accuracy, heads, numbers = job.result(timeout=300)
    statuses = [out[0] for out in job.outputs()]
    assert any("Training **learned**" in s for s in statuses) and status.startswith("Done: 2 kinds")
    assert "**Computed here, now**: 2 of 2 kinds" in note
    assert "no position 28 in the table: it has 27 rows" in note and "99 positions" in note
    traces = {t["name"]: t for t in json.loads(accuracy["plot"])["data"] if t.get("showlegend", True) is not False}
    assert list(traces) == ["learned", "none"]                       # the kinds' order, whatever the order asked
    assert traces["learned"]["x"] == [12, 24, 48] and traces["learned"]["y"][1:] == [None, None]
    assert all(y is not None for y in traces["none"]["y"])
    panels = json.loads(heads["plot"])["layout"]["meta"]["panels"]
    assert panels[0].startswith("learned: ") and "12 symbols" in panels[0] and "48 symbols" in panels[1]
    kinds = {k["kind"]: k for k in numbers["kinds"]}
    assert set(kinds["learned"]["refused"]) == {"24", "48"} and set(kinds["none"]["accuracy"]) == {"12", "24", "48"}
    assert all(0 <= a <= 1 for a in kinds["none"]["accuracy"].values())


@pytest.mark.parametrize("kinds, steps, seed, words", [([], 10, 0, "Pick at least one kind"),
                                                      (["rope"], 5, 0, "Steps must be between 10 and"),
                                                      (["rope"], 10**6, 0, "Steps must be"),
                                                      (["rope"], 10.5, 0, "Steps must be"),
                                                      (["rope"], 10, -1, "Seed must be")])
def test_bad_settings_are_named(client, kinds, steps, seed, words):
    with pytest.raises(AppError, match=words):
        client.predict(kinds, steps, seed, api_name="/extrapolation")


def test_cancelling_stops_the_training_and_frees_the_session(client):
    job = client.submit(["rope", "alibi"], 3000, 0, api_name="/extrapolation")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any("step" in out[0] and "step 0 " not in out[0]
                                                  for out in job.outputs()):
        time.sleep(0.2)
    assert training_threads(), "the run never started"
    job.cancel()
    deadline = time.monotonic() + 30
    while training_threads() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not training_threads(), "the training thread outlived its cancelled event"
    # the session's heavy slot is free again: a second run is not refused
    status = client.predict(["none"], 10, 0, api_name="/extrapolation")[0]
    assert status.startswith("Done: 1 kind in")
