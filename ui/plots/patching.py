"""The Patching tab's figures: a patching sweep as a heatmap, direct logit attribution per head with an MLP bar,
the information-flow graph (tokens across, layers up), and exact patching against each cheap estimate of it
(shortcut_scatter). Token labels are escaped: Plotly reads a few tags in
text, and a token may be one. A point that names a head carries customdata "layer.head", which the page reads on
a click to open that head (an attention edge of the flow graph: its strongest head)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.plots.base import SIGNED_COLORS, as_f32, base_layout, fit_narrow
from ui.plots.text import escaped

EDGE_COLORS = {"attention": "#1f77b4", "mlp": "#ff7f0e", "residual": "#b0b0b0"}
HOVER_HEADS = 8  # heads listed in an attention edge's hover; the CSV has them all


def signed_limits(values: np.ndarray, at_least: float = 0.0) -> dict:
    finite = values[np.isfinite(values)]
    bound = max(float(np.abs(finite).max()) if finite.size else 0.0, at_least) or 1.0
    return {"zmin": -bound, "zmax": bound, "zmid": 0.0, "reversescale": True}


def colour_bar(title: str, ticks: dict[float, str] | None) -> dict:
    """A colour bar titled `title`, its ticks in words where given ({1: "1 no change"}); the limits are ≥ 1."""
    bar = {"title": {"text": title}}
    if ticks:
        bar.update(tickmode="array", tickvals=list(ticks), ticktext=[escaped(t) for t in ticks.values()])
    return bar


def token_axis(fig: go.Figure, tokens: Sequence[str], title: str, **where) -> None:
    """Every token labelled ("3 ␣John"), rotated when there are many."""
    labels = [f"{i} {escaped(t)}" for i, t in enumerate(tokens)]
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(tokens))), ticktext=labels, title_text=title,
                     tickangle=-60 if len(tokens) > 12 else 0, tickfont={"size": 11 if len(tokens) <= 32 else 9},
                     **where)


def patch_heatmap(scores: np.ndarray, metrics: np.ndarray, rows: str, cols: str, tokens: Sequence[str],
                  title: str, layer: int | None = None, value_name: str = "restored",
                  scale_ticks: dict[float, str] | None = None) -> go.Figure:
    """scores [R, C] (1: the clean run's metric, 0: the corrupted run's), metrics the raw logit differences.
    rows/cols name the axes: "layer", "head" or "position"; positions are labelled with tokens. value_name is
    what a cell is called (the colour bar's title and its hover) and scale_ticks what the bar's values mean
    (they differ by direction: what comes back when denoising, what stays when noising). A [layer, head] map is
    drawn with layers across and heads down, like the Heads tab's maps; a [head, position] map is of one
    `layer`."""
    scores, metrics = as_f32(scores), as_f32(metrics)
    if scores.shape != metrics.shape or scores.ndim != 2:
        raise ValueError(f"patch_heatmap: scores {scores.shape} and metrics {metrics.shape} must be the same 2-D shape")
    heads_across = (rows, cols) == ("layer", "head")
    z, custom = (scores.T, metrics.T) if heads_across else (scores, metrics)
    y_name, x_name = (cols, rows) if heads_across else (rows, cols)
    n_y, n_x = z.shape
    head_ids = np.full(z.shape, "", dtype=object)
    if heads_across:
        head_ids = np.array([[f"{x}.{y}" for x in range(n_x)] for y in range(n_y)], dtype=object)
    elif rows == "head" and layer is not None:
        head_ids = np.array([[f"{layer}.{y}"] * n_x for y in range(n_y)], dtype=object)
    x_text = [escaped(t) for t in tokens] if x_name == "position" else [str(i) for i in range(n_x)]
    text = np.array([[x_text[x] for x in range(n_x)] for _ in range(n_y)], dtype=object)
    fig = go.Figure(go.Heatmap(
        z=np.ascontiguousarray(z), x=np.arange(n_x), y=np.arange(n_y), colorscale=SIGNED_COLORS,
        customdata=np.dstack([custom.astype(object), head_ids, text]),
        colorbar=colour_bar(value_name, scale_ticks),
        hovertemplate=(f"{y_name} %{{y}}, {x_name} %{{x}} %{{customdata[2]}}<br>{value_name} %{{z:.3f}} "
                       "(logit difference %{customdata[0]:.3f})<extra></extra>"),
        **signed_limits(z, 1.0)))
    base_layout(fig, title, min(720, max(300, 160 + 22 * n_y)), top=70)   # room for the colour bar's words
    if x_name == "position":
        token_axis(fig, tokens, "position (token)")
    else:
        fig.update_xaxes(title_text=x_name, dtick=1 if n_x <= 32 else None)
    fig.update_yaxes(title_text=y_name, autorange="reversed", dtick=1 if n_y <= 32 else None)
    return fig


def logit_attribution_figure(heads: np.ndarray, mlps: np.ndarray, title: str) -> go.Figure:
    """heads [L, H] and mlps [L]: each one's direct part of the logit difference; layers across, heads down,
    the MLPs as bars under the same layers."""
    heads, mlps = as_f32(heads), as_f32(mlps)
    n_layers, n_heads = heads.shape
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.12,
                        subplot_titles=("each head's output z·W_O", "each MLP's output"))
    ids = np.array([[f"{layer}.{head}" for layer in range(n_layers)] for head in range(n_heads)], dtype=object)
    both = np.concatenate([heads.ravel(), mlps])
    fig.add_trace(go.Heatmap(
        z=np.ascontiguousarray(heads.T), x=np.arange(n_layers), y=np.arange(n_heads), colorscale=SIGNED_COLORS,
        customdata=ids, colorbar={"title": {"text": "logit diff"}, "len": 0.7, "y": 0.64},
        hovertemplate="L%{x} H%{y}: %{z:+.3f}<extra></extra>", **signed_limits(both)), row=1, col=1)
    fig.add_trace(go.Bar(x=np.arange(n_layers), y=mlps, marker_color=np.where(mlps >= 0, "#b2182b", "#2166ac"),
                         hovertemplate="MLP %{x}: %{y:+.3f}<extra></extra>", showlegend=False), row=2, col=1)
    base_layout(fig, title, min(760, 260 + 26 * n_heads), top=80)
    fig.update_yaxes(title_text="head", autorange="reversed", dtick=1 if n_heads <= 32 else None, row=1, col=1)
    fig.update_yaxes(title_text="logit diff", row=2, col=1)
    fig.update_xaxes(title_text="layer", dtick=1 if n_layers <= 40 else None, row=2, col=1)
    return fig


def head_list(heads: Sequence[tuple[int, float]], layer: int) -> str:
    """"L3 H2 0.12, L3 H5 0.04": an attention edge's heads, strongest first, the first HOVER_HEADS of them."""
    shown = ", ".join(f"L{layer} H{h} {part:.2f}" for h, part in heads[:HOVER_HEADS])
    more = len(heads) - HOVER_HEADS
    return shown + (f" … ({more} more)" if more > 0 else "") if shown else "no head above 0"


def flow_figure(tokens: Sequence[str], n_layers: int, edges: Sequence[tuple], position: int, title: str) -> go.Figure:
    """The flow graph: tokens across, levels up (2l: entering layer l, 2l + 1: after its attention, 2L: the
    output). edges: (kind, layer, head, source, target, level, importance, heads), the source at level − 1;
    an attention edge's head is its strongest and heads its (head, part) pairs, strongest first. Line width
    ∝ importance; an attention edge's midpoint carries its hover (its heads), its strongest head's "layer.head"
    and "edge layer.target.source" for a click, an MLP edge is a square on its token between the two levels."""
    fig = go.Figure()
    labels = [escaped(t) for t in tokens]
    widths = (0.08, 0.2, 0.4, 1.01)
    for kind in ("residual", "attention"):
        for low, high in zip((0.0, *widths[:-1]), widths):   # one trace per width band: few traces, any edges
            xs, ys = [], []
            for e in edges:
                if e[0] == kind and low <= e[6] < high:
                    xs += [e[3], e[4], None]
                    ys += [e[5] - 1, e[5], None]
            if xs:
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                         line={"color": EDGE_COLORS[kind], "width": 1 + 7 * high},
                                         opacity=0.8 if kind == "attention" else 0.6))
    # an edge with no head above 0 (kept only at threshold 0) has no head to open: drawn, but not a point
    attention = [e for e in edges if e[0] == "attention" and e[2] is not None]
    if attention:
        fig.add_trace(go.Scatter(
            x=[(e[3] + e[4]) / 2 for e in attention], y=[e[5] - 0.5 for e in attention], mode="markers",
            marker={"size": 7, "color": EDGE_COLORS["attention"], "opacity": 0.35}, name="attention edge",
            customdata=[[f"{e[1]}.{e[2]}", labels[e[3]], labels[e[4]], e[6],
                         head_list(e[7], e[1]), e[1], f"edge {e[1]}.{e[4]}.{e[3]}"] for e in attention],
            hovertemplate=("layer %{customdata[5]} attention: %{customdata[1]} → %{customdata[2]}, importance "
                           "%{customdata[3]:.2f} (its heads summed)<br>heads: %{customdata[4]}<br>click: why this "
                           "edge (its heads' query and key, traced)<extra></extra>")))
    mlps = [e for e in edges if e[0] == "mlp"]
    if mlps:
        fig.add_trace(go.Scatter(
            x=[e[4] for e in mlps], y=[e[5] - 0.5 for e in mlps], mode="markers", name="MLP",
            marker={"symbol": "square", "color": EDGE_COLORS["mlp"], "size": [6 + 14 * e[6] for e in mlps]},
            customdata=[[e[1], labels[e[4]], e[6]] for e in mlps],
            hovertemplate="MLP %{customdata[0]} at %{customdata[1]}, importance %{customdata[2]:.2f}<extra></extra>"))
    nodes = sorted({(e[5] - 1, e[3]) for e in edges} | {(e[5], e[4]) for e in edges} | {(2 * n_layers, position)})
    fig.add_trace(go.Scatter(x=[t for _, t in nodes], y=[lv for lv, _ in nodes], mode="markers", name="state",
                             marker={"size": 5, "color": "#333333"}, hoverinfo="skip", showlegend=False))
    base_layout(fig, title, min(1100, 220 + 18 * n_layers), top=70)
    token_axis(fig, tokens, "token", range=[-0.6, len(tokens) - 0.4])
    step = max(1, n_layers // 15)
    fig.update_yaxes(tickmode="array", tickvals=[2 * layer for layer in range(0, n_layers, step)] + [2 * n_layers],
                     ticktext=[f"layer {layer}" for layer in range(0, n_layers, step)] + ["output"],
                     title_text="", range=[-0.8, 2 * n_layers + 0.8])
    fig.update_layout(legend={"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right"})
    return fig


# ---- how good are the shortcuts: one scatter panel per method ----

COLUMNS = 2          # panels per row
PANEL_HEIGHT = 300   # px per row of panels
DIAGONAL = "#b0b0b0"


def number(value: float, digits: int = 2) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def panel_title(method: str, rho: float, overlap: float, k: int, cost: float, signed: bool) -> str:
    """Short lines, so a panel half a phone wide holds them."""
    against = "" if signed else " vs |exact|"
    return (f"<b>{escaped(method)}</b><br>ρ {number(rho)}{against}<br>top-{k} overlap {number(overlap)}<br>"
            f"cost {number(cost, 1)} passes")


def shortcut_scatter(exact: np.ndarray, estimates: Sequence[np.ndarray], methods: Sequence[str],
                     rhos: Sequence[float], overlaps: Sequence[float], costs: Sequence[float],
                     signed: Sequence[bool], names: Sequence[str], k: int, exact_cost: float,
                     title: str) -> go.Figure:
    """exact [N] (the exact normalised effect of each compared cell), estimates[m] [N] (method m's value on the
    same cells), names [N] the cells. One panel per method: x the exact effect, y the estimate; a signed
    estimate gets the diagonal y = x (where a perfect estimate lies), an unsigned one (the flow graph) none."""
    exact = as_f32(exact)
    if exact.ndim != 1 or any(as_f32(e).shape != exact.shape for e in estimates) or len(names) != exact.size:
        raise ValueError("exact, every estimate and names must have one value per compared cell")
    if not len(estimates) == len(methods) == len(rhos) == len(overlaps) == len(costs) == len(signed):
        raise ValueError("each method needs its estimate, ρ, overlap, cost and sign")
    rows = max(1, math.ceil(len(methods) / COLUMNS))
    titles = [panel_title(m, r, o, k, c, s) for m, r, o, c, s in zip(methods, rhos, overlaps, costs, signed)]
    fig = make_subplots(rows=rows, cols=COLUMNS, subplot_titles=titles, horizontal_spacing=0.14,
                        vertical_spacing=0.3 / rows + 0.1)
    labels = [escaped(n) for n in names]
    low, high = float(np.nanmin(exact)) if exact.size else 0.0, float(np.nanmax(exact)) if exact.size else 1.0
    for i, (method, estimate, is_signed) in enumerate(zip(methods, estimates, signed)):
        row, col = i // COLUMNS + 1, i % COLUMNS + 1
        estimate = as_f32(estimate)
        fig.add_trace(go.Scatter(
            x=exact, y=estimate, mode="markers", name=escaped(method), customdata=labels, showlegend=False,
            marker={"size": 6, "opacity": 0.7},
            hovertemplate=f"%{{customdata}}<br>exact %{{x:.3f}}<br>{escaped(method)} %{{y:.3f}}<extra></extra>"),
            row=row, col=col)
        if is_signed:
            fig.add_trace(go.Scatter(x=[low, high], y=[low, high], mode="lines", showlegend=False,
                                     hoverinfo="skip", line={"color": DIAGONAL, "dash": "dot", "width": 1}),
                          row=row, col=col)
        fig.update_xaxes(title_text="exact patching", row=row, col=col)
        fig.update_yaxes(title_text="estimate" if is_signed else "importance", row=row, col=col)
    fig.update_annotations(font={"size": 11})
    base_layout(fig, f"{title} (exact sweep: {number(exact_cost, 1)} passes)", PANEL_HEIGHT * rows + 120, top=90)
    return fit_narrow(fig)   # which sets the title over the first row's panel titles


def edge_bars(heads: Sequence[tuple[str, Sequence[tuple[str, float]], Sequence[tuple[str, float]]]],
              title: str) -> go.Figure:
    """Why an attention edge is there: for each of its heads (name, query parts, key parts), a row of two bar
    panels: each query-side component against the whole relative key, and the whole query against each key-side
    component, each (label, value) largest first with "rest" last; each panel adds up to the head's relative
    score."""
    titles = [f"{escaped(name)}: {side}" for name, _, _ in heads for side in ("its query", "its key")]
    fig = make_subplots(rows=max(1, len(heads)), cols=2, subplot_titles=titles, horizontal_spacing=0.3,
                        vertical_spacing=0.12 / max(1, len(heads)) + 0.06)
    longest = 1
    for row, (_, *sides) in enumerate(heads, start=1):
        for col, parts in enumerate(sides, start=1):
            labels, values = [escaped(label) for label, _ in parts], [value for _, value in parts]
            longest = max(longest, len(labels))
            fig.add_trace(go.Bar(x=values, y=labels, orientation="h", showlegend=False,
                                 marker_color=["#2a9d8f" if v >= 0 else "#e76f51" for v in values],
                                 hovertemplate="%{y}: %{x:+.3f}<extra></extra>"), row=row, col=col)
            fig.update_yaxes(type="category", autorange="reversed", tickfont={"size": 9}, row=row, col=col)
            fig.update_xaxes(zeroline=True, zerolinecolor="#888", tickfont={"size": 9}, nticks=4, row=row, col=col)
    fig.update_annotations(font={"size": 11})
    base_layout(fig, title, 120 + len(heads) * (40 + 15 * longest), top=70)
    fig.update_layout(margin={"l": 70, "r": 10})
    return fit_narrow(fig)
