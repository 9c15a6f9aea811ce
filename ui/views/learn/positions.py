"""The figure of the course's lesson on positions: how far the shuffled text's outputs, put back in order, lie from
the original ones under each condition, as a share of the outputs' size (a log scale: rounding sits near 1e-7)."""

from __future__ import annotations

from ui.plots.base import empty_figure, log_axis
from ui.plots.charts import bar_figure


def shuffle_figure(measured):
    return shuffle_chart(measured.values)


def shuffle_chart(values: dict):
    """The shuffle check's conditions (ui.services.learn.positions.shuffle_values), the lesson's and the Positional
    encoding tab's alike."""
    if not values.get("conditions"):
        return empty_figure("Nothing was measured.")
    fig = bar_figure(values["conditions"], {"largest difference ÷ the outputs' size": values["relative"]},
                     f"Shuffled {values['n_tokens']} tokens through layer {values['layer']}'s attention, put back "
                     "in order", "difference ÷ size (log scale)", text_format=".1e",
                     subtitle="float32 rounds at about 1e-7 of a value")
    fig.update_yaxes(**log_axis(values["relative"]))
    fig.update_layout(showlegend=False)
    return fig


FIGURES = {"positions": shuffle_figure}
