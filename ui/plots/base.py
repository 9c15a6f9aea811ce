"""What every figure shares: the template and colours, the size a figure costs in the page, float32 arrays,
one layout helper and the empty figure that says why there is nothing to draw.

Every module of ui/plots takes numpy arrays (and lists of strings) and returns a plotly Figure (or, where text
reads better as text, HTML). Nothing here knows about torch, Gradio or the model, so each function can be
tested on its own. A figure travels to the browser as JSON, and plotly encodes a float32 array as base64
(about 5.4 bytes per cell once Gradio has escaped it): callers keep matrices small, and `figure_nbytes`
measures what a figure will cost.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Sequence

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
MODEBAR_PX = 32   # plotly's toolbar (the modebar): drawn over the figure's top right, as wide as a phone's plot


def panel_titles_height(fig: go.Figure) -> int:
    """Pixels that the panel titles of a figure's top row (make_subplots' annotations, anchored at the top of the
    plot area by their bottom) stand above the plot: 0 where there are none."""
    tallest = 0
    for note in fig.layout.annotations:
        if note.name in ("title", "subtitle") or note.yref != "paper" or note.y is None or note.y < 1 - 1e-6:
            continue
        if note.yanchor not in (None, "auto", "bottom") or note.showarrow:
            continue
        size = note.font.size or fig.layout.annotationdefaults.font.size or 12
        lines = (note.text or "").count("<br>") + 1
        tallest = max(tallest, math.ceil(lines * size * 1.3) + (note.yshift or 0) + 4)
    return tallest


def fit_narrow(fig: go.Figure) -> go.Figure:
    """The figure laid out to read on a phone-wide plot as on a wide one (plotly clips a long title or subtitle,
    and anchors a title of several lines over the plot): its title and subtitle wrapped into lines and set above
    the plot as two left-aligned annotations (named "title" and "subtitle"), over the top row's panel titles and
    under a band the width of the figure left free for plotly's toolbar, with the top margin they need; a legend
    of several entries under the figure, where the plot's margin makes room for it instead of the axis labels
    sitting under it. Returns a copy."""
    fig = go.Figure(fig)
    title = fig.layout.title
    lines = [line for part in (title.text or "").split("<br>") for line in textwrap.wrap(part, NARROW_TITLE_CHARS)]
    subtitle = title.subtitle.text if title.subtitle and title.subtitle.text else ""
    sublines = [line for part in subtitle.split("<br>") for line in textwrap.wrap(part, NARROW_SUBTITLE_CHARS)]
    if lines or sublines:
        left = fig.layout.margin.l if fig.layout.margin.l is not None else 60
        panels = panel_titles_height(fig)
        fig.update_layout(title={"text": "", "subtitle": {"text": ""}},
                          margin={"t": MODEBAR_PX + 19 * len(lines) + 16 * len(sublines) + 8 + panels})
        for name, words, size, above in (("title", lines, 14, 8 + 16 * len(sublines) + panels),
                                         ("subtitle", sublines, 12, 6 + panels)):
            if words:
                fig.add_annotation(text="<br>".join(words), name=name, xref="paper", yref="paper", x=0, y=1,
                                   xanchor="left", yanchor="bottom", xshift=4 - left, yshift=above, align="left",
                                   showarrow=False, font={"size": size})
    if fig.layout.showlegend is not False and sum(trace.showlegend is not False for trace in fig.data) > 1:
        fig.update_layout(legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0,
                                  "xanchor": "left"})
    return fig


# Log axes that name whole numbers only. Left to itself plotly labels a log axis's minor ticks with their bare
# first digit ("10, 2, 5, 100, 2, 5" or "8 9 1 2"), which reads as a wrong scale. Every log axis of the app is made
# here: labelled at its decades (0.01, 1, 1,000 written out; an axis reaching past them in powers: 10⁻⁹, 10⁶), or at
# given places such as the lengths a lesson measured, each written in full, with the range set so those labels show.
MAX_DECADE_LABELS = 8      # a wider axis names every k-th decade, so its labels keep apart on a phone
PLAIN_POWERS = range(-3, 5)  # 0.001 … 10,000 are written out; further decades as powers of ten
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def decade_label(power: int, plain: bool = True) -> str:
    """10**power as a reader writes it: '0.01', '1', '1,000' (plain), or '10⁻⁹' (1 and 10 always plain)."""
    if (plain and power in PLAIN_POWERS) or power in (0, 1):
        return f"{10.0 ** power:,.{max(0, -power)}f}"
    return "10" + str(power).translate(SUPERSCRIPT)


def positive_span(values: Iterable) -> tuple[float, float]:
    """The smallest and largest finite positive value among arrays (a log axis shows nothing else)."""
    flat = [np.asarray(v, dtype=np.float64).ravel() for v in values]
    data = np.concatenate(flat) if flat else np.empty(0)
    data = data[np.isfinite(data) & (data > 0)]
    if data.size == 0:
        return 1.0, 10.0
    return float(data.min()), float(data.max())


def log_axis(*values, ticks: Sequence[float] | None = None, labels: Sequence[str] | None = None,
             low: float | None = None, high: float | None = None) -> dict:
    """A plotly log axis over `values` (arrays) or [low, high]: labelled at `ticks` (with `labels`, or the numbers
    written out) or else at the decades, and ranged to the whole decades around the data, so every label shows."""
    if low is None or high is None:
        low, high = positive_span(values if values else [ticks or []])
    if ticks is not None:
        ticks = [float(t) for t in ticks]
        shown = list(labels) if labels is not None else [f"{t:,g}" for t in ticks]
        if len(shown) != len(ticks):
            raise ValueError(f"log_axis: {len(shown)} labels for {len(ticks)} ticks")
        span = [math.log10(min(low, *ticks)) - 0.15, math.log10(max(high, *ticks)) + 0.15]
        return {"type": "log", "range": span, "tickvals": ticks, "ticktext": shown}
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    if last == first:
        last += 1
    step = max(1, math.ceil((last - first + 1) / MAX_DECADE_LABELS))
    powers = list(range(last, first - 1, -step))[::-1]   # counted down from the top, so 1 or the top is named
    return {"type": "log", "range": [first, last], "tickvals": [10.0 ** p for p in powers],
            "ticktext": [decade_label(p, plain=first in PLAIN_POWERS and last in PLAIN_POWERS) for p in powers]}


def linear_lengths(lengths: Sequence[int]) -> dict:
    """A linear axis of tokens from 0, labelled at the lengths measured: where a quantity grows linearly in n, a
    straight line through 0 says so (on a log axis of n it would bend)."""
    lengths = [int(n) for n in lengths]
    return {"type": "linear", "range": [0, lengths[-1] * 1.05], "tickvals": [0, *lengths],
            "ticktext": ["0", *(f"{n:,}" for n in lengths)]}
