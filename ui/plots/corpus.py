"""Figures of a measurement over many texts: the mean map with its interval in the hover, and one cell's values
item by item. Arrays in, Plotly figures out; every figure carries a line saying what n is and what the interval
is, so a figure saved alone still says how typical its numbers are."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from ui.plots.base import ATTENTION_COLORS, SIGNED_COLORS, as_f32, base_layout
from ui.plots.text import escaped

ITEM_COLOR = "#1f77b4"
MEAN_COLOR = "#d62728"


def interval_words(n: int, noun: str, interval: str, minimum: int, confidence: float = 0.95) -> str:
    """"95 % CI of the mean over n = 40 pairs, percentile bootstrap" (interval: the method the summary used, ""
    for none), or that n is too few for one (minimum: the fewest items that get one)."""
    nouns = noun if n == 1 else noun + "s"
    if not interval:
        return f"n = {n} {nouns}: too few for an interval (it needs at least {minimum})"
    return f"{confidence * 100:g} % CI of the mean over n = {n} {nouns}, {interval}"


def caption(fig: go.Figure, line: str) -> go.Figure:
    """The line under the plot (what n is, what the interval is), inside the figure so an export keeps it."""
    fig.add_annotation(text=line, showarrow=False, x=0, xref="paper", xanchor="left", y=-0.02, yref="paper",
                       yanchor="top", yshift=-48, font={"size": 11, "color": "#555"})
    fig.update_layout(margin={"b": 95})
    return fig


MAP_ROW_PX, MAP_MIN_PLOT_PX = 24, 220   # a row of cells, and the least plot area (a 4-row map stays readable)
MAP_FRAME_PX = 60 + 95 + 40             # the title's margin, the caption's, and the x axis's labels and title


def map_height(n_rows: int) -> int:
    """A map's height: its plot area (a row's pixels a row, at least MAP_MIN_PLOT_PX) and the frame around it."""
    return max(MAP_MIN_PLOT_PX, MAP_ROW_PX * n_rows) + MAP_FRAME_PX


def mean_map(mean: np.ndarray, low: np.ndarray, high: np.ndarray, n: int, rows: str, cols: str,
             col_labels: Sequence[str] | None, title: str, line: str, signed: bool = False,
             picked: tuple[int, int] | None = None, row_labels: Sequence[str] | None = None) -> go.Figure:
    """mean, low, high [R, C]: a heatmap of the mean whose hover gives the mean, the interval [low, high] and n;
    picked (row, col) is outlined (the cell the strip shows). signed: a diverging scale centred on 0. row_labels,
    col_labels: a name for each row or column (ticks and hover), where its index is not one."""
    mean, low, high = as_f32(mean), as_f32(low), as_f32(high)
    n_rows, n_cols = mean.shape
    x = list(range(n_cols))
    custom = np.stack([low, high], axis=-1)
    colour = dict(colorscale=SIGNED_COLORS, zmid=0, reversescale=True) if signed else dict(colorscale=ATTENTION_COLORS)
    named = {}
    where = f"{rows} %{{y}}, {cols} %{{x}}"
    if row_labels is not None:
        cells = [[f"{r}, {c}" for c in (col_labels or [f"{cols} {i}" for i in x])] for r in row_labels]
        named, where = dict(text=cells), "%{text}"
    hover = (f"{where}<br>mean %{{z:.4f}}<br>interval [%{{customdata[0]:.4f}}, "
             f"%{{customdata[1]:.4f}}]<br>n = {n}<extra></extra>")
    fig = go.Figure(go.Heatmap(z=mean, x=x, y=list(range(n_rows)), customdata=custom, hovertemplate=hover,
                               colorbar={"thickness": 12}, **named, **colour))
    if picked is not None:
        r, c = picked
        fig.add_shape(type="rect", x0=c - 0.5, x1=c + 0.5, y0=r - 0.5, y1=r + 0.5,
                      line={"color": "#111", "width": 2})
    base_layout(fig, title, height=map_height(n_rows))
    ticks = {} if col_labels is None else dict(tickmode="array", tickvals=x, ticktext=list(col_labels))
    fig.update_xaxes(title_text=cols, dtick=1 if col_labels is None and n_cols <= 40 else None, **ticks)
    rows_named = {} if row_labels is None else dict(tickmode="array", tickvals=list(range(n_rows)),
                                                    ticktext=list(row_labels))
    fig.update_yaxes(title_text=rows, autorange="reversed", dtick=1 if row_labels is None and n_rows <= 32 else None,
                     **rows_named)
    return caption(fig, line)


def item_strip(values: np.ndarray, items: Sequence[int], mean: float, low: float, high: float, title: str,
               line: str, value_name: str = "value") -> go.Figure:
    """One cell over the corpus: each item's value as a dot (x: the item's index in the corpus), the mean as a
    line and the interval as a band around it (none where it is NaN: too few items)."""
    values = as_f32(values)
    items = list(items)
    fig = go.Figure(go.Scatter(x=items, y=values, mode="markers", name="each item",
                               marker={"color": ITEM_COLOR, "size": 7, "opacity": 0.75},
                               hovertemplate=f"item %{{x}}<br>{value_name} %{{y:.4f}}<extra></extra>"))
    if items:
        span = [min(items) - 0.5, max(items) + 0.5]
        if np.isfinite(low) and np.isfinite(high):
            fig.add_trace(go.Scatter(x=span + span[::-1], y=[high, high, low, low], fill="toself", mode="lines",
                                     line={"width": 0}, fillcolor="rgba(214,39,40,0.15)", name="interval",
                                     hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=span, y=[mean, mean], mode="lines", name="mean", line={"color": MEAN_COLOR},
                                 hovertemplate=f"mean {mean:.4f}<br>interval [{low:.4f}, {high:.4f}]<extra></extra>"))
    base_layout(fig, title, height=300)
    fig.update_layout(showlegend=True, legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 1,
                                               "xanchor": "right"})
    fig.update_xaxes(title_text="item (its index in the corpus)")
    fig.update_yaxes(title_text=value_name)
    return caption(fig, line)


def place_cell(before: str, token: str, after: str) -> str:
    """The text around a place, its own token marked; every piece escaped."""
    return (f"{escaped(before)}<mark>{escaped(token) or '&nbsp;'}</mark>{escaped(after)}")


def examples_html(rows: Sequence[Mapping], caption_line: str) -> str:
    """A table of a head's places: rows of label, text, query, key, weight, query_parts, key_parts, link (a
    link's query string, or "") and why (the words in place of a missing link). All text is escaped: an uploaded
    text never becomes markup."""
    body = []
    for row in rows:
        link = (f'<a href="{html.escape(row["link"], quote=True)}" target="_blank" rel="noopener">open in Attention</a>'
                if row["link"] else escaped(row.get("why") or "no link"))
        body.append(f"<tr><td>{escaped(row['label'])}</td><td>{int(row['text'])}</td>"
                    f"<td>{float(row['weight']):.3f}</td>"
                    f"<td>{int(row['query'])}: {place_cell(*row['query_parts'])}</td>"
                    f"<td>{int(row['key'])}: {place_cell(*row['key_parts'])}</td><td>{link}</td></tr>")
    head = ("<tr><th>rank</th><th>text</th><th>weight</th><th>query (position: context)</th>"
            "<th>key (position: context)</th><th></th></tr>")
    return (f'<div class="corpus-examples" style="overflow-x:auto"><table><caption>{escaped(caption_line)}'
            f"</caption>{head}{''.join(body)}</table></div>")


QUERY_COLOR = "#1f77b4"
KEY_COLOR = "#ff7f0e"


def qk_plane(points: np.ndarray, is_key: np.ndarray, text: np.ndarray, position: np.ndarray,
             labels: Sequence[str], explained: Sequence[float], title: str, line: str) -> go.Figure:
    """points [2N, 2] in the plane of the first two principal components; is_key, text, position [2N]; labels
    [2N] each point's token. Queries as circles, keys as triangles, each hover giving the token (escaped: a token
    "<b>" reads "<b>"), its text and its position there; the axes name each component's share of the variance."""
    points = as_f32(points).reshape(-1, 2)
    is_key = np.asarray(is_key, dtype=bool)
    fig = go.Figure()
    for one, name, chosen, colour, symbol in (("query", "queries", ~is_key, QUERY_COLOR, "circle"),
                                              ("key", "keys", is_key, KEY_COLOR, "triangle-up")):
        where = np.flatnonzero(chosen)
        custom = np.stack([np.asarray(text)[where], np.asarray(position)[where]], axis=-1).astype(int)
        fig.add_trace(go.Scatter(
            x=points[where, 0], y=points[where, 1], mode="markers", name=name, customdata=custom,
            text=[escaped(labels[i]) for i in where],
            marker={"color": colour, "symbol": symbol, "size": 6, "opacity": 0.6},
            hovertemplate=f"{one} %{{text}}<br>text %{{customdata[0]}}, "
                          "position %{customdata[1]}<extra></extra>"))
    base_layout(fig, title, height=460)
    fig.update_layout(showlegend=True, legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 1,
                                               "xanchor": "right"})
    shares = [f" ({float(share) * 100:.0f} % of the variance)" if np.isfinite(share) else "" for share in explained]
    fig.update_xaxes(title_text=f"PC 1{shares[0]}")
    fig.update_yaxes(title_text=f"PC 2{shares[1]}", scaleanchor="x", scaleratio=1)
    caption(fig, line)
    fig.layout.annotations[-1].align = "left"    # the line's two parts, one under the other from the left edge
    return fig
