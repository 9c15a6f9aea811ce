"""Saved Lab runs on a shared server (SPACE_ID set, as on a Space), through gradio_client with two sessions: the
run is saved to a private folder, listed to its own session alone, loaded there by its alias, and its message names
no path. (On a laptop, tests/app/test_app_lab.py: runs go to weights/NAME for everyone.)"""

from __future__ import annotations

import os
import re
import time

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from test_app_lab import LAB_ENV, fields  # noqa: E402
from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402
from ui.services.checks import UserError  # noqa: E402


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    root = tmp_path_factory.mktemp("private-runs")
    weights = root / "weights"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {**LAB_ENV, "ATTN_WEIGHTS_DIR": str(weights), "SPACE_ID": "someone/explorer"}.items():
            patch.setenv(name, value)
        llama = str(build_tiny_llama(root / "tiny-llama"))
        demo, url, services = launch_app([llama], llama)
        yield url, weights, services
        demo.close()


def test_a_run_saved_on_a_space_is_its_pages_alone(space):
    url, weights, services = space
    mine, theirs = Client(url, verbose=False), Client(url, verbose=False)
    mine.submit(*fields(), "", api_name="/train").result(timeout=120)
    message = mine.predict("run1", "lab-private", api_name="/save_run")
    assert "for this page only" in message and "deleted 60 minutes after saving" in message
    assert str(weights) not in message and ".private" not in message          # no server path
    alias = re.search(r"`(lab-private \(this page's run, [^`]+\))`", message).group(1)
    assert services.lab.private_choices(mine.session_hash) == [alias]
    assert services.lab.private_choices(theirs.session_hash) == []            # another page never lists it
    assert not (weights / "lab-private").exists() and "lab-private" not in services.models.names()
    assert (weights / ".private").is_dir()
    # the page's picker gets the alias after a save (a chained event the browser runs; tests/browser/test_browser_lab.py
    # picks a saved run there): the model store loads it by that alias
    assert services.models.get(alias).config.is_encoder_decoder
    with pytest.raises(AppError, match="no run 'run1'"):                      # nor can another page save it
        theirs.predict("run1", "stolen", api_name="/save_run")


def test_a_saved_run_expires_on_time_and_its_name_then_says_why(space, monkeypatch):
    """A lifetime of 2 s on the running app: the run's files go when it is due, with nothing reading the picker,
    and the model loaded by its alias is forgotten: the alias then answers why."""
    url, weights, services = space
    monkeypatch.setattr(services.lab.private, "ttl_s", 2.0)
    page = Client(url, verbose=False)
    page.submit(*fields(), "", api_name="/train").result(timeout=120)
    message = page.predict("run1", "short-lived", api_name="/save_run")
    alias = re.search(r"`(short-lived \(this page's run, [^`]+\))`", message).group(1)
    (folder,) = (weights / ".private").glob("*/short-lived")
    # the page's picker loads it by its alias (the API's dropdown lists no session's runs: tests/browser picks it)
    assert services.models.get(alias).config.is_encoder_decoder and alias in services.models.loaded()
    deadline = time.monotonic() + 30
    while (folder.exists() or alias in services.models.loaded()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not folder.exists() and alias not in services.models.loaded()
    with pytest.raises(UserError, match="deleted 2 seconds after saving, and this one has been"):
        services.models.get(alias)
    assert services.lab.private_choices(page.session_hash) == []
