"""The figure of the lesson on attention sinks (ui/services/learn/sinks.py): each head's mean attention on the first
token, layers across and heads down, on the 0–1 scale of the Heads tab's sink map."""

from __future__ import annotations

import numpy as np

from ui.plots.base import empty_figure
from ui.plots.heads import sink_maps
from ui.services.sinks import sink_heads


def sinks_figure(measured):
    """The map with a ring on every head above ε (the heads the answer counts), and a subtitle that counts them;
    drawn on Reveal only (before it, ui/views/learn/setup.py draws the map's empty axes)."""
    v = measured.values
    if v.get("first") is None:
        return empty_figure(measured.alt)
    name, first = f"mean attention on {v['where']}", np.asarray(v["first"])
    fig = sink_maps({name: first}, {name: sink_heads(first, v["epsilon"])}, v["epsilon"],
                    f"How much each head puts on {v['where']}")
    # one map: its panel's name only repeats the title, and it sat where the subtitle goes
    fig.layout.annotations = [a for a in fig.layout.annotations if a.text != name]
    fig.update_layout(title={"subtitle": {"text": f"{len(v['above'])} heads above ε = {v['epsilon']:g} "
                                                  f"({v['share']:.1f} %), over {v['tokens']} tokens"}})
    return fig


FIGURES = {"sinks": sinks_figure}
