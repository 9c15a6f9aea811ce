"""A model the store drops is gone from the process: switching through more models than the store keeps, through
the app's own /load_model, leaves no reference to a dropped one; the store collects a dropped model that a
reference cycle holds (reference counting alone never frees it) and hands its memory back once it has let go."""

from __future__ import annotations

import gc
import os
import weakref

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

from gradio_client import Client  # noqa: E402

from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app  # noqa: E402
from ui.services.models import ModelStore  # noqa: E402


@pytest.fixture(scope="module")
def three_models(tmp_path_factory):
    """Three tiny models: one more than the store keeps (two), so that cycling through them evicts."""
    root = tmp_path_factory.mktemp("switch")
    return [str(build_tiny_llama(root / "llama")), str(build_tiny_bert(root / "bert")),
            str(build_tiny_llama(root / "llama-2"))]


@pytest.fixture(scope="module")
def switch_app(three_models):
    demo, url, services = launch_app(three_models, three_models[0])
    yield url, services
    demo.close()


def test_models_cycled_through_load_model_leave_none_behind(switch_app, three_models):
    url, services = switch_app
    store = services.models
    assert store.capacity == 2
    client = Client(url, verbose=False)
    seen = []
    try:
        for _ in range(2):
            for name in three_models[1:] + three_models[:1]:
                card = client.predict(model_name=name, api_name="/load_model")
                assert "Error" not in str(card)
                seen.append((name, weakref.ref(store.get(name))))
    finally:
        client.close()
    gc.collect()
    kept = {name: store.get(name) for name in store.loaded()}
    assert len(kept) == 2
    alive = [name for name, ref in seen if ref() is not None and all(ref() is not m for m in kept.values())]
    assert alive == [], f"dropped models still referenced after a collection: {alive}"
    assert sum(ref() is not None for _, ref in seen) == 2  # only the two the store keeps


def test_a_dropped_model_in_a_reference_cycle_is_collected_by_the_store(three_models):
    """The first model a process loads sits in such a cycle (torch.fx's import frame reaches load_model's); here
    the cycle is made by hand, and automatic collection is off, so only the store's own collection frees it."""
    store = ModelStore(capacity=1)
    model = store.get(three_models[0])
    model.cycle = [model]                   # model → list → model: reference counting never reaches 0
    dropped = weakref.ref(model)
    del model
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        store.get(three_models[1])          # capacity 1: the first is evicted
        assert dropped() is None, "an evicted model held by a reference cycle was not collected"
    finally:
        if was_enabled:
            gc.enable()


def test_release_runs_once_the_store_has_let_go_of_the_dropped_model(three_models):
    freed_when_released = []
    refs = {}

    def release():
        freed_when_released.append(refs["first"]() is None)

    store = ModelStore(capacity=1, release=release)
    refs["first"] = weakref.ref(store.get(three_models[0]))
    assert freed_when_released == []        # nothing dropped yet
    store.get(three_models[0])              # already here: nothing dropped
    assert freed_when_released == []
    store.get(three_models[1])
    assert freed_when_released == [True]    # the store let go first: the model was gone when release ran
    store.forget(three_models[1])
    assert freed_when_released == [True, True]
    store.forget(three_models[1])           # nothing to drop: no release
    assert len(freed_when_released) == 2
