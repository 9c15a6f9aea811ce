"""What every figure shares: the template and colours, the size a figure costs in the page, float32 arrays,
one layout helper and the empty figure that says why there is nothing to draw.

Every module of ui/plots takes numpy arrays (and lists of strings) and returns a plotly Figure (or, where text
reads better as text, HTML). Nothing here knows about torch, Gradio or the model, so each function can be
tested on its own. A figure travels to the browser as JSON, and plotly encodes a float32 array as base64
(about 5.4 bytes per cell once Gradio has escaped it): callers keep matrices small, and `figure_nbytes`
measures what a figure will cost.
"""

from __future__ import annotations

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
