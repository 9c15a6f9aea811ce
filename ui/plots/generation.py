"""The Generate tab's figures: next-token probabilities, one step's attention rows, every layer × head for one
token, and the KV cache's timing."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.plots.base import ATTENTION_COLORS, CHOSEN_COLOR, as_f32, base_layout, log_axis

OTHER_COLOR = "#9ecae1"
HEAD_COLOR = "#1f77b4"
MEAN_COLOR = "#ff7f0e"


def top_probs_figure(tokens: Sequence[str], probs: np.ndarray, chosen: int | None, title: str) -> go.Figure:
    """The model's most likely next tokens as horizontal bars, most likely on top; bar `chosen` (the picked
    token, None when it ranked lower) in red."""
    probs = np.asarray(probs, dtype=np.float64)
    if len(tokens) != len(probs):
        raise ValueError(f"top_probs_figure: {len(tokens)} tokens for {len(probs)} probabilities")
    labels = [f"{i + 1}. {t}" for i, t in enumerate(tokens)]
    colors = [CHOSEN_COLOR if i == chosen else OTHER_COLOR for i in range(len(tokens))]
    fig = go.Figure(go.Bar(x=probs, y=labels, orientation="h", marker_color=colors,
                           text=[f"{p:.3f}" for p in probs], textposition="outside", cliponaxis=False,
                           hovertemplate="%{y}<br>p = %{x:.4f}<extra></extra>"))
    base_layout(fig, title, 360)
    fig.update_yaxes(type="category", autorange="reversed", automargin=True)
    fig.update_xaxes(title_text="probability", range=[0, min(1.0, float(probs.max(initial=0)) * 1.25 + 0.02)])
    return fig


def _row_traces(keys: Sequence[str], head_row: np.ndarray, mean_row: np.ndarray, head: int, show_legend: bool):
    hover = "%{x}<br>%{y:.4f}<extra>%{fullData.name}</extra>"
    return [
        go.Bar(x=list(keys), y=as_f32(head_row), name=f"head {head}", marker_color=HEAD_COLOR,
               hovertemplate=hover, showlegend=show_legend),
        go.Scatter(x=list(keys), y=as_f32(mean_row), name="mean of heads", mode="lines+markers",
                   line={"color": MEAN_COLOR}, marker={"size": 4}, hovertemplate=hover, showlegend=show_legend),
    ]


def step_rows_figure(keys: Sequence[str], head_row: np.ndarray, mean_row: np.ndarray, head: int, title: str,
                     source_keys: Sequence[str] | None = None, cross_head: np.ndarray | None = None,
                     cross_mean: np.ndarray | None = None) -> go.Figure:
    """One generated token's attention row over its context: the chosen head (bars) and the mean of the
    layer's heads (line); with a source, its cross-attention row below."""
    if len(keys) != len(head_row) or len(keys) != len(mean_row):
        raise ValueError(f"step_rows_figure: {len(keys)} keys for rows of {len(head_row)} and {len(mean_row)}")
    cross = source_keys is not None and cross_head is not None and cross_mean is not None
    if not cross:
        fig = go.Figure(_row_traces(keys, head_row, mean_row, head, True))
        base_layout(fig, title, 360)
        fig.update_xaxes(title_text="key (earlier token)", type="category", tickangle=-60, automargin=True)
        fig.update_yaxes(title_text="weight", rangemode="tozero")
        fig.update_layout(legend={"orientation": "h", "y": 1.12})
        return fig
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.25,
                        subplot_titles=("self-attention over the target so far", "cross-attention over the source"))
    for trace in _row_traces(keys, head_row, mean_row, head, True):
        fig.add_trace(trace, row=1, col=1)
    for trace in _row_traces(source_keys, cross_head, cross_mean, head, False):
        fig.add_trace(trace, row=2, col=1)
    base_layout(fig, title, 560)
    fig.update_xaxes(type="category", tickangle=-60, automargin=True)
    fig.update_yaxes(title_text="weight", rangemode="tozero")
    fig.update_layout(legend={"orientation": "h", "y": 1.12})
    return fig


def _overview_trace(weights: np.ndarray, keys: Sequence[str], n_heads: int, show_scale: bool) -> go.Heatmap:
    weights = as_f32(weights)
    n_layers = weights.shape[0] // n_heads
    y = [f"L{layer} H{head}" for layer in range(n_layers) for head in range(n_heads)]  # "1.3" reads as a decimal
    top = float(weights.max(initial=0.0)) or 1.0
    return go.Heatmap(z=weights, x=list(keys), y=y, colorscale=ATTENTION_COLORS, zmin=0.0, zmax=top,
                      showscale=show_scale, colorbar={"title": {"text": "weight"}},
                      hovertemplate="%{y} → %{x}<br>weight %{z:.4f}<extra></extra>")


def step_overview_figure(weights: np.ndarray, keys: Sequence[str], n_heads: int, title: str,
                         cross: np.ndarray | None = None, source_keys: Sequence[str] | None = None) -> go.Figure:
    """Every layer × head's row for one query: weights [L·H, keys] (rows "L3 H2", layer 0 on top);
    with `cross` [L·H, source keys] beside it."""
    if weights.shape[1] != len(keys):
        raise ValueError(f"step_overview_figure: {weights.shape[1]} columns for {len(keys)} keys")
    height = min(1400, max(320, 6 * weights.shape[0] + 140))
    if cross is None:
        fig = go.Figure(_overview_trace(weights, keys, n_heads, True))
    else:
        fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                            subplot_titles=("self-attention", "cross-attention over the source"))
        fig.add_trace(_overview_trace(weights, keys, n_heads, False), row=1, col=1)
        fig.add_trace(_overview_trace(cross, source_keys, n_heads, True), row=1, col=2)
    base_layout(fig, title, height)
    fig.update_xaxes(type="category", tickangle=-60, automargin=True)
    fig.update_yaxes(type="category", autorange="reversed", title_text="layer and head", automargin=True)
    return fig


def kv_timing_figure(lengths: Sequence[int], uncached: Sequence[float], cached: Sequence[float],
                     step_lengths: Sequence[int], uncached_steps: Sequence[float], cached_steps: Sequence[float],
                     title: str) -> go.Figure:
    """Seconds for one new token against the context length, with and without the KV cache (log-log): the grid
    measurements as lines, the timed continuation's own steps as dots."""
    fig = go.Figure()
    for name, xs, ys, color, mode in (
        ("without cache: one pass over all n tokens", lengths, uncached, CHOSEN_COLOR, "lines+markers"),
        ("with cache: one decode step", lengths, cached, HEAD_COLOR, "lines+markers"),
        ("continuation, without cache", step_lengths, uncached_steps, CHOSEN_COLOR, "markers"),
        ("continuation, with cache", step_lengths, cached_steps, HEAD_COLOR, "markers"),
    ):
        if len(xs) != len(ys):
            raise ValueError(f"kv_timing_figure: {len(xs)} lengths for {len(ys)} times in {name!r}")
        marker = {"symbol": "circle-open", "size": 6} if mode == "markers" else {"size": 7}
        fig.add_trace(go.Scatter(x=list(xs), y=[1000 * float(y) for y in ys], mode=mode, name=name,
                                 line={"color": color}, marker={"color": color, **marker},
                                 hovertemplate="n = %{x}<br>%{y:.1f} ms<extra></extra>"))
    base_layout(fig, title, 380)
    fig.update_xaxes(title_text="context length n (tokens)", **log_axis(lengths, step_lengths))
    fig.update_yaxes(title_text="ms per new token", **log_axis(*(np.asarray(t.y, float) for t in fig.data)))
    fig.update_layout(legend={"orientation": "h", "y": -0.3})
    return fig
