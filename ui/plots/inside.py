"""The Inside tab's figures: one forward pass stage by stage (matrices over the tokens, side by side), the rotation
of each RoPE frequency pair, the next-token distribution after temperature, top-k and top-p, and why a head
attends where it does (a score split into residual components, content against position, queries and keys in one
plane); for families with more terms in eq. 2.1, the scores term by term (the soft-cap, the score bias, the
window in the mask) and a score's later stages beside its parts. Token labels are escaped (Plotly reads a few
tags in text)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.plots.attention import score_bound
from ui.plots.base import ATTENTION_COLORS, CHOSEN_COLOR, MASKED_COLOR, SIGNED_COLORS, as_f32, base_layout
from ui.plots.text import escaped

KEPT_COLOR, CUT_COLOR = "#1f77b4", "#c7c7c7"
SUBTITLE_CHARS = 52   # a subtitle line's length: it fits a phone-wide plot at 12 px


def labels_of(tokens: Sequence[str]) -> list[str]:
    return [f"{i} {escaped(t)}" for i, t in enumerate(tokens)]


def stage_panels(panels: Sequence[tuple[str, np.ndarray, str]], tokens: Sequence[str], title: str,
                 followed: int | None = None, signed: bool = True) -> go.Figure:
    """Matrices over the tokens side by side, one row per token (the same rows in every panel): panels are
    (title, matrix [T, X], what the columns are). The followed token's row is marked on the left."""
    rows = labels_of(tokens)
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[p[0] for p in panels])
    for c, (name, matrix, x_title) in enumerate(panels, start=1):
        z = as_f32(matrix)
        finite = z[np.isfinite(z)]
        bound = float(np.quantile(np.abs(finite), 0.99)) if finite.size else 1.0
        limits = ({"zmin": -bound or -1, "zmax": bound or 1, "zmid": 0.0, "reversescale": True} if signed
                  else {"zmin": 0.0, "zmax": float(finite.max()) if finite.size else 1.0})
        fig.add_trace(go.Heatmap(
            z=z, y=rows, colorscale=SIGNED_COLORS if signed else ATTENTION_COLORS, showscale=c == len(panels),
            colorbar={"thickness": 10, "len": 0.8}, name=name,
            hovertemplate=f"%{{y}}, {x_title} %{{x}}: %{{z:.4f}}<extra>{escaped(name)}</extra>", **limits),
            row=1, col=c)
        fig.update_xaxes(title_text=x_title, row=1, col=c)
    base_layout(fig, title, min(820, 170 + 18 * len(tokens)), top=80)
    fig.update_yaxes(type="category", autorange="reversed", tickfont={"size": 10})
    if followed is not None and 0 <= followed < len(tokens):
        fig.update_yaxes(tickvals=rows, ticktext=[f"▶ {r}" if i == followed else r for i, r in enumerate(rows)],
                         row=1, col=1)
    return fig


def token_bars(tokens: Sequence[str], values: np.ndarray, title: str, y_title: str,
               followed: int | None = None) -> go.Figure:
    """One number per token as bars, the followed token's in red."""
    values = np.asarray(values, dtype=np.float64)
    colors = [CHOSEN_COLOR if i == followed else KEPT_COLOR for i in range(len(values))]
    fig = go.Figure(go.Bar(x=labels_of(tokens), y=values, marker_color=colors,
                           hovertemplate="%{x}: %{y:.4f}<extra></extra>"))
    base_layout(fig, title, 300)
    fig.update_xaxes(type="category", tickangle=-60 if len(tokens) > 12 else 0, tickfont={"size": 10})
    fig.update_yaxes(title_text=y_title)
    return fig


def rotation_figure(angles: np.ndarray, before: np.ndarray, after: np.ndarray, title: str) -> go.Figure:
    """RoPE on one query: each frequency pair i rotates by m·θ_i (angles [pairs], radians, wrapped to [0, 2π)).
    before and after [pairs, 2]: the pair's two coordinates before and after the rotation; the rotation keeps
    each pair's length, so the lengths are drawn too."""
    pairs = np.arange(len(angles))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("the angle m·θ_i of each pair", "each pair's 2-D vector"),
                        horizontal_spacing=0.1)
    fig.add_trace(go.Scatter(x=pairs, y=np.mod(angles, 2 * np.pi), mode="lines+markers", name="angle",
                             hovertemplate="pair %{x}: %{y:.3f} rad<extra></extra>"), row=1, col=1)
    for name, vectors, color in (("before RoPE", before, CUT_COLOR), ("after RoPE", after, KEPT_COLOR)):
        vectors = as_f32(vectors)
        fig.add_trace(go.Scatter(x=vectors[:, 0], y=vectors[:, 1], mode="markers", name=name,
                                 marker={"color": color, "size": 7}, customdata=pairs,
                                 hovertemplate=f"{name}, pair %{{customdata}}: (%{{x:.3f}}, %{{y:.3f}})"
                                               "<extra></extra>"), row=1, col=2)
    base_layout(fig, title, 360, top=80)
    fig.update_xaxes(title_text="frequency pair i (fast to slow)", row=1, col=1)
    fig.update_yaxes(title_text="radians (mod 2π)", row=1, col=1)
    fig.update_yaxes(scaleanchor="x2", row=1, col=2)
    return fig


def score_terms_figure(panels: Sequence[tuple[str, np.ndarray, str]], labels: Sequence[str],
                       title: str) -> go.Figure:
    """Eq. 2.1 term by term for one head, one panel each, side by side: panels are (title, matrix [T, T], kind),
    kind "score" (signed, one colour scale shared by the score panels), "bias" (signed, its own scale) or
    "weights" (0 to 1). Masked cells (−∞, or NaN) are drawn grey. labels: "position token" per row and column,
    the same as the figure of the three stages, so a click on a cell reads the same way."""
    shown = [escaped(label) for label in labels]
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, horizontal_spacing=0.025,
                        subplot_titles=[p[0] for p in panels])
    bound = score_bound([m for _, m, kind in panels if kind == "score"])
    bars = {"score": 1.0, "bias": 0.64, "weights": 0.28}   # the top of each kind's colour bar, at the right edge
    for c, (name, matrix, kind) in enumerate(panels, start=1):
        z = as_f32(matrix)
        z = np.where(np.isfinite(z), z, np.nan)
        if kind == "weights":
            limits = {"colorscale": ATTENTION_COLORS, "zmin": 0.0, "zmax": 1.0}
        else:
            edge = bound if kind == "score" else score_bound([z])
            limits = {"colorscale": SIGNED_COLORS, "reversescale": True, "zmid": 0.0, "zmin": -edge, "zmax": edge}
        first = next(i for i, p in enumerate(panels) if p[2] == kind) == c - 1      # one colour bar per kind
        fig.add_trace(go.Heatmap(
            z=z, x=shown, y=shown, showscale=first, hoverongaps=False, name=name,
            colorbar={"thickness": 10, "len": 0.26, "y": bars[kind], "yanchor": "top", "x": 1.02,
                      "title": {"text": kind}},
            hovertemplate=f"query %{{y}} → key %{{x}}<br>%{{z:.3f}}<extra>{escaped(name)}</extra>", **limits),
            row=1, col=c)
    base_layout(fig, title, 420, top=80)
    fig.update_xaxes(type="category", tickangle=-60, tickfont={"size": 8})
    fig.update_yaxes(type="category", autorange="reversed", tickfont={"size": 8})
    fig.update_annotations(font_size=11)  # the panel titles
    fig.update_layout(plot_bgcolor=MASKED_COLOR)
    return fig


def next_token_figure(tokens: Sequence[str], probs: np.ndarray, kept: np.ndarray, title: str) -> go.Figure:
    """The most likely next tokens after temperature, kept (blue) or cut by top-k / top-p (grey)."""
    probs = np.asarray(probs, dtype=np.float64)
    labels = [f"{i + 1}. {escaped(t)}" for i, t in enumerate(tokens)]
    fig = go.Figure(go.Bar(x=probs, y=labels, orientation="h",
                           marker_color=[KEPT_COLOR if k else CUT_COLOR for k in kept],
                           text=[f"{p:.3f}" for p in probs], textposition="outside", cliponaxis=False,
                           hovertemplate="%{y}<br>p = %{x:.4f}<extra></extra>"))
    base_layout(fig, title, 380)
    fig.update_yaxes(type="category", autorange="reversed", automargin=True)
    fig.update_xaxes(title_text="probability after temperature",
                     range=[0, min(1.0, float(probs.max(initial=0)) * 1.25 + 0.02)])
    return fig


def decomposition_figure(matrix: np.ndarray, query_labels: Sequence[str], key_labels: Sequence[str],
                         title: str, after: Sequence[tuple[str, float, str]] = ()) -> go.Figure:
    """A score as a sum over (query-side component, key-side component) pairs: matrix [Q, K], each cell that
    pair's share; the cells add up to the score before any cap. after: the score's later stages, drawn beside
    as a waterfall, each (label, value, measure): "absolute" for a value (the sum of the parts), "relative" for a
    step (what the soft-cap changes, the score bias added), "total" for the running sum (what softmax reads)."""
    z = as_f32(matrix)
    finite = z[np.isfinite(z)]
    bound = float(np.abs(finite).max()) if finite.size else 1.0
    heatmap = go.Heatmap(z=z, x=[escaped(k) for k in key_labels], y=[escaped(q) for q in query_labels],
                         colorscale=SIGNED_COLORS, reversescale=True, zmid=0.0, zmin=-(bound or 1), zmax=bound or 1,
                         colorbar={"title": {"text": "share"}, "x": 0.54 if after else 1.02},
                         hovertemplate="query side: %{y}<br>key side: %{x}<br>%{z:+.4f}<extra></extra>")
    height = min(760, 200 + 20 * len(query_labels))
    if not after:
        fig = go.Figure(heatmap)
        base_layout(fig, title, height, top=70)
        fig.update_xaxes(type="category", title_text="key side", tickangle=-60, tickfont={"size": 9})
        fig.update_yaxes(type="category", title_text="query side", autorange="reversed", tickfont={"size": 9})
        return fig
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.2,
                        subplot_titles=("the parts: they add up to the first bar", "then the later terms"))
    fig.add_trace(heatmap, row=1, col=1)
    labels, values, measures = zip(*after)
    fig.add_trace(go.Waterfall(x=[escaped(label) for label in labels], y=list(values), measure=list(measures),
                               text=[f"{v:+.3f}" for v in values], textposition="outside", cliponaxis=False,
                               hovertemplate="%{x}: %{y:+.4f}<extra></extra>", showlegend=False), row=1, col=2)
    base_layout(fig, title, max(height, 420), top=80)
    fig.update_xaxes(type="category", title_text="key side", tickangle=-60, tickfont={"size": 9}, row=1, col=1)
    fig.update_yaxes(type="category", title_text="query side", autorange="reversed", tickfont={"size": 9},
                     row=1, col=1)
    fig.update_xaxes(type="category", tickangle=-30, tickfont={"size": 9}, row=1, col=2)
    fig.update_yaxes(title_text="score", row=1, col=2)
    fig.update_annotations(font_size=11)
    return fig


def side_bars(query_parts: Sequence[tuple[str, float]], key_parts: Sequence[tuple[str, float]],
              title: str) -> go.Figure:
    """A score split by side: each query-side part against the whole key (above) and the whole query against
    each key-side part (below), each (label, value) largest first, a "rest" bar for the parts not named; each
    side's bars add up to the score."""
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.16,
                        subplot_titles=("query side: each part · the whole key", "key side: the whole query · each part"))
    for row, parts in ((1, query_parts), (2, key_parts)):
        labels, values = [escaped(label) for label, _ in parts], [value for _, value in parts]
        fig.add_trace(go.Bar(x=values, y=labels, orientation="h", showlegend=False,
                             marker_color=["#2a9d8f" if v >= 0 else "#e76f51" for v in values],
                             hovertemplate="%{y}: %{x:+.4f}<extra></extra>"), row=row, col=1)
        fig.update_yaxes(type="category", autorange="reversed", tickfont={"size": 10}, row=row, col=1)
        fig.update_xaxes(zeroline=True, zerolinecolor="#888", row=row, col=1)
    base_layout(fig, title, 120 + 26 * (len(query_parts) + len(key_parts)), top=70)
    fig.update_layout(margin={"l": 110})
    return fig


def content_position_figure(tokens: Sequence[str], series: dict[str, np.ndarray], query: int,
                            title: str) -> go.Figure:
    """For one query, each key's score under several readings (e.g. with and without the rotation), keys across."""
    keys = labels_of(tokens)
    fig = go.Figure()
    for name, values in series.items():
        fig.add_trace(go.Scatter(x=keys[:len(values)], y=np.asarray(values, dtype=np.float64), mode="lines+markers",
                                 name=escaped(name), hovertemplate="key %{x}: %{y:.3f}<extra>" + escaped(name)
                                 + "</extra>"))
    # the legend sits between the title and the plot: below it, slanted key labels push the axis title onto it
    base_layout(fig, title, 400, top=110)
    fig.update_xaxes(type="category", tickangle=-60 if len(tokens) > 12 else 0, tickfont={"size": 10},
                     title_text=f"key (the query is {query} {escaped(tokens[query])})")
    fig.update_yaxes(title_text="score")
    # the title at the very top, so a legend wrapped on a phone (three rows) still fits under it
    fig.update_layout(legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0},
                      title={"yref": "container", "y": 0.98, "yanchor": "top"})
    return fig


def geometry_figure(queries: np.ndarray, keys: np.ndarray, tokens: Sequence[str], title: str,
                    explained: Sequence[float] = (), subtitle: str | None = None) -> go.Figure:
    """Queries (circles) and keys (crosses) of one head in one plane, coloured by position, tokens on hover;
    subtitle: the plane's definition, in a smaller line under the title."""
    labels = labels_of(tokens)
    fig = go.Figure()
    for name, points, symbol in (("queries", queries, "circle"), ("keys", keys, "x")):
        points = as_f32(points)
        fig.add_trace(go.Scatter(
            x=points[:, 0], y=points[:, 1], mode="markers", name=name, text=labels[:len(points)],
            marker={"symbol": symbol, "size": 9, "color": np.arange(len(points)), "colorscale": "Viridis",
                    "showscale": name == "queries", "colorbar": {"title": {"text": "position"}, "thickness": 10}},
            hovertemplate=f"{name[:-1]} %{{text}}<extra></extra>"))
    base_layout(fig, title, 460)
    words = [f"{100 * e:.0f} %" for e in explained[:2]]
    fig.update_xaxes(title_text=f"component 1{' (' + words[0] + ' of the variance)' if words else ''}")
    fig.update_yaxes(title_text=f"component 2{' (' + words[1] + ')' if len(words) > 1 else ''}", scaleanchor="x")
    # the legend under the x axis' title, so a subtitle above the plot has the width to itself
    fig.update_layout(legend={"orientation": "h", "y": -0.22, "yanchor": "top", "x": 0, "xanchor": "left"},
                      margin={"b": 90})
    if subtitle:  # plotly clips a subtitle, never wraps it: lines that fit a phone-wide plot at 12 px
        lines = textwrap.wrap(subtitle, SUBTITLE_CHARS)
        fig.update_layout(title={"subtitle": {"text": "<br>".join(lines), "font": {"size": 12}}},
                          margin={"t": 64 + 16 * len(lines)})
    return fig
