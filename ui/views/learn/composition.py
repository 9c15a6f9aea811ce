"""The figure of the lesson on composition (ui/services/learn/composition.py): what feeds the induction head's keys on
the Lab's model and on the loaded one, bars with intervals. The bars' names are the answer: before Reveal the lesson
shows only the set-up (ui/views/learn/setup.py)."""

from __future__ import annotations

from ui.plots.base import empty_figure
from ui.plots.heads import share_panels


def composition_figure(measured):
    panels = measured.values.get("panels")
    if not panels:
        return empty_figure(measured.alt)
    return share_panels([(p.title, p.labels, p.mean, p.low, p.high) for p in panels],
                        "What feeds an induction head's keys")


FIGURES = {"composition": composition_figure}
