"""The Lab's `lab_sinks` endpoint through gradio_client on the real app: a short run streams its steps and ends with
both kinds measured (the note's numbers are the JSON's), bad settings are named, and cancelling stops the training
thread and frees the session's heavy slot. The saved result's words read its own numbers."""

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

from ui.services.lab import sinks  # noqa: E402


@pytest.fixture(scope="module")
def client(tiny_llama_api_app):
    return Client(tiny_llama_api_app[0], verbose=False)  # the API modules' shared app (tests/conftest.py)


def training_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sinks-lab" and t.is_alive()]


def test_a_short_run_streams_its_steps_and_measures_both_kinds(client):
    job = client.submit(50, 0, 8, api_name="/lab_sinks")
    status, note, figure, numbers = job.result(timeout=300)
    statuses = [out[0] for out in job.outputs()]
    assert any("Training **softmax: step" in s for s in statuses) and status.startswith("Done: both kinds")
    assert "**Computed here, now**" in note and "| **softmax** |" in note and "| **sink** |" in note
    kinds = {k["kind"]: k for k in numbers["kinds"]}
    assert set(kinds) == {"softmax", "sink"} and kinds["softmax"]["learned"] is None
    soft, sink = kinds["softmax"], kinds["sink"]
    assert f"{soft['past_window']['window']:.2f}" in note and f"{sink['past_window']['window']:.2f}" in note
    assert sink["sink_logits"] is None and len(sink["learned"]) == 2 and len(sink["learned"][0]) == 4   # 2 × 4 heads
    panels = [a["text"] for a in json.loads(figure["plot"])["layout"]["annotations"]]
    assert {"softmax: weight on <bos>", "learned sink: the sink's own weight"} <= set(panels)


@pytest.mark.parametrize("steps, seed, window, words", [(10, 0, 8, "Steps must be between 50 and"),
                                                        (10**6, 0, 8, "Steps must be"),
                                                        (60.5, 0, 8, "Steps must be"),
                                                        (60, -1, 8, "Seed must be"),
                                                        (60, 0, 0, "Window must be between 1 and 30"),
                                                        (60, 0, 31, "Window must be")])
def test_bad_settings_are_named(client, steps, seed, window, words):
    with pytest.raises(AppError, match=words):
        client.predict(steps, seed, window, api_name="/lab_sinks")


def test_cancelling_stops_the_training_and_frees_the_session(client):
    job = client.submit(3000, 0, 8, api_name="/lab_sinks")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not training_threads():
        time.sleep(0.2)
    assert training_threads(), "the run never started"
    job.cancel()
    deadline = time.monotonic() + 30
    while training_threads() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not training_threads(), "the training thread outlived its cancelled event"
    with pytest.raises(AppError, match="Window must be"):   # the heavy slot is free: the call reaches its checks
        client.predict(60, 0, 0, api_name="/lab_sinks")


def test_the_saved_results_words_are_its_numbers():
    result = sinks.saved()
    assert result is not None, f"no saved result: {sinks.SAVED_COMMAND} makes it"
    words = sinks.finding(result)
    soft, sink = result.kind("softmax"), result.kind("sink")
    for value in (soft.past_window["full"], soft.past_window["window"], sink.past_window["window"]):
        assert f"{value:.2f}" in words
    above = sum(v > sinks.EPSILON for row in soft.first for v in row)
    assert f"**{above} of {result.config.n_layers * result.config.n_heads} heads**" in words
