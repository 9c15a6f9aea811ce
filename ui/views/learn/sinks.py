"""The figure of the lesson on attention sinks (ui/services/learn/sinks.py): each head's mean attention on the first
token, layers across and heads down, on the 0–1 scale of the Heads tab's sink map."""

from __future__ import annotations

import numpy as np

from ui.plots.base import empty_figure
from ui.plots.heads import sink_maps


def sinks_figure(measured):
    """The map without rings (counting the rings would give the answer before Reveal); the subtitle, which the
    veiled figure drops, says how many heads pass ε."""
    v = measured.values
    if v.get("first") is None:
        return empty_figure(measured.alt)
    fig = sink_maps({f"mean attention on {v['where']}": np.asarray(v["first"])}, float("inf"),
                    f"How much each head puts on {v['where']}")
    fig.update_layout(title={"subtitle": {"text": f"{len(v['above'])} heads above ε = {v['epsilon']:g} "
                                                  f"({v['share']:.1f} %), over {v['tokens']} tokens"}})
    return fig


FIGURES = {"sinks": sinks_figure}
