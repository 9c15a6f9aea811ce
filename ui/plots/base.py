"""What every figure shares: the template and colours, the size a figure costs in the page, float32 arrays,
one layout helper and the empty figure that says why there is nothing to draw.

Every module of ui/plots takes numpy arrays (and lists of strings) and returns a plotly Figure (or, where text
reads better as text, HTML). Nothing here knows about torch, Gradio or the model, so each function can be
tested on its own. A figure travels to the browser as JSON, and plotly encodes a float32 array as base64
(about 5.4 bytes per cell once Gradio has escaped it): callers keep matrices small, and `figure_nbytes`
measures what a figure will cost.
"""

from __future__ import annotations

import textwrap

import numpy as np
import plotly.graph_objects as go

TEMPLATE = "plotly_white"
ATTENTION_COLORS = "Blues"
SIGNED_COLORS = "RdBu"
CHOSEN_COLOR = "#d62728"  # the token the model picked, in every view of a generation
MASKED_COLOR = "#d9d9d9"  # cells that a mask removed (−∞ before softmax) are drawn in this grey


def figure_nbytes(fig: go.Figure) -> int:
    """Bytes of the figure's JSON, about what the browser receives for it."""
    return len(fig.to_json().encode("utf-8"))


def as_f32(a: np.ndarray) -> np.ndarray:
    # float32 halves the bytes sent compared with float64 and is what the core computes in.
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def base_layout(fig: go.Figure, title: str, height: int | None = None, top: int = 60) -> go.Figure:
    """The template, a left-aligned title, margins (`top` px above the plot for the title) and the height."""
    fig.update_layout(
        template=TEMPLATE,
        title={"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        margin={"l": 60, "r": 20, "t": top, "b": 50},
        height=height,
    )
    return fig


def empty_figure(message: str, height: int = 200) -> go.Figure:
    """An empty figure that says why there is nothing to plot (e.g. the model has no learned positions)."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 14})
    base_layout(fig, "", height)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


NARROW_TITLE_CHARS, NARROW_SUBTITLE_CHARS = 42, 52   # a line's characters at 14 / 12 px on a phone-wide plot


def fit_narrow(fig: go.Figure) -> go.Figure:
    """The figure laid out to read on a phone-wide plot as on a wide one (plotly clips a long title or subtitle,
    and anchors a title of several lines over the plot): its title and subtitle wrapped into lines and set above
    the plot as two left-aligned annotations (named "title" and "subtitle"), with the top margin they need; a
    legend of several entries under the figure, where the plot's margin makes room for it instead of the axis
    labels sitting under it. Returns a copy."""
    fig = go.Figure(fig)
    title = fig.layout.title
    lines = [line for part in (title.text or "").split("<br>") for line in textwrap.wrap(part, NARROW_TITLE_CHARS)]
    subtitle = title.subtitle.text if title.subtitle and title.subtitle.text else ""
    sublines = [line for part in subtitle.split("<br>") for line in textwrap.wrap(part, NARROW_SUBTITLE_CHARS)]
    if lines or sublines:
        left = fig.layout.margin.l if fig.layout.margin.l is not None else 60
        fig.update_layout(title={"text": "", "subtitle": {"text": ""}},
                          margin={"t": 14 + 19 * len(lines) + 16 * len(sublines) + 8})
        for name, words, size, above in (("title", lines, 14, 8 + 16 * len(sublines)), ("subtitle", sublines, 12, 6)):
            if words:
                fig.add_annotation(text="<br>".join(words), name=name, xref="paper", yref="paper", x=0, y=1,
                                   xanchor="left", yanchor="bottom", xshift=4 - left, yshift=above, align="left",
                                   showarrow=False, font={"size": size})
    if fig.layout.showlegend is not False and sum(trace.showlegend is not False for trace in fig.data) > 1:
        fig.update_layout(legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0,
                                  "xanchor": "left"})
    return fig
