"""Plotly figures from plain arrays and token strings.

Every function here takes numpy arrays (and lists of strings) and returns a
`plotly.graph_objects.Figure`. Nothing here knows about torch, Gradio or the
model: the service layer computes the numbers, these functions only draw them,
so they can be tested (and reused) on their own.

Size matters: a figure travels to the browser as JSON, and plotly encodes a
float32 array as base64 (about 5.4 bytes per cell once Gradio has escaped it).
Callers keep matrices small (the service pools long inputs); `figure_nbytes`
measures what a figure will cost. One view is HTML rather than a figure
(`surprisal_html`: text reads better as text), built here for the same reasons.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

TEMPLATE = "plotly_white"
ATTENTION_COLORS = "Blues"
SIGNED_COLORS = "RdBu"
MASKED_COLOR = "#d9d9d9"  # cells that a mask removed (−∞ before softmax) are drawn in this grey


def figure_nbytes(fig: go.Figure) -> int:
    """Bytes of the figure's JSON, about what the browser receives for it."""
    return len(fig.to_json().encode("utf-8"))


def _as_f32(a: np.ndarray) -> np.ndarray:
    # float32 halves the bytes sent compared with float64 and is what the core computes in.
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def _base_layout(fig: go.Figure, title: str, height: int | None = None) -> go.Figure:
    fig.update_layout(
        template=TEMPLATE,
        title={"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        height=height,
    )
    return fig


def weight_trace(weights: np.ndarray, x, y, zmax: float | None, hovertemplate: str) -> go.Heatmap:
    """The heatmap trace of attention weights: 0 to zmax (default: the largest finite weight) in ATTENTION_COLORS."""
    finite = weights[np.isfinite(weights)]
    top = float(zmax) if zmax is not None else (float(finite.max()) if finite.size else 1.0)
    return go.Heatmap(z=weights, x=x, y=y, colorscale=ATTENTION_COLORS, zmin=0.0, zmax=top if top > 0 else 1.0,
                      colorbar={"title": {"text": "weight"}}, hovertemplate=hovertemplate, hoverongaps=False)


def attention_heatmap(
    weights: np.ndarray,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    title: str,
    zmax: float | None = None,
    height: int = 640,
) -> go.Figure:
    """One attention matrix [Tq, Tk] with token labels; hovering shows query → key and the weight.

    Labels must be unique (plotly merges equal category names), so callers pass
    labels that carry the token's position, e.g. "12 the".
    """
    weights = _as_f32(weights)
    if weights.ndim != 2:
        raise ValueError(f"attention_heatmap wants a 2-D matrix [queries, keys], got shape {weights.shape}")
    if weights.shape != (len(query_labels), len(key_labels)):
        raise ValueError(
            f"attention_heatmap: matrix shape {weights.shape} does not match "
            f"{len(query_labels)} query labels × {len(key_labels)} key labels"
        )
    fig = go.Figure(weight_trace(weights, list(key_labels), list(query_labels), zmax,
                                 "query %{y} → key %{x}<br>weight %{z:.4f}<extra></extra>"))
    _base_layout(fig, title, height)
    fig.update_xaxes(title_text="key (attended to)", type="category", tickangle=-60, automargin=True)
    fig.update_yaxes(title_text="query (attending)", type="category", autorange="reversed", automargin=True)
    fig.update_layout(plot_bgcolor=MASKED_COLOR)
    return fig


def pooled_heatmap(
    weights: np.ndarray,
    query_edges: Sequence[int],
    key_edges: Sequence[int],
    title: str,
    height: int = 640,
) -> go.Figure:
    """A pooled attention matrix [Sq, Sk] whose cell (i, j) covers query tokens
    query_edges[i]..query_edges[i+1]-1 and key tokens key_edges[j]..key_edges[j+1]-1."""
    weights = _as_f32(weights)
    if weights.shape != (len(query_edges) - 1, len(key_edges) - 1):
        raise ValueError(
            f"pooled_heatmap: matrix shape {weights.shape} needs {weights.shape[0] + 1} query edges and "
            f"{weights.shape[1] + 1} key edges, got {len(query_edges)} and {len(key_edges)}"
        )
    q_mid = [(a + b - 1) / 2 for a, b in zip(query_edges[:-1], query_edges[1:])]
    k_mid = [(a + b - 1) / 2 for a, b in zip(key_edges[:-1], key_edges[1:])]
    # customdata would cost a string per cell; the axes already carry token positions.
    fig = go.Figure(weight_trace(weights, k_mid, q_mid, None,
                                 "queries ≈ %{y:.0f} → keys ≈ %{x:.0f}<br>pooled weight %{z:.4f}<extra></extra>"))
    _base_layout(fig, title, height)
    fig.update_xaxes(title_text="key position (pooled blocks)")
    fig.update_yaxes(title_text="query position (pooled blocks)", autorange="reversed")
    fig.update_layout(plot_bgcolor=MASKED_COLOR)
    return fig


def model_view(overview: np.ndarray, title: str, layer_labels: Sequence[str] | None = None) -> go.Figure:
    """Every layer × head as a small heatmap, tiled into one mosaic figure (layers across, heads down).

    overview: [L, H, S, S]. One heatmap trace (not L·H subplots) keeps the figure
    small and fast to draw even for 30 layers × 9 heads. Each tile is scaled to
    its own maximum so that weak and strong heads are equally readable.
    """
    overview = _as_f32(overview)
    if overview.ndim != 4 or overview.shape[2] != overview.shape[3]:
        raise ValueError(f"model_view wants [layers, heads, S, S], got shape {overview.shape}")
    n_layers, n_heads, s, _ = overview.shape
    gap = 1
    cell = s + gap
    finite = np.where(np.isfinite(overview), overview, 0.0)
    peak = finite.max(axis=(2, 3), keepdims=True)
    # colour ∝ √(weight / peak): many heads park most weight on the first token (an "attention sink"),
    # and a linear scale would leave the rest of the tile white
    tiles = np.sqrt(finite / np.where(peak > 0, peak, 1.0))
    # uint8 (1 byte per cell instead of 4): the tiles are relative to their own peak anyway,
    # and exact weights are one click away in the head view.
    # layers run left to right and heads top to bottom: deep models (30 layers) then fit a wide screen
    mosaic = np.zeros((n_heads * cell - gap, n_layers * cell - gap), dtype=np.uint8)
    for layer in range(n_layers):
        for head in range(n_heads):
            tile = np.rint(tiles[layer, head] * 255).astype(np.uint8)
            mosaic[head * cell : head * cell + s, layer * cell : layer * cell + s] = tile
    labels = list(layer_labels) if layer_labels is not None else [f"L{i}" for i in range(n_layers)]
    fig = go.Figure(
        go.Heatmap(
            z=mosaic,
            colorscale=ATTENTION_COLORS,
            zmin=0,
            zmax=255,
            showscale=False,
            hoverinfo="skip",
        )
    )
    # one invisible marker per tile names it on hover (L·H points: far cheaper than a label per cell)
    centres = [
        (layer * cell + (s - 1) / 2, head * cell + (s - 1) / 2) for layer in range(n_layers) for head in range(n_heads)
    ]
    peaks = peak.reshape(n_layers, n_heads)
    fig.add_trace(
        go.Scatter(
            x=[c[0] for c in centres],
            y=[c[1] for c in centres],
            mode="markers",
            marker={"size": 1, "opacity": 0},
            text=[f"layer {layer}, head {head}" for layer in range(n_layers) for head in range(n_heads)],
            customdata=[float(peaks[layer, head]) for layer in range(n_layers) for head in range(n_heads)],
            hovertemplate="%{text}<br>peak weight %{customdata:.3f}<extra></extra>",
            showlegend=False,
        )
    )
    tile_px = max(12, min(90, 1200 // max(n_layers, 1)))
    _base_layout(fig, title, height=min(1200, 110 + n_heads * tile_px))
    fig.update_xaxes(
        tickmode="array",
        tickvals=[i * cell + (s - 1) / 2 for i in range(n_layers)],
        ticktext=labels,
        side="top",
        showgrid=False,
        zeroline=False,
        constrain="domain",
    )
    fig.update_yaxes(
        tickmode="array",
        tickvals=[h * cell + (s - 1) / 2 for h in range(n_heads)],
        ticktext=[f"H{h}" for h in range(n_heads)],
        autorange="reversed",
        showgrid=False,
        zeroline=False,
        scaleanchor="x",
        constrain="domain",
    )
    fig.update_layout(
        plot_bgcolor="white",
        meta={"layers": n_layers, "heads": n_heads, "tile": s},
        hovermode="closest",
        hoverdistance=200,  # anywhere in a tile is nearer its own centre than any other
    )
    return fig


def stages_figure(
    stages: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    title: str,
) -> go.Figure:
    """Eq. 2.1 step by step: one row per variant (e.g. "causal mask on" / "off"),
    three columns: scaled scores QKᵀ/√d_k, scores + mask M, softmax.

    Masked entries (−∞) are drawn grey; JSON has no infinity, so they travel as NaN.
    """
    names = list(stages)
    columns = ("scaled scores QKᵀ/√d_k", "masked scores (+M)", "softmax → attention weights")
    fig = make_subplots(
        rows=len(names),
        cols=3,
        subplot_titles=[f"{name}: {col}" for name in names for col in columns],
        horizontal_spacing=0.08,
        vertical_spacing=0.14 if len(names) > 1 else 0.1,
    )
    all_scores = np.concatenate([_as_f32(stages[n][0]).ravel() for n in names])
    all_scores = all_scores[np.isfinite(all_scores)]
    bound = float(np.abs(all_scores).max()) if all_scores.size else 1.0
    for r, name in enumerate(names, start=1):
        scores, masked, probs = (_as_f32(a) for a in stages[name])
        masked = np.where(np.isfinite(masked), masked, np.nan)
        for c, (z, signed) in enumerate(((scores, True), (masked, True), (probs, False)), start=1):
            fig.add_trace(
                go.Heatmap(
                    z=z,
                    x=list(key_labels),
                    y=list(query_labels),
                    colorscale=SIGNED_COLORS if signed else ATTENTION_COLORS,
                    reversescale=signed,
                    zmid=0.0 if signed else None,
                    zmin=-bound if signed else 0.0,
                    zmax=bound if signed else 1.0,
                    showscale=(r == 1 and c in (2, 3)),
                    colorbar={"x": 0.64 if c == 2 else 1.0, "len": 0.4, "y": 0.8, "thickness": 10}
                    if r == 1 and c in (2, 3)
                    else None,
                    hovertemplate="query %{y} → key %{x}<br>%{z:.3f}<extra>" + name + "</extra>",
                    hoverongaps=False,
                ),
                row=r,
                col=c,
            )
    _base_layout(fig, title, height=340 * len(names) + 80)
    fig.update_xaxes(type="category", tickangle=-60, tickfont={"size": 9})
    fig.update_yaxes(type="category", autorange="reversed", tickfont={"size": 9})
    fig.update_layout(plot_bgcolor=MASKED_COLOR)
    return fig


def matrix_heatmap(
    matrix: np.ndarray,
    title: str,
    x_title: str,
    y_title: str,
    colorscale: str = SIGNED_COLORS,
    symmetric: bool = True,
    x: Sequence[float] | None = None,
    y: Sequence[float] | None = None,
    value_name: str = "value",
    height: int = 460,
    clip_quantile: float = 1.0,
) -> go.Figure:
    """A numeric matrix (positional encodings, similarity matrices, angles) as a heatmap.

    clip_quantile < 1 bounds a symmetric colour scale by that quantile of |value|, so that a few outlying
    entries (learned embeddings often have some) do not wash out the rest; hover still shows true values."""
    matrix = _as_f32(matrix)
    if matrix.ndim != 2:
        raise ValueError(f"matrix_heatmap wants a 2-D array, got shape {matrix.shape}")
    finite = matrix[np.isfinite(matrix)]
    kwargs: dict = {}
    if symmetric and finite.size:
        bound = float(np.quantile(np.abs(finite), clip_quantile)) or float(np.abs(finite).max()) or 1.0
        kwargs = {"zmin": -bound, "zmax": bound, "zmid": 0.0, "reversescale": True}
    fig = go.Figure(
        go.Heatmap(
            z=matrix,
            x=list(x) if x is not None else None,
            y=list(y) if y is not None else None,
            colorscale=colorscale,
            colorbar={"title": {"text": value_name}},
            hovertemplate=f"{y_title} %{{y}}, {x_title} %{{x}}<br>{value_name} %{{z:.4f}}<extra></extra>",
            **kwargs,
        )
    )
    _base_layout(fig, title, height)
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title, autorange="reversed")
    return fig


def line_figure(
    x: np.ndarray,
    series: Mapping[str, np.ndarray],
    title: str,
    x_title: str,
    y_title: str,
    height: int = 380,
    reference: Mapping[str, float] | None = None,
) -> go.Figure:
    """Several named curves over one x axis; `reference` adds dashed horizontal lines."""
    x = np.asarray(x)
    fig = go.Figure()
    for name, ys in series.items():
        ys = np.asarray(ys, dtype=np.float64)
        if ys.shape != x.shape:
            raise ValueError(f"line_figure: series {name!r} has shape {ys.shape}, x has {x.shape}")
        fig.add_trace(go.Scatter(x=x, y=ys, mode="lines+markers" if x.size <= 40 else "lines", name=name))
    for name, value in (reference or {}).items():
        fig.add_hline(
            y=value, line_dash="dash", line_color="grey", annotation_text=name, annotation_position="top left"
        )
    _base_layout(fig, title, height)
    integer_x = np.issubdtype(x.dtype, np.integer)
    fig.update_xaxes(
        title_text=x_title, tickformat="d" if integer_x else None, dtick=1 if integer_x and x.size <= 12 else None
    )
    fig.update_yaxes(title_text=y_title)
    fig.update_layout(legend={"orientation": "h", "y": -0.25})
    return fig


def bar_figure(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    title: str,
    y_title: str,
    height: int = 380,
    text_format: str = ".3f",
    x_title: str | None = None,
) -> go.Figure:
    """Grouped bars: one group per category, one bar per named series (values printed when there are few)."""
    fig = go.Figure()
    show_values = len(categories) <= 8
    for name, values in series.items():
        values = [float(v) for v in values]
        if len(values) != len(categories):
            raise ValueError(f"bar_figure: series {name!r} has {len(values)} values for {len(categories)} categories")
        fig.add_trace(
            go.Bar(
                x=list(categories),
                y=values,
                name=name,
                text=[format(v, text_format) for v in values] if show_values else None,
                textposition="outside",
                cliponaxis=False,
            )
        )
    _base_layout(fig, title, height)
    fig.update_xaxes(title_text=x_title, type="category")
    fig.update_yaxes(title_text=y_title)
    fig.update_layout(barmode="group", legend={"orientation": "h", "y": -0.2}, margin={"t": 80})
    return fig


def empty_figure(message: str, height: int = 200) -> go.Figure:
    """An empty figure that says why there is nothing to plot (e.g. the model has no learned positions)."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 14})
    _base_layout(fig, "", height)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


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
    scores = _as_f32(scores)
    if scores.ndim != 2:
        raise ValueError(f"head_score_map wants [layers, heads], got shape {scores.shape}")
    n_layers, n_heads = scores.shape
    fig = go.Figure(head_map_trace(scores, value_name, zmax, ATTENTION_COLORS))
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
    _base_layout(fig, title, height or min(560, 140 + 34 * n_heads))
    _head_axes(fig, n_layers, n_heads)
    return fig


def head_map_trace(scores: np.ndarray, value_name: str, zmax: float | None, colorscale: str,
                   signed: bool = False, colorbar_x: float | None = None) -> go.Heatmap:
    """The [L, H] heatmap trace, transposed so that layers run across."""
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
        colorbar={"title": {"text": value_name}, **({"x": colorbar_x} if colorbar_x is not None else {})},
        hovertemplate=f"layer %{{x}}, head %{{y}}<br>{value_name} %{{z:.4f}}<extra></extra>",
        xgap=1,
        ygap=1,
        **limits,
    )


def _head_axes(fig: go.Figure, n_layers: int, n_heads: int, every_layer: int = 32, **where) -> None:
    """Layer and head axes fixed to the tiles (markers on named heads must not widen them), head 0 on top."""
    fig.update_xaxes(title_text="layer", dtick=1 if n_layers <= every_layer else None, range=[-0.5, n_layers - 0.5],
                     showgrid=False, zeroline=False, **where)
    fig.update_yaxes(title_text="head", dtick=1 if n_heads <= 16 else None, range=[n_heads - 0.5, -0.5],
                     showgrid=False, zeroline=False, **where)


def paired_head_maps(
    left: np.ndarray,
    right: np.ndarray,
    titles: tuple[str, str],
    value_names: tuple[str, str],
    title: str,
    signed: tuple[bool, bool] = (True, False),
) -> go.Figure:
    """Two [L, H] maps side by side with their own colour scales (the sweep's loss increase, a score)."""
    left, right = _as_f32(left), _as_f32(right)
    if left.shape != right.shape or left.ndim != 2:
        raise ValueError(f"paired_head_maps wants two maps of one shape [layers, heads], got {left.shape} and "
                         f"{right.shape}")
    n_layers, n_heads = left.shape
    fig = make_subplots(rows=1, cols=2, subplot_titles=list(titles), horizontal_spacing=0.12)
    for col, (scores, name, sign) in enumerate(zip((left, right), value_names, signed), start=1):
        colours = SIGNED_COLORS if sign else ATTENTION_COLORS
        fig.add_trace(head_map_trace(scores, name, None, colours, sign, colorbar_x=0.44 if col == 1 else 1.0),
                      row=1, col=col)
        _head_axes(fig, n_layers, n_heads, every_layer=12, row=1, col=col)
    _base_layout(fig, title, min(600, 180 + 34 * n_heads))
    fig.update_layout(margin={"t": 90})
    return fig


def loss_change_figure(labels: Sequence[str], clean: np.ndarray, ablated: np.ndarray, title: str) -> go.Figure:
    """Bars of the loss change ablated − clean for each predicted token; hover gives both losses.

    labels[i] names the token predicted by bar i (the text's token i + 1)."""
    clean, ablated = _as_f32(clean), _as_f32(ablated)
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
    _base_layout(fig, title, 380)
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
    _base_layout(fig, title, 420)
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
    final_prob, top_prob = _as_f32(final_prob), _as_f32(top_prob)
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
    _base_layout(fig, title, min(900, 160 + 18 * n_layers))
    fig.update_xaxes(title_text="position (its prediction of the next token)", type="category", tickangle=-60,
                     automargin=True)
    fig.update_yaxes(title_text="layer", dtick=1 if n_layers <= 16 else None)
    fig.update_layout(legend={"orientation": "h", "y": -0.3})
    return fig


def surprisal_html(
    pieces: Sequence[str],
    losses: np.ndarray,
    alternatives: Sequence[Sequence[tuple[str, float]]],
    full_scale: float = 10.0,
) -> str:
    """The text as spans shaded by each token's loss (nats; the shade is full from `full_scale` up), with a
    tooltip of the loss and the model's top alternatives there. pieces [T] are the tokens' own text (spaces and
    newlines kept); losses and alternatives [T - 1] (the first token is never predicted). Every string is escaped."""
    losses = np.asarray(losses, dtype=np.float64)
    if len(pieces) != len(losses) + 1 or len(alternatives) != len(losses):
        raise ValueError(f"surprisal_html: {len(pieces)} tokens need {len(pieces) - 1} losses and alternatives, "
                         f"got {len(losses)} and {len(alternatives)}")
    spans = [f'<span class="tok" title="the first token is not predicted">{html.escape(pieces[0])}</span>']
    for piece, loss, alts in zip(pieces[1:], losses, alternatives):
        listed = "\n".join(f"{p:.3f}  {tok}" for tok, p in alts)
        tip = f"{loss:.2f} nats\ntop {len(alts)} here:\n{listed}"
        alpha = min(1.0, max(0.0, loss / full_scale)) * 0.85
        spans.append(
            f'<span class="tok" data-loss="{loss:.4f}" title="{html.escape(tip, quote=True)}" '
            f'style="background: rgba(220, 60, 40, {alpha:.3f})">{html.escape(piece)}</span>'
        )
    legend = (f'<div class="surprisal-legend">shade: 0 nats (white) to ≥ {full_scale:g} nats (dark); '
              "hover a token for its loss and the model's top alternatives</div>")
    return legend + '<div class="surprisal">' + "".join(spans) + "</div>"
