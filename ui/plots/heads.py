"""The Heads tab's figures: a score per layer × head, two such maps side by side, the loss change of an
ablation, attribution against attention, the logit lens, attention sinks and the loss per position through a
window of keys."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.plots.base import ATTENTION_COLORS, SIGNED_COLORS, as_f32, base_layout
from ui.plots.text import escaped

TITLE_CHARS = 46  # a title line's length: it fits a phone-wide plot at the title's 14 px
TICK_FONT = {"size": 11}
SLIM_COLORBAR = {"thickness": 14, "xpad": 6}  # the score's name is in the title: the bar needs no title of its own


def wrapped_title(title: str, width: int = TITLE_CHARS) -> tuple[str, int]:
    """The title broken into lines of at most `width` characters (its own <br> kept) and the number of lines:
    plotly never wraps a title, it clips it."""
    lines = [line for part in title.split("<br>") for line in (textwrap.wrap(part, width) or [""])]
    return "<br>".join(lines), len(lines)


def head_score_map(
    scores: np.ndarray,
    title: str,
    value_name: str,
    zmax: float | None = None,
    marked: Sequence[tuple[int, int]] = (),
    height: int | None = None,
) -> go.Figure:
    """One number per head, scores [L, H], as a heatmap with layers across and heads down (as the model view).

    Hover names the layer, the head and the score; `marked` heads (e.g. those that pass a naming threshold)
    get a ring. x and y are the layer and head numbers, so a click on a tile reads them back directly."""
    scores = as_f32(scores)
    if scores.ndim != 2:
        raise ValueError(f"head_score_map wants [layers, heads], got shape {scores.shape}")
    n_layers, n_heads = scores.shape
    fig = go.Figure(head_map_trace(scores, value_name, zmax, ATTENTION_COLORS, colorbar=SLIM_COLORBAR))
    if marked:
        fig.add_trace(
            go.Scatter(
                x=[layer for layer, _ in marked],
                y=[head for _, head in marked],
                mode="markers",
                marker={"symbol": "circle-open", "size": 14, "color": "#e4572e", "line": {"width": 2}},
                name="named",
                hoverinfo="skip",
                showlegend=False,
            )
        )
    text, lines = wrapped_title(title)
    top = 30 + 18 * lines
    base_layout(fig, text, height or top + min(560, 90 + 30 * n_heads), top=top)
    fig.update_layout(margin={"l": 48})
    _head_axes(fig, n_layers, n_heads)
    return fig


def head_map_trace(scores: np.ndarray, value_name: str, zmax: float | None, colorscale: str,
                   signed: bool = False, colorbar_x: float | None = None, colorbar: dict | None = None) -> go.Heatmap:
    """The [L, H] heatmap trace, transposed so that layers run across; `colorbar` replaces the colour bar's
    settings (by default titled with the value's name)."""
    finite = scores[np.isfinite(scores)]
    bound = float(np.abs(finite).max()) if finite.size else 1.0
    if signed:
        limits = {"zmin": -(bound or 1.0), "zmax": bound or 1.0, "zmid": 0.0, "reversescale": True}
    else:
        limits = {"zmin": 0.0, "zmax": float(zmax) if zmax is not None else (bound or 1.0)}
    n_layers, n_heads = scores.shape
    return go.Heatmap(
        z=np.ascontiguousarray(scores.T),
        x=np.arange(n_layers),
        y=np.arange(n_heads),
        colorscale=colorscale,
        colorbar={**(colorbar if colorbar is not None else {"title": {"text": value_name}}),
                  **({"x": colorbar_x} if colorbar_x is not None else {})},
        hovertemplate=f"<b>L%{{x}} H%{{y}}</b>: layer %{{x}}, head %{{y}}<br>{value_name} %{{z:.4f}}<extra></extra>",
        xgap=1,
        ygap=1,
        **limits,
    )


def tick_step(n: int, every: int) -> int:
    """Label every tile up to `every` of them, else every 2nd, 4th, ...: no more than `every` labels."""
    step = 1
    while n > every * step:
        step *= 2
    return step


def _head_axes(fig: go.Figure, n_layers: int, n_heads: int, every_layer: int = 32, **where) -> None:
    """Layer and head axes fixed to the tiles (markers on named heads must not widen them), head 0 on top, with
    a label on every layer (every 2nd, 4th, … past `every_layer`) and on every head up to 32."""
    fig.update_xaxes(title_text="layer", tickmode="linear", tick0=0, dtick=tick_step(n_layers, every_layer),
                     tickfont=TICK_FONT, range=[-0.5, n_layers - 0.5], showgrid=False, zeroline=False, **where)
    fig.update_yaxes(title_text="head", tickmode="linear", tick0=0, dtick=tick_step(n_heads, 32), tickfont=TICK_FONT,
                     range=[n_heads - 0.5, -0.5], showgrid=False, zeroline=False, **where)


def paired_head_maps(
    left: np.ndarray,
    right: np.ndarray,
    titles: tuple[str, str],
    value_names: tuple[str, str],
    title: str,
    signed: tuple[bool, bool] = (True, False),
) -> go.Figure:
    """Two [L, H] maps side by side with their own colour scales (the sweep's loss increase, a score)."""
    left, right = as_f32(left), as_f32(right)
    if left.shape != right.shape or left.ndim != 2:
        raise ValueError(f"paired_head_maps wants two maps of one shape [layers, heads], got {left.shape} and "
                         f"{right.shape}")
    n_layers, n_heads = left.shape
    fig = make_subplots(rows=1, cols=2, subplot_titles=list(titles), horizontal_spacing=0.12)
    for col, (scores, name, sign) in enumerate(zip((left, right), value_names, signed), start=1):
        colours = SIGNED_COLORS if sign else ATTENTION_COLORS
        fig.add_trace(head_map_trace(scores, name, None, colours, sign, colorbar_x=0.44 if col == 1 else 1.0),
                      row=1, col=col)
        _head_axes(fig, n_layers, n_heads, every_layer=16, row=1, col=col)
    text, lines = wrapped_title(title, 2 * TITLE_CHARS)
    base_layout(fig, text, min(600, 180 + 34 * n_heads))
    fig.update_layout(margin={"t": 72 + 18 * lines})  # the title's lines, then the two maps' own titles
    return fig


def loss_change_figure(labels: Sequence[str], clean: np.ndarray, ablated: np.ndarray, title: str) -> go.Figure:
    """Bars of the loss change ablated − clean for each predicted token; hover gives both losses.

    labels[i] names the token predicted by bar i (the text's token i + 1)."""
    clean, ablated = as_f32(clean), as_f32(ablated)
    if not (clean.shape == ablated.shape == (len(labels),)):
        raise ValueError(f"loss_change_figure: {len(labels)} labels for losses of shapes {clean.shape} and "
                         f"{ablated.shape}")
    delta = ablated - clean
    fig = go.Figure(
        go.Bar(
            x=list(labels),
            y=delta,
            customdata=np.stack([clean, ablated], axis=-1),
            marker={"color": np.where(delta >= 0, "#c0392b", "#2e86c1").tolist()},
            hovertemplate="predicting %{x}<br>clean %{customdata[0]:.3f} → ablated %{customdata[1]:.3f} nats"
            "<br>change %{y:+.3f}<extra></extra>",
        )
    )
    base_layout(fig, title, 380)
    fig.update_xaxes(title_text="predicted token", type="category", tickangle=-60, automargin=True)
    fig.update_yaxes(title_text="loss change (nats)", zeroline=True)
    return fig


def attribution_figure(labels: Sequence[str], series: Mapping[str, np.ndarray], title: str) -> go.Figure:
    """Several views of one prediction over the input tokens, each divided by its largest |value| so that they
    share one axis (signed views keep their sign); hover gives the raw value."""
    fig = go.Figure()
    for name, values in series.items():
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (len(labels),):
            raise ValueError(f"attribution_figure: series {name!r} has shape {values.shape} for {len(labels)} tokens")
        peak = np.abs(values).max() if values.size else 0.0
        shown = values / peak if peak > 0 else values
        fig.add_trace(
            go.Scatter(
                x=list(labels),
                y=shown.astype(np.float32),
                customdata=values.astype(np.float32),
                mode="lines+markers",
                name=name,
                hovertemplate=f"%{{x}}<br>{name}: %{{customdata:.4g}}<extra></extra>",
            )
        )
    base_layout(fig, title, 420)
    fig.update_xaxes(title_text="input token", type="category", tickangle=-60, automargin=True)
    fig.update_yaxes(title_text="value / its largest |value|")
    fig.update_layout(legend={"orientation": "h", "y": -0.45}, hovermode="x unified")
    return fig


def lens_figure(
    final_prob: np.ndarray,
    top_tokens: Sequence[Sequence[str]],
    top_prob: np.ndarray,
    position_labels: Sequence[str],
    settles: Sequence[int],
    title: str,
) -> go.Figure:
    """The logit lens: layers × positions coloured by the probability each layer gives to the final
    prediction, each layer's own top token as hover text (printed in the cells when they are few), and a
    marker where each position's final answer settles (stays top-1 from that layer up)."""
    final_prob, top_prob = as_f32(final_prob), as_f32(top_prob)
    n_layers, n = final_prob.shape
    if top_prob.shape != (n_layers, n) or len(top_tokens) != n_layers or len(position_labels) != n:
        raise ValueError(f"lens_figure: probabilities {final_prob.shape}, top {top_prob.shape}, "
                         f"{len(top_tokens)} token rows, {len(position_labels)} positions")
    if len(settles) != n:
        raise ValueError(f"lens_figure: {len(settles)} settle layers for {n} positions")
    text = [[f"{tok} ({p:.2f})" for tok, p in zip(row, probs)] for row, probs in zip(top_tokens, top_prob)]
    small = n_layers * n <= 600
    fig = go.Figure(
        go.Heatmap(
            z=final_prob,
            x=list(position_labels),
            y=np.arange(n_layers),
            text=[list(row) for row in top_tokens] if small else None,
            texttemplate="%{text}" if small else None,
            textfont={"size": 9},
            customdata=text,
            colorscale=ATTENTION_COLORS,
            zmin=0.0,
            zmax=1.0,
            colorbar={"title": {"text": "P(final answer)"}},
            hovertemplate="layer %{y}, position %{x}<br>top token here: %{customdata}"
            "<br>P(final answer) %{z:.3f}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=list(position_labels),
            y=list(settles),
            mode="markers",
            marker={"symbol": "diamond", "size": 8, "color": "#e4572e"},
            name="final answer settles",
            hovertemplate="%{x}: the final answer is top-1 from layer %{y} on<extra></extra>",
        )
    )
    base_layout(fig, title, min(900, 160 + 18 * n_layers))
    fig.update_xaxes(title_text="position (its prediction of the next token)", type="category", tickangle=-60,
                     automargin=True)
    fig.update_yaxes(title_text="layer", dtick=1 if n_layers <= 16 else None)
    fig.update_layout(legend={"orientation": "h", "y": -0.3})
    return fig


def sink_maps(maps: Mapping[str, np.ndarray], rings: Mapping[str, np.ndarray], epsilon: float,
              title: str) -> go.Figure:
    """One or more [L, H] maps of each head's mean attention on one token (token 0; an encoder's last token too),
    side by side on one 0–1 colour scale, with a ring on every head rings[name] marks ([L, H] booleans: the sink
    heads above `epsilon`, as the caller's one rule decides them). x and y are the layer and head numbers, as in
    head_score_map."""
    panels = {name: as_f32(scores) for name, scores in maps.items()}
    shapes = {scores.shape for scores in panels.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"sink_maps wants maps of one shape [layers, heads], got {sorted(shapes)}")
    n_layers, n_heads = next(iter(shapes))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=list(panels), horizontal_spacing=0.1)
    for col, (name, scores) in enumerate(panels.items(), start=1):
        trace = head_map_trace(scores, name, 1.0, ATTENTION_COLORS, colorbar=SLIM_COLORBAR)
        trace.update(showscale=col == len(panels))
        fig.add_trace(trace, row=1, col=col)
        layers, heads = np.nonzero(np.asarray(rings[name], dtype=bool))
        if layers.size:   # a ring on each sink head; no trace where no head is one
            fig.add_trace(go.Scatter(x=layers.tolist(), y=heads.tolist(), mode="markers", hoverinfo="skip",
                                     marker={"symbol": "circle-open", "size": 14, "color": "#e4572e",
                                             "line": {"width": 2}},
                                     name=f"sink heads (above ε = {epsilon:g})", showlegend=False), row=1, col=col)
        _head_axes(fig, n_layers, n_heads, every_layer=32 if len(panels) == 1 else 16, row=1, col=col)
    text, lines = wrapped_title(title, TITLE_CHARS * len(panels))
    base_layout(fig, text, min(600, 180 + 34 * n_heads))
    fig.update_layout(margin={"t": 72 + 18 * lines})  # the title's lines, then each map's own title
    return fig


def window_loss_figure(loss: Mapping[str, np.ndarray], hides_from: int | None, title: str) -> go.Figure:
    """Next-token loss per query position for each way of reading the text (loss[i]: −log p(token i + 1) from
    query i), with a dashed line at `hides_from`, the first query whose window hides a key (None: none does)."""
    curves = {name: as_f32(values) for name, values in loss.items()}
    lengths = {values.shape for values in curves.values()}
    if len(lengths) != 1 or len(next(iter(lengths))) != 1:
        raise ValueError(f"window_loss_figure wants 1-D losses of one length, got {sorted(lengths)}")
    x = np.arange(next(iter(lengths))[0])
    fig = go.Figure()
    for name, values in curves.items():
        fig.add_trace(go.Scatter(x=x, y=values, mode="lines", name=name,
                                 hovertemplate=f"{name}<br>query %{{x}} predicts token %{{x}} + 1: "
                                               f"%{{y:.3f}} nats<extra></extra>"))
    if hides_from is not None:
        fig.add_vline(x=hides_from, line_dash="dash", line_color="grey", annotation_text="the window starts hiding",
                      annotation_position="top left")
    text, lines = wrapped_title(title, 2 * TITLE_CHARS)
    base_layout(fig, text, 400, top=30 + 18 * lines)
    fig.update_xaxes(title_text="query position (it predicts the next token)", tickformat="d")
    fig.update_yaxes(title_text="next-token loss (nats)")
    fig.update_layout(legend={"orientation": "h", "y": -0.25})
    return fig


def sink_depth_figure(per_layer: Mapping[str, np.ndarray], title: str) -> go.Figure:
    """One line per model: each layer's mean attention on the first token (over its heads), against the layer's
    depth as a fraction of the stack (0 the first layer, 1 the last), so models of different depths share an axis.
    The names are the legend's, as given (the caller puts each model's share of sink heads in them)."""
    fig = go.Figure()
    for name, values in per_layer.items():
        values = as_f32(values)
        if values.ndim != 1 or not len(values):
            raise ValueError(f"sink_depth_figure wants one value per layer, got shape {values.shape} for {name}")
        depth = np.linspace(0.0, 1.0, len(values)) if len(values) > 1 else np.zeros(1)
        fig.add_trace(go.Scatter(x=depth, y=values, mode="lines+markers", name=name,
                                 customdata=np.arange(len(values)),
                                 hovertemplate=f"{name}<br>layer %{{customdata}}: %{{y:.3f}}<extra></extra>"))
    text, lines = wrapped_title(title, 2 * TITLE_CHARS)
    base_layout(fig, text, 420, top=30 + 18 * lines)
    fig.update_xaxes(title_text="depth (layer ÷ last layer)", range=[-0.02, 1.02])
    fig.update_yaxes(title_text="mean attention on the first token", range=[0, 1])
    fig.update_layout(legend={"orientation": "h", "y": -0.25})
    return fig


def plural(side: str) -> str:
    """'keys' or 'queries': the side a composition reads, in the plural."""
    return "queries" if side == "query" else f"{side}s"


def composition_figure(labels: Sequence[str], mean: np.ndarray, low: np.ndarray, high: np.ndarray,
                       weights: np.ndarray, side: str, title: str) -> go.Figure:
    """What feeds a head's keys or queries: above, each component's mean share of the relative score over the
    texts (bars, largest first, "rest" last) with its 95 % interval (none where NaN); below, the weights-only
    composition with every earlier head (weights [layer, H], a map; none for layer 0)."""
    mean, low, high = as_f32(mean), as_f32(low), as_f32(high)
    has_map = weights.size > 0
    fig = make_subplots(rows=2 if has_map else 1, cols=1, vertical_spacing=0.2,
                        row_heights=[0.55, 0.45] if has_map else None,
                        subplot_titles=(f"the data: each part's share of the relative score on its {plural(side)}",
                                        "the weights: composition with each earlier head")[:2 if has_map else 1])
    add_share_bars(fig, labels, mean, low, high, 1, 1)
    if has_map:
        n_layers, n_heads = weights.shape
        fig.add_trace(go.Heatmap(z=as_f32(weights), x=list(range(n_heads)), y=list(range(n_layers)),
                                 colorscale=ATTENTION_COLORS, zmin=0, colorbar={"thickness": 10, "len": 0.4, "y": 0.2},
                                 hovertemplate=f"L%{{y}} H%{{x}}: {side[0].upper()}-composition %{{z:.3f}}"
                                               "<extra></extra>"), row=2, col=1)
        fig.update_yaxes(title_text="layer", autorange="reversed", dtick=tick_step(n_layers, 16), row=2, col=1)
        fig.update_xaxes(title_text="head", dtick=tick_step(n_heads, 16), row=2, col=1)
    base_layout(fig, title, 260 + 26 * len(labels) + (30 * weights.shape[0] + 120 if has_map else 0), top=80)
    fig.update_layout(margin={"l": 110})
    return fig


# a part's share of a text's relative score: signed, so one part passes 1 where others work against it
SHARE_AXIS = "signed share of relative score (sum to 1)"   # short enough to read whole on a 390 px phone


def add_share_bars(fig: go.Figure, labels: Sequence[str], mean: np.ndarray, low: np.ndarray, high: np.ndarray,
                   row: int, col: int) -> None:
    """Each component's mean share as a horizontal bar (largest first, as given) with its 95 % interval (none
    where NaN), in subplot (row, col)."""
    mean, low, high = as_f32(mean), as_f32(low), as_f32(high)
    spread = np.where(np.isfinite(low) & np.isfinite(high), np.stack([mean - low, high - mean]), np.nan)
    fig.add_trace(go.Bar(x=mean, y=[escaped(label) for label in labels], orientation="h", showlegend=False,
                         marker_color=["#2a9d8f" if v >= 0 else "#e76f51" for v in mean],
                         error_x=dict(type="data", symmetric=False, array=spread[1], arrayminus=spread[0],
                                      color="#444", thickness=1),
                         customdata=np.stack([low, high], -1),
                         hovertemplate="%{y}: share %{x:+.3f}<br>interval [%{customdata[0]:.3f}, "
                                       "%{customdata[1]:.3f}]<extra></extra>"), row=row, col=col)
    fig.update_yaxes(type="category", autorange="reversed", tickfont={"size": 10}, row=row, col=col)
    fig.update_xaxes(zeroline=True, zerolinecolor="#888", title_text=SHARE_AXIS, row=row, col=col)


def share_panels(panels: Sequence[tuple[str, Sequence[str], np.ndarray, np.ndarray, np.ndarray]],
                 title: str) -> go.Figure:
    """What feeds each of several heads' keys, one panel above the other: (title, labels, mean, low, high)."""
    fig = make_subplots(rows=len(panels), cols=1, vertical_spacing=0.18, subplot_titles=[p[0] for p in panels])
    for i, (_, labels, mean, low, high) in enumerate(panels):
        add_share_bars(fig, labels, mean, low, high, i + 1, 1)
    base_layout(fig, title, 160 + sum(90 + 24 * len(p[1]) for p in panels), top=80)
    fig.update_layout(margin={"l": 110})
    return fig
