"""Plotly figures of the Lab tab, from plain arrays: training curves and grids of attention maps.

Nothing here knows about torch, Gradio or the training engine; ui/services/lab computes the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.plots.base import ATTENTION_COLORS, base_layout, empty_figure, log_axis

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")  # one per run in an overlay


@dataclass
class Curve:
    """One run's measurements: training loss every step, held-out loss and exact match at each evaluation."""

    name: str
    steps: np.ndarray  # [N]
    train_loss: np.ndarray  # [N]
    eval_steps: np.ndarray  # [E]
    held_loss: np.ndarray  # [E]
    exact_match: np.ndarray  # [E], 0..1


def training_curves(curves: Sequence[Curve], title: str, total_steps: int | None = None) -> go.Figure:
    """Loss (training every step, held-out at evaluations; log scale) above held-out exact match, one colour per
    run, so that two runs of a comparison overlay."""
    if not curves:
        return empty_figure("No run yet: press Train.")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.62, 0.38], vertical_spacing=0.08,
                        subplot_titles=("loss (cross-entropy, nats per target token)",
                                        "held-out exact match (free-running greedy)"))
    for i, c in enumerate(curves):
        colour = COLOURS[i % len(COLOURS)]
        # NaN losses (a diverged run) would break the log axis; plotly leaves gaps for None
        train = np.where(np.isfinite(c.train_loss), c.train_loss, np.nan).astype(np.float32)
        fig.add_trace(go.Scatter(x=np.asarray(c.steps, dtype=np.int32), y=train, mode="lines",
                                 name=f"{c.name}: training", legendgroup=c.name, line={"color": colour, "width": 1.5},
                                 hovertemplate="step %{x}<br>training loss %{y:.4f}<extra>" + c.name + "</extra>"),
                      row=1, col=1)
        if len(c.eval_steps):
            fig.add_trace(go.Scatter(x=np.asarray(c.eval_steps, dtype=np.int32),
                                     y=np.asarray(c.held_loss, dtype=np.float32), mode="lines+markers",
                                     name=f"{c.name}: held-out", legendgroup=c.name,
                                     line={"color": colour, "dash": "dash"}, marker={"size": 7},
                                     hovertemplate="step %{x}<br>held-out loss %{y:.4f}<extra>" + c.name + "</extra>"),
                          row=1, col=1)
            fig.add_trace(go.Scatter(x=np.asarray(c.eval_steps, dtype=np.int32),
                                     y=100 * np.asarray(c.exact_match, dtype=np.float32), mode="lines+markers",
                                     name=f"{c.name}: exact match", legendgroup=c.name, showlegend=False,
                                     line={"color": colour}, marker={"size": 7},
                                     hovertemplate="step %{x}<br>exact match %{y:.1f} %<extra>" + c.name + "</extra>"),
                          row=2, col=1)
    base_layout(fig, title, 560, top=70)
    losses = [np.asarray(t.y, float) for t in fig.data if t.yaxis in (None, "y")]
    fig.update_yaxes(**log_axis(*losses), row=1, col=1)
    fig.update_yaxes(range=[-3, 103], ticksuffix=" %", row=2, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    if total_steps:
        fig.update_xaxes(range=[0, total_steps * 1.02])
    fig.update_layout(legend={"orientation": "h", "y": -0.14}, hovermode="closest",
                      meta={"runs": [c.name for c in curves]})
    return fig


def token_labels(tokens: Sequence[str]) -> list[str]:
    """Unique axis labels "3 a" (plotly merges equal category names); a space is shown as ␣."""
    return [f"{i} {'␣' if t == ' ' else t}" for i, t in enumerate(tokens)]


def heatmap_grid(maps: np.ndarray, row_names: Sequence[str], col_names: Sequence[str], query_tokens: Sequence[str],
                 key_tokens: Sequence[str], title: str, query_axis: str = "query", key_axis: str = "key") -> go.Figure:
    """maps [R, C, Q, K]: one attention map per tile (e.g. layers × heads, or snapshot steps × layers), rows
    summing to 1, all on one 0..1 colour scale, with token labels on the outer axes and in the hover."""
    maps = np.ascontiguousarray(np.asarray(maps, dtype=np.float32))
    if maps.ndim != 4:
        raise ValueError(f"heatmap_grid wants [rows, cols, queries, keys], got shape {maps.shape}")
    n_rows, n_cols, n_q, n_k = maps.shape
    if (len(row_names), len(col_names), len(query_tokens), len(key_tokens)) != (n_rows, n_cols, n_q, n_k):
        raise ValueError(f"heatmap_grid: maps {maps.shape} do not match {len(row_names)} row names, "
                         f"{len(col_names)} column names, {len(query_tokens)} query and {len(key_tokens)} key tokens")
    ys, xs = token_labels(query_tokens), token_labels(key_tokens)
    fig = make_subplots(rows=n_rows, cols=n_cols, subplot_titles=[f"{r}, {c}" for r in row_names for c in col_names],
                        horizontal_spacing=min(0.04, 0.6 / max(1, n_cols)),
                        vertical_spacing=min(0.06, 0.5 / max(1, n_rows)))
    for r in range(n_rows):
        for c in range(n_cols):
            fig.add_trace(go.Heatmap(z=maps[r, c], x=xs, y=ys, colorscale=ATTENTION_COLORS, zmin=0.0, zmax=1.0,
                                     showscale=(r == 0 and c == 0), colorbar={"title": {"text": "weight"}},
                                     hovertemplate=f"{query_axis} %{{y}} → {key_axis} %{{x}}<br>weight %{{z:.3f}}"
                                                   f"<extra>{row_names[r]}, {col_names[c]}</extra>"),
                          row=r + 1, col=c + 1)
    side = max(n_q, n_k)
    tile_px = int(np.clip(900 / max(n_cols, 1), 120, 14 * side + 60))
    base_layout(fig, title, height=min(2400, 90 + n_rows * (tile_px + 30)), top=70)
    small = {"size": 8 if side > 16 else 10}
    fig.update_xaxes(type="category", tickangle=-90, tickfont=small, showticklabels=False)
    fig.update_yaxes(type="category", autorange="reversed", tickfont=small, showticklabels=False)
    for c in range(n_cols):
        fig.update_xaxes(showticklabels=True, row=n_rows, col=c + 1)
    for r in range(n_rows):
        fig.update_yaxes(showticklabels=True, row=r + 1, col=1)
    fig.update_annotations(font={"size": 11})
    fig.update_layout(meta={"rows": list(row_names), "cols": list(col_names), "queries": n_q, "keys": n_k})
    return fig


@dataclass
class KindLine:
    """One kind of position in the extrapolation figures: accuracy per tested length (None where the model cannot
    read that length), and accuracy at each target place of the longest tested length (empty where refused)."""

    kind: str
    accuracy: list[float | None]  # [len(lengths)], 0..1
    by_place: list[float]  # [symbols + 1]: each copied symbol, then <eos>


KIND_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#7f7f7f")


def extrapolation_accuracy(lines: Sequence[KindLine], lengths: Sequence[int], trained: int, chance: float,
                           title: str) -> go.Figure:
    """Left: accuracy against the number of symbols copied, one line per kind, the longest trained length marked;
    a kind with no number at a length (no row in its table) has no point there. Right: accuracy at each place of
    the longest copy, which shows where past the trained length each kind breaks."""
    if not lines:
        return empty_figure("No result yet: press Train and test.")
    longest = max(lengths)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("accuracy by length (symbols copied)", f"accuracy by place, {longest} symbols"))
    for i, line in enumerate(lines):
        colour = KIND_COLOURS[i % len(KIND_COLOURS)]
        y = [None if a is None else 100 * a for a in line.accuracy]
        fig.add_trace(go.Scatter(x=list(lengths), y=y, mode="lines+markers", name=line.kind, legendgroup=line.kind,
                                 line={"color": colour}, marker={"size": 8},
                                 hovertemplate="%{x} symbols<br>accuracy %{y:.1f} %<extra>" + line.kind + "</extra>"),
                      row=1, col=1)
        if line.by_place:
            places = list(range(1, len(line.by_place) + 1))
            fig.add_trace(go.Scatter(x=places, y=[100 * a for a in line.by_place], mode="lines", name=line.kind,
                                     legendgroup=line.kind, showlegend=False, line={"color": colour, "width": 1.5},
                                     hovertemplate="place %{x}<br>accuracy %{y:.1f} %<extra>" + line.kind +
                                                   "</extra>"),
                          row=1, col=2)
    for col, x in ((1, trained), (2, trained + 0.5)):
        fig.add_vline(x=x, line={"dash": "dot", "color": "#555"}, row=1, col=col)
    fig.add_hline(y=100 * chance, line={"dash": "dash", "color": "#bbb"}, row=1, col=1)
    fig.add_annotation(x=trained, y=104, text=f"trained ≤ {trained}", showarrow=False, xanchor="left", yanchor="bottom",
                       font={"size": 10}, row=1, col=1)
    base_layout(fig, title, 420, top=80)
    fig.update_yaxes(range=[-3, 110], ticksuffix=" %")
    fig.update_xaxes(tickvals=list(lengths), title_text="symbols copied", row=1, col=1)
    fig.update_xaxes(title_text=f"place in the copy (place {longest + 1}: the end token)", row=1, col=2)
    fig.update_layout(legend={"orientation": "h", "y": -0.25}, hovermode="closest",
                      meta={"kinds": [line.kind for line in lines], "lengths": list(lengths)})
    return fig


@dataclass
class HeadPanel:
    """One kind's chosen head on one text: weights [T, T] and the text's tokens, or a reason in place of a map."""

    title: str
    weights: np.ndarray | None
    tokens: Sequence[str]


def attention_panels(panels: Sequence[HeadPanel], title: str, columns: int = 3) -> go.Figure:
    """One attention map per panel, each of its own size, on one 0..1 colour scale; a panel without a map shows
    its reason as text."""
    if not panels:
        return empty_figure("No result yet: press Train and test.")
    columns = min(columns, len(panels))
    rows = -(-len(panels) // columns)
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=[p.title for p in panels],
                        horizontal_spacing=0.06, vertical_spacing=0.1)
    for i, panel in enumerate(panels):
        r, c = divmod(i, columns)
        if panel.weights is None:
            fig.add_trace(go.Scatter(x=[0], y=[0], mode="text", text=["no map"], showlegend=False,
                                     hoverinfo="skip"), row=r + 1, col=c + 1)
            continue
        labels = token_labels(panel.tokens)
        fig.add_trace(go.Heatmap(z=np.asarray(panel.weights, dtype=np.float32), x=labels, y=labels,
                                 colorscale=ATTENTION_COLORS, zmin=0.0, zmax=1.0, showscale=i == 0,
                                 colorbar={"title": {"text": "weight"}},
                                 hovertemplate="query %{y} → key %{x}<br>weight %{z:.3f}<extra>" + panel.title +
                                               "</extra>"),
                      row=r + 1, col=c + 1)
    base_layout(fig, title, 120 + rows * 330, top=80)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    fig.update_annotations(font={"size": 11})
    fig.update_layout(meta={"panels": [p.title for p in panels]})
    return fig
