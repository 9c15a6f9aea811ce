"""The app as a Hugging Face Space: built with SPACE_ID set and a stand-in for the `spaces` package (the real one
only works on Hugging Face's servers), the events that run a model are decorated with spaces.GPU, the others are
not, the address comes from the Space's GRADIO_SERVER_NAME, and the weight store moves to persistent storage."""

from __future__ import annotations

import os
import sys
import types

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

import app  # noqa: E402
from tiny_app_model import build_tiny_llama  # noqa: E402
from ui import spaces as space_support  # noqa: E402
from ui.page import build_page  # noqa: E402
from ui.services import Services  # noqa: E402
from ui.tabs.events import MODEL_GROUPS  # noqa: E402


@pytest.fixture
def fake_spaces(monkeypatch):
    """A `spaces` module whose GPU decorator records what it decorated and with which duration."""
    module = types.ModuleType("spaces")
    module.decorated = []

    def gpu(duration=None):
        def decorate(fn):
            def on_gpu(*args, **kwargs):
                return fn(*args, **kwargs)

            on_gpu.zerogpu_duration, on_gpu.__wrapped__ = duration, fn
            module.decorated.append(fn)
            return on_gpu

        return decorate

    module.GPU = gpu
    monkeypatch.setitem(sys.modules, "spaces", module)
    monkeypatch.setenv("SPACE_ID", "someone/attention-explorer")
    return module


def test_on_zero_gpu_the_model_events_and_only_they_run_under_spaces_gpu(fake_spaces, monkeypatch, tmp_path):
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    model = str(build_tiny_llama(tmp_path / "tiny-llama"))
    demo = build_page(Services.create(default_model=model), model)
    on_gpu = {fn.api_name for fn in demo.fns.values() if hasattr(fn.fn, "zerogpu_duration")}
    assert {"attention", "generate", "mask_demo", "positional_encoding", "head_atlas", "load_model"} <= on_gpu
    for fn in demo.fns.values():
        decorated = hasattr(fn.fn, "zerogpu_duration")
        cpu_only = fn.api_name in space_support.CPU_EVENTS
        assert decorated == (fn.concurrency_id in MODEL_GROUPS and not cpu_only), fn.api_name or fn.name
        if decorated:
            assert fn.fn.zerogpu_duration == space_support.GPU_SECONDS
    assert "load_text" not in on_gpu and "train" not in on_gpu  # reading a file, the Lab's CPU job
    assert "extrapolation" not in on_gpu  # a CPU training job of minutes: ZeroGPU's slice would cut it


def test_without_zero_gpu_nothing_is_decorated_and_spaces_is_not_imported(monkeypatch, tmp_path):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    monkeypatch.setitem(sys.modules, "spaces", None)  # importing it would fail: it must not be tried
    assert space_support.zero_gpu() is None
    model = str(build_tiny_llama(tmp_path / "tiny-llama"))
    demo = build_page(Services.create(default_model=model), model)
    assert not any(hasattr(fn.fn, "zerogpu_duration") for fn in demo.fns.values())
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")  # set, but the package is missing: a warning, no failure
    assert space_support.zero_gpu() is None


def test_a_space_binds_where_it_says_and_a_plain_machine_binds_loopback(fake_spaces, monkeypatch):
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")  # what Hugging Face sets in a Space's container
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7860")
    args = app.parse_args([])
    options = app.launch_options(args, app.app_settings(args))
    assert options["server_name"] == "0.0.0.0" and options["share"] is False
    monkeypatch.delenv("GRADIO_SERVER_NAME")
    args = app.parse_args([])
    assert app.launch_options(args, app.app_settings(args))["server_name"] == "127.0.0.1"


def test_a_space_with_persistent_storage_keeps_its_weights_there(fake_spaces, monkeypatch, tmp_path):
    monkeypatch.setattr(space_support, "PERSISTENT_STORAGE", tmp_path)
    monkeypatch.delenv("ATTN_WEIGHTS_DIR", raising=False)
    try:
        assert space_support.use_persistent_storage() == tmp_path / "weights"
        assert os.environ["ATTN_WEIGHTS_DIR"] == str(tmp_path / "weights")
        from core.store import WeightStore

        assert WeightStore.default().root == tmp_path / "weights"
    finally:
        os.environ.pop("ATTN_WEIGHTS_DIR", None)
    monkeypatch.setattr(space_support, "PERSISTENT_STORAGE", tmp_path / "absent")
    assert space_support.use_persistent_storage() is None and "ATTN_WEIGHTS_DIR" not in os.environ
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setattr(space_support, "PERSISTENT_STORAGE", tmp_path)
    assert space_support.use_persistent_storage() is None  # not on a Space: weights/ as always
