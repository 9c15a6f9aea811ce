"""Fair queues, tested so that they cannot be flaky: a long job is held running (it waits on an event), and
meanwhile another session's short call completes and the same session's second long job is refused in words."""

from __future__ import annotations

import os
import threading

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from core.analysis import patching  # noqa: E402

CLEAN, CORRUPTED = "the bread is warm and the lamp", "the bread is warm and the shop"
WAIT_S = 60


@pytest.fixture(scope="module")
def served(tiny_llama_api_app):
    url, services, llama = tiny_llama_api_app  # the API modules' shared app (tests/conftest.py)
    return llama, url, services


def test_a_short_call_runs_while_a_long_job_holds_and_a_second_long_job_is_refused(served, monkeypatch):
    llama, url, services = served
    started, release = threading.Event(), threading.Event()
    sweep = patching.patch_sweep

    def held_sweep(*args, **kwargs):
        started.set()
        assert release.wait(WAIT_S), "the test never released the held sweep"
        return sweep(*args, **kwargs)

    monkeypatch.setattr(patching, "patch_sweep", held_sweep)
    heavy_user, other_user = Client(url, verbose=False), Client(url, verbose=False)
    job = heavy_user.submit(llama, CLEAN, CORRUPTED, "", "", "resid_pre", "denoise", 0, api_name="/patch_sweep")
    try:
        assert started.wait(WAIT_S), "the sweep did not start"
        assert list(services.heavy.running().values()) == ["A patching sweep"]
        # another session's short call is not queued behind the sweep
        short = other_user.submit(llama, CLEAN, 0, "mean of heads", False, 0, 0, 8, api_name="/attention")
        note = short.result(timeout=WAIT_S)[0]
        assert "tokens" in note and not release.is_set()
        # the same session's second long job is refused, saying what runs
        with pytest.raises(AppError, match="already running A patching sweep"):
            heavy_user.predict(llama, CLEAN, "zero", "previous_token", api_name="/ablation_sweep")
    finally:
        release.set()
    note = job.result(timeout=WAIT_S)[0]
    assert "on the clean prompt" in note
    assert services.heavy.running() == {}
    # and once it is done, the same session may start another
    assert "Swept" in heavy_user.predict(llama, CLEAN, "zero", "previous_token", api_name="/ablation_sweep")[0]
