"""The model change's follow-ups as one event (ui.tabs.events.Steps): steps in order, each reading what the
steps before it wrote, a failing step leaving only its own outputs as they were."""

import gradio as gr
import pytest

from ui.tabs.events import Steps


class Loaded:
    """Stands in for the picker's change event: keeps what .success was given."""

    def success(self, fn, inputs, outputs, **options):
        self.fn, self.inputs, self.outputs, self.options = fn, inputs, outputs, options


def wired(steps):
    follow_ups, loaded = Steps("follow_model"), Loaded()
    with gr.Blocks():
        components = {name: gr.Number(label=name) for name in "model layer note first other".split()}
        for fn, ins, outs in steps(components):
            follow_ups.add(fn, ins, outs)
    follow_ups.wire(loaded.success)
    return loaded, components


def test_a_later_step_reads_what_an_earlier_one_wrote_and_outputs_are_the_union():
    warnings = []

    def steps(c):
        def limits(model, layer):
            return gr.Number(value=min(layer, model - 1), label=f"Layer (0–{model - 1})"), ""

        def first(model, layer, progress=None):
            assert progress == "bar"  # the event's progress, handed to a step that takes one
            return f"first screen of model {model} at layer {layer}"

        def broken(model, request):
            assert request == "the page's request"  # handed to a step whose signature names it
            raise gr.Error("cannot on this model")

        def other(model):
            return gr.skip()

        def clearest(model):  # a first screen that picks a layer: the label limits gave it stays
            return 1

        return [(limits, [c["model"], c["layer"]], [c["layer"], c["note"]]),
                (broken, [c["model"]], [c["other"]]),
                (first, [c["model"], c["layer"]], [c["first"]]),
                (other, [c["model"]], [c["note"]]),
                (clearest, [c["model"]], [c["layer"]])]

    loaded, c = wired(steps)
    assert loaded.outputs == [c["layer"], c["note"], c["other"], c["first"]]
    assert loaded.inputs == [c["model"], c["layer"]]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gr, "Warning", warnings.append)
        layer, note, other, first = loaded.fn(4, 9, "the page's request", "bar")
    assert layer == {"__type__": "update", "value": 1, "label": "Layer (0–3)"}
    assert note == ""                                      # a later skip keeps the earlier step's value
    assert other == {"__type__": "update"}                 # the failed step's output is left as it was
    assert warnings == ["cannot on this model"]
    assert first == "first screen of model 4 at layer 3"   # read the layer limits had just set


def test_a_step_added_after_wiring_is_refused():
    follow_ups = Steps("follow_model")
    follow_ups.wire(Loaded().success)
    with pytest.raises(RuntimeError, match="never run"):
        follow_ups.add(lambda model: model, [], [])


def test_a_streaming_step_reaches_the_page_as_it_comes_and_the_event_ends_on_everything_written():
    """Try it's landing: a generator step (Generate's continuation) makes the event a stream; each of its updates
    goes out alone (what earlier steps wrote is not sent again with every token), and the last update holds every
    step's outputs. A step before it that writes a field is read by the stream, and one after it reads the stream's
    final value."""

    def steps(c):
        def limits(model):
            return 2

        def stream(model, layer):
            for step in range(3):
                yield f"token {step} at layer {layer}"

        def after(note):
            return f"traced: {note}"

        return [(limits, [c["model"]], [c["layer"]]), (stream, [c["model"], c["layer"]], [c["note"]]),
                (after, [c["note"]], [c["first"]])]

    loaded, c = wired(steps)
    updates = list(loaded.fn(4, 9, "", None, None))   # model, layer, note; request, progress
    assert loaded.outputs == [c["layer"], c["note"], c["first"]]
    skip = gr.skip()
    assert updates[:3] == [[skip, f"token {i} at layer 2", skip] for i in range(3)]
    assert updates[-1] == [2, "token 2 at layer 2", "traced: token 2 at layer 2"]
    assert len(updates) == 4
