"""The layer and head fields' check before a run, and the gate it sets: the words of a wrong field, and a gated
event that keeps every output when the check failed, runs as before when it passed or when an API call (which has
no check) comes, and still travels to a backend with gr.Progress last."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import gradio as gr
import pytest

from ui.backend.routing import travelling_args
from ui.tabs.events import FIELDS_OK, gated
from ui.tabs.widgets import Fields, out_of_range

MODEL = SimpleNamespace(config=SimpleNamespace(n_layers=30, n_heads=4))


def fields(mean: bool = False, head: bool = True) -> Fields:
    return Fields(layer=None, head=object() if head else None, note=None, ok=None,
                  shape=lambda model: (model.config.n_layers, model.config.n_heads), mean=mean)


@pytest.mark.parametrize("value, words", [
    (99, "Layer 99 is out of range: this model has layers 0–29."),
    (-1, "Layer -1 is out of range: this model has layers 0–29."),
    ("99", "Layer 99 is out of range: this model has layers 0–29."),
    (1.5, "Layer must be a whole number from 0 to 29, got 1.5."),
    (None, "Layer is missing"),
    (10**30, "Layer must be between 0 and 29"),
])
def test_a_wrong_layer_names_the_models_range(value, words):
    assert out_of_range("Layer", value, 30).startswith(words)


def test_right_fields_have_no_problem_and_the_mean_is_a_head_where_offered():
    assert fields().problem(MODEL, 29, 3) == ""
    assert fields(mean=True).problem(MODEL, 0, "mean of heads") == ""
    assert fields(mean=True).problem(MODEL, 0, "7") == ("Head 7 is out of range: this model has heads 0–3, "
                                                        "or the mean.")
    assert "Head must be" in fields().problem(MODEL, 0, "mean of heads")
    both = fields().problem(MODEL, 30, 4)
    assert both == ("Layer 30 is out of range: this model has layers 0–29. "
                    "Head 4 is out of range: this model has heads 0–3.")
    assert fields(head=False).problem(MODEL, 3) == ""


def view(model_name, layer, previous=None, progress=gr.Progress()):
    return f"{model_name}:{layer}", "figure"


def streaming(model_name, layer, progress=gr.Progress()):
    yield f"{model_name}:{layer}", "figure"


def test_a_gated_event_keeps_its_outputs_when_the_check_failed_and_runs_otherwise():
    event = gated(dict(fn=view, inputs=["model", "layer", "previous"], outputs=["note", "figure"]), "ok-state")
    run = event["fn"]
    assert event["inputs"] == ["model", "layer", "previous", "ok-state"]
    names = list(inspect.signature(run).parameters)
    assert names == ["model_name", "layer", "previous", FIELDS_OK, "progress"]
    assert travelling_args(run, "0:attention") == 4  # the gate's State travels; gr.Progress stays behind
    kept = run("m", 99, None, False, None)
    assert all(isinstance(value, dict) and value.get("__type__") == "update" for value in kept) and len(kept) == 2
    assert run("m", 1, None, True, None) == ("m:1", "figure")
    assert run("m", 1) == ("m:1", "figure")  # a direct call, as an API call: the State's default, True
    assert run("m", 1, progress=None) == ("m:1", "figure")
    assert run.__name__ == "view"  # the event keeps its name (the backends' routing reads it)

    stream = gated(dict(fn=streaming, inputs=["model", "layer"], outputs=["note", "figure"]), "ok-state")["fn"]
    assert list(stream("m", 1, True)) == [("m:1", "figure")]
    assert len(list(stream("m", 99, False))) == 1


def test_a_picked_head_that_is_not_layer_dot_head_is_refused_in_words():
    from ui.services.checks import UserError
    from ui.tabs.widgets import checked_pick

    model = SimpleNamespace(config=SimpleNamespace(n_layers=2, n_heads=4))
    assert checked_pick(model, "1.3") == (1, 3)
    for picked in ("", None, "x.1", "1", "1.2.3", "-1.2"):
        with pytest.raises(UserError, match="layer.head"):
            checked_pick(model, picked)
    with pytest.raises(UserError, match="no head 2.0"):
        checked_pick(model, "2.0")
