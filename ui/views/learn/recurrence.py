"""Recurrence beside attention, drawn from the saved result (ui/services/lab/recurrence.py): copy accuracy by the
distance between a symbol and its copy, and the gradient that reaches each earlier input from the loss at the end,
for the GRU and the attention decoder. The Lab's first screen shows them with their words."""

from __future__ import annotations

import numpy as np

from ui.plots.base import empty_figure, log_axis
from ui.plots.charts import line_figure
from ui.services.lab import recurrence as service

HEIGHT = 340


def accuracy_figure(result, title: str = "Copying over a distance: GRU and attention"):
    """Copy accuracy (teacher-forced, held-out) against the distance between a symbol and its copy."""
    distances = np.array(sorted(result.models[0].accuracy))
    series = {f"{m.name} ({m.parameters:,} parameters)": 100 * np.array([m.accuracy[d] for d in distances])
              for m in result.models}
    fig = line_figure(distances, series, title, "distance between a symbol and its copy (tokens)",
                      "copied right, teacher-forced (%)", height=HEIGHT)
    fig.update_yaxes(range=[0, 105])
    fig.update_xaxes(dtick=2)
    return fig


def gradient_figure(result, title: str = "The gradient reaching each earlier token"):
    """‖∂ loss / ∂ x_t‖ relative to the loss's own position, against how far back t lies, trained and untrained."""
    back = np.arange(len(result.models[0].gradient_trained))
    series = {}
    for m in result.models:
        for label, values in (("trained", m.gradient_trained), ("untrained", m.gradient_untrained)):
            values = np.asarray(values, float)
            series[f"{m.name}, {label}"] = np.maximum(values / values[0], 1e-30)
    fig = line_figure(back, series, title, "tokens back from the loss's position",
                      "‖∂loss/∂x_t‖ ÷ its value at 0", height=HEIGHT)
    for m in result.models:
        fig.update_traces(selector={"name": f"{m.name}, untrained"}, line={"dash": "dot"})
    fig.update_yaxes(**log_axis(*series.values()))
    fig.update_xaxes(dtick=5)
    return fig


def lab_recurrence():
    """(words, accuracy figure, gradient figure) for the Lab's first screen, or a stated empty state."""
    result = service.saved()
    if result is None:
        message = f"No saved result in this copy: `{service.SAVED_COMMAND}` makes it (a few minutes)."
        return (f"**Recurrence beside attention**: {message}", empty_figure("No saved result"),
                empty_figure("No saved result"))
    words = (f"**Recurrence beside attention** (saved result, computed by `{service.SAVED_COMMAND}`): a GRU, which "
             "reads one token after another and must carry each symbol in its state, against this Lab's attention "
             f"decoder, trained on the same copy task. {service.finding(result)} {service.caveat(result)}")
    return words, accuracy_figure(result), gradient_figure(result)
