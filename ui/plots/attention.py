"""Attention maps: one head cell by cell or pooled, every layer × head at a glance, eq. 2.1 stage by stage, and
the two-column view (queries on the left, keys on the right, a line per weight)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.plots.base import ATTENTION_COLORS, MASKED_COLOR, SIGNED_COLORS, as_f32, base_layout
from ui.plots.text import escaped

LABEL_EVERY_TOKEN_UP_TO = 64  # an axis of up to this many tokens names every one; beyond, plotly thins its labels
OPACITY_LEVELS = 8  # two-column view: a line's opacity is level / 8, level = round(8 · weight) clipped to 1..8
MIN_LINE_WEIGHT = 0.01  # two-column view: weights below this draw no line
LINE_COLOR = "#08519c"  # the darkest blue of ATTENTION_COLORS


def label_font_px(n: int) -> int:
    """Tick-label size for n tokens side by side: 12 px up to 16 tokens, shrinking linearly to 8 px at 64 (7 px
    beyond), so that every label fits in its row."""
    return 12 if n <= 16 else max(7, round(12 - 4 * (n - 16) / 48))


def label_pitch_px(n: int) -> int:
    """Pixels per row (or column) that keep n labels of label_font_px(n) apart: 17 px at 16 tokens, 12 at 64."""
    return math.ceil(label_font_px(n) * 1.4)


def plotly_text(labels: Sequence[str]) -> list[str]:
    """Labels as plotly draws them literally: plotly reads <b>, <br>, &amp; and the like in text, so <, > and &
    are escaped (a token "<b>" then reads "<b>", not bold)."""
    return [escaped(label) for label in labels]


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

    An axis of up to LABEL_EVERY_TOKEN_UP_TO tokens names every one (label_font_px(n) small, keys written
    upwards), and the figure is at least `height` px, taller when its rows need label_pitch_px each. The keys need
    as much width, label_pitch_px(Tk) per column, or their labels touch. Labels must be unique (plotly merges
    equal category names), so callers pass labels that carry the token's position, e.g. "12 the".
    """
    weights = as_f32(weights)
    if weights.ndim != 2:
        raise ValueError(f"attention_heatmap wants a 2-D matrix [queries, keys], got shape {weights.shape}")
    if weights.shape != (len(query_labels), len(key_labels)):
        raise ValueError(
            f"attention_heatmap: matrix shape {weights.shape} does not match "
            f"{len(query_labels)} query labels × {len(key_labels)} key labels"
        )
    queries, keys = plotly_text(query_labels), plotly_text(key_labels)
    fig = go.Figure(weight_trace(weights, keys, queries, zmax,
                                 "query %{y} → key %{x}<br>weight %{z:.4f}<extra></extra>"))
    base_layout(fig, title, legible_height(queries, keys, height))
    fig.update_xaxes(title_text="key (attended to)", type="category", tickangle=-60, automargin=True)
    fig.update_yaxes(title_text="query (attending)", type="category", autorange="reversed", automargin=True)
    if len(keys) <= LABEL_EVERY_TOKEN_UP_TO:
        fig.update_xaxes(every_label(keys), tickangle=-60 if len(keys) <= 16 else -90)
    if len(queries) <= LABEL_EVERY_TOKEN_UP_TO:
        fig.update_yaxes(every_label(queries))
    fig.update_layout(plot_bgcolor=MASKED_COLOR)
    return fig


def every_label(labels: list[str]) -> dict:
    """Axis settings that name every category (plotly's automatic ticks skip some once they crowd)."""
    return {"tickmode": "array", "tickvals": labels, "ticktext": labels, "tickfont": {"size": label_font_px(len(labels))}}


def legible_height(query_labels: list[str], key_labels: list[str], at_least: int) -> int:
    """A heatmap's height in px: the title, label_pitch_px per query row, and below the plot the key labels
    written upwards (their length, up to 18 characters) and the axis title; never below at_least. Axes of more
    than LABEL_EVERY_TOKEN_UP_TO tokens keep plotly's thinned labels and at_least."""
    rows, cols = len(query_labels), len(key_labels)
    if rows > LABEL_EVERY_TOKEN_UP_TO:
        return at_least
    longest = min(18, max((len(k) for k in key_labels), default=0)) if cols <= LABEL_EVERY_TOKEN_UP_TO else 8
    below = 50 + math.ceil(longest * label_font_px(cols) * 0.62)
    return max(at_least, 60 + rows * label_pitch_px(rows) + below)


def pooled_heatmap(
    weights: np.ndarray,
    query_edges: Sequence[int],
    key_edges: Sequence[int],
    title: str,
    height: int = 640,
) -> go.Figure:
    """A pooled attention matrix [Sq, Sk] whose cell (i, j) covers query tokens
    query_edges[i]..query_edges[i+1]-1 and key tokens key_edges[j]..key_edges[j+1]-1."""
    weights = as_f32(weights)
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
    base_layout(fig, title, height)
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
    overview = as_f32(overview)
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
    base_layout(fig, title, height=min(1200, 110 + n_heads * tile_px))
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


# eq. 2.1's three stages, as the figures title them: short enough for a panel a third of a wide page across
STAGES = ("scores", "masked", "softmax")
STAGE_TITLES = {"scores": "scores QKᵀ/√d_k", "masked": "+ mask M", "softmax": "softmax → weights"}
STAGE_HEIGHT = 340


def score_bound(matrices: Sequence[np.ndarray]) -> float:
    """The largest finite |score| among the matrices: one signed colour scale for every score panel, so that
    panels drawn apart still compare."""
    finite = np.concatenate([as_f32(m).ravel() for m in matrices]) if len(matrices) else np.zeros(0, np.float32)
    finite = finite[np.isfinite(finite)]
    return float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0


def stage_trace(z: np.ndarray, stage: str, key_labels: Sequence[str], query_labels: Sequence[str], bound: float,
                hover_name: str, colorbar: dict | None) -> go.Heatmap:
    """One stage of eq. 2.1 as a heatmap: scores signed around 0 (±bound), weights from 0 to 1. Masked entries (−∞)
    travel as NaN (JSON has no infinity) and are drawn as gaps, which the figure's grey background shows."""
    if stage not in STAGE_TITLES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    z = as_f32(z)
    z = np.where(np.isfinite(z), z, np.nan)
    signed = stage != "softmax"
    return go.Heatmap(
        z=z,
        x=plotly_text(key_labels),
        y=plotly_text(query_labels),
        colorscale=SIGNED_COLORS if signed else ATTENTION_COLORS,
        reversescale=signed,
        zmid=0.0 if signed else None,
        zmin=-bound if signed else 0.0,
        zmax=bound if signed else 1.0,
        showscale=colorbar is not None,
        colorbar=colorbar,
        hovertemplate="query %{y} → key %{x}<br>%{z:.3f}<extra>" + hover_name + "</extra>",
        hoverongaps=False,
    )


def stage_figure(
    matrix: np.ndarray,
    stage: str,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    subtitle: str,
    bound: float | None = None,
    height: int = STAGE_HEIGHT,
    title: str | None = None,
) -> go.Figure:
    """One stage of eq. 2.1 ("scores", "masked" or "softmax") for a window [Tq, Tk], as a figure of its own, titled
    STAGE_TITLES[stage] unless `title` names the model's own terms (its scale, a soft-cap, a score bias).

    Its colour bar sits in its own right margin, so figures side by side (or stacked on a phone) never cover each
    other. bound: the ± range of a score stage's colours (default: this matrix's largest finite |score|); pass
    score_bound of every score panel shown together so their colours compare."""
    matrix = as_f32(matrix)
    if matrix.shape != (len(query_labels), len(key_labels)):
        raise ValueError(f"stage_figure: matrix shape {matrix.shape} does not match {len(query_labels)} query "
                         f"labels × {len(key_labels)} key labels")
    bound = score_bound([matrix]) if bound is None else float(bound)
    colorbar = {"thickness": 10, "len": 1.0, "tickfont": {"size": 9}, "outlinewidth": 0}
    title = title or STAGE_TITLES.get(stage, "")  # an unknown stage: stage_trace says which are known
    fig = go.Figure(stage_trace(matrix, stage, key_labels, query_labels, bound, title, colorbar))
    base_layout(fig, title, height, top=64)
    fig.update_layout(title={"subtitle": {"text": subtitle, "font": {"size": 11}}},
                      margin={"l": 10, "r": 10, "b": 10}, plot_bgcolor=MASKED_COLOR)
    fig.update_xaxes(title_text="key", title_font_size=10, type="category", tickangle=-60, tickfont={"size": 9},
                     automargin=True)
    fig.update_yaxes(title_text="query", title_font_size=10, type="category", autorange="reversed",
                     tickfont={"size": 9}, automargin=True)
    return fig


def stages_figure(
    stages: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    title: str,
) -> go.Figure:
    """Eq. 2.1 step by step in one figure: one row per variant (e.g. a head, or "causal mask on" / "off", named on
    the row's first y axis), three columns: scaled scores QKᵀ/√d_k, scores + mask M, softmax.

    Masked entries (−∞) are drawn grey; JSON has no infinity, so they travel as NaN. The two colour bars (scores,
    weights) stand at the right edge, clear of every panel."""
    names = list(stages)
    fig = make_subplots(
        rows=len(names),
        cols=3,
        subplot_titles=[STAGE_TITLES[stage] for _ in names for stage in STAGES],
        horizontal_spacing=0.08,
        vertical_spacing=0.14 if len(names) > 1 else 0.1,
    )
    bound = score_bound([stages[n][0] for n in names])
    bars = {"masked": {"x": 1.02, "y": 0.76, "len": 0.45, "thickness": 10, "title": {"text": "score"}},
            "softmax": {"x": 1.02, "y": 0.24, "len": 0.45, "thickness": 10, "title": {"text": "weight"}}}
    for r, name in enumerate(names, start=1):
        for c, (stage, z) in enumerate(zip(STAGES, stages[name]), start=1):
            colorbar = bars.get(stage) if r == 1 else None
            fig.add_trace(stage_trace(z, stage, key_labels, query_labels, bound, name, colorbar), row=r, col=c)
        fig.update_yaxes(title_text=name, title_font_size=11, row=r, col=1)
    base_layout(fig, title, height=340 * len(names) + 80)
    fig.update_xaxes(type="category", tickangle=-60, tickfont={"size": 9})
    fig.update_yaxes(type="category", autorange="reversed", tickfont={"size": 9})
    fig.update_annotations(font_size=12)  # the subplot titles
    fig.update_layout(plot_bgcolor=MASKED_COLOR)
    return fig


def line_levels(weights: np.ndarray) -> np.ndarray:
    """The two-column view's opacity level of each weight [Tq, Tk] as int8: round(OPACITY_LEVELS · w) clipped to
    1..OPACITY_LEVELS where w ≥ MIN_LINE_WEIGHT, else 0 (no line). A line's opacity level / OPACITY_LEVELS then
    lies within 1/OPACITY_LEVELS of its weight (within half that for w ≥ 1/(2·OPACITY_LEVELS))."""
    w = np.where(np.isfinite(weights), weights, 0.0)
    levels = np.clip(np.rint(w * OPACITY_LEVELS), 1, OPACITY_LEVELS).astype(np.int8)
    return np.where(w >= MIN_LINE_WEIGHT, levels, 0).astype(np.int8)


def line_group(pairs: Sequence[tuple[int, int]], level: int, side: str, index: int, shown: bool) -> go.Scatter:
    """One trace of lines from query i (x = 0) to key j (x = 1) for the (i, j) in pairs, all of one opacity level,
    joined by None gaps. meta says which token the group belongs to, for the hover filter; the group is drawn at
    its opacity if shown, else at 0 until a hover shows it."""
    x, y = [], []
    for i, j in pairs:
        x += [0, 1, None]
        y += [int(i), int(j), None]
    opacity = level / OPACITY_LEVELS
    return go.Scatter(x=x, y=y, mode="lines", line={"color": LINE_COLOR, "width": 2}, opacity=opacity if shown else 0,
                      hoverinfo="skip", showlegend=False,
                      meta={"role": "lines", "side": side, "index": index, "opacity": opacity})


def two_column_view(matrix: np.ndarray, labels: Sequence[str], title: str) -> go.Figure:
    """One head [n, n] as two columns of the same tokens, queries on the left and keys on the right, and a line
    from query i to key j whose opacity is the weight, quantised by line_levels (none below MIN_LINE_WEIGHT).

    Lines are grouped per token and opacity level, so the figure has at most 2 · n · OPACITY_LEVELS line traces:
    per query (drawn, the whole head) and per key (opacity 0). Each carries meta {"role": "lines", "side": "query"
    or "key", "index", "opacity"}; one transparent heatmap (meta {"role": "tokens"}, column 0 the queries, column 2
    the keys, row = token) is what a hover on a token hits. ui/tabs/hover.py's script uses these to show only the
    hovered token's lines. For up to about 40 tokens; above LABEL_EVERY_TOKEN_UP_TO the labels would not fit.
    """
    weights = as_f32(matrix)
    n = len(labels)
    if weights.ndim != 2 or weights.shape != (n, n):
        raise ValueError(f"two_column_view wants a square matrix [n, n] for its {n} labels, got shape {weights.shape}")
    if n > LABEL_EVERY_TOKEN_UP_TO:
        raise ValueError(f"two_column_view draws at most {LABEL_EVERY_TOKEN_UP_TO} tokens, got {n}: pool the text or "
                         "use the heatmap")
    levels = line_levels(weights)
    font, pitch = label_font_px(n), label_pitch_px(n)
    reach = 0.75  # each label column's width in units of the gap between the columns
    tokens = plotly_text(labels)
    cells = np.zeros((n, 3), dtype=np.float32)
    cells[:, 1] = np.nan  # the gap between the columns hovers as nothing (hoverongaps=False)
    fig = go.Figure(go.Heatmap(
        z=cells, x=[-reach, 0, 1, 1 + reach], y=np.arange(n + 1) - 0.5, hoverongaps=False, hoverinfo="none",
        colorscale=[[0, "rgba(0,0,0,0)"], [1, "rgba(0,0,0,0)"]], showscale=False, meta={"role": "tokens"},
    ))
    for level in range(1, OPACITY_LEVELS + 1):
        at = levels == level
        for i in np.flatnonzero(at.any(axis=1)):
            fig.add_trace(line_group([(i, j) for j in np.flatnonzero(at[i])], level, "query", int(i), shown=True))
        for j in np.flatnonzero(at.any(axis=0)):
            fig.add_trace(line_group([(i, j) for i in np.flatnonzero(at[:, j])], level, "key", int(j), shown=False))
    for x, position in ((-0.03, "middle left"), (1.03, "middle right")):  # a little apart from the lines' ends
        fig.add_trace(go.Scatter(x=[x] * n, y=list(range(n)), mode="text", text=tokens, textposition=position,
                                 textfont={"size": font}, hoverinfo="skip", showlegend=False))
    base_layout(fig, title, height=max(300, 90 + n * pitch), top=60)
    fig.update_xaxes(visible=False, range=[-reach, 1 + reach], fixedrange=True)
    fig.update_yaxes(visible=False, range=[n - 0.5, -1.5], fixedrange=True)
    for x, anchor, text in ((0, "right", "query (attending)"), (1, "left", "key (attended to)")):
        fig.add_annotation(x=x, y=-0.8, xanchor=anchor, yanchor="bottom", text=text, showarrow=False,
                           font={"size": 12})
    fig.update_layout(margin={"l": 10, "r": 10}, hovermode="closest", dragmode=False,
                      meta={"view": "two-column", "tokens": n, "levels": OPACITY_LEVELS, "min_weight": MIN_LINE_WEIGHT})
    return fig


def window_mask_figure(mask: np.ndarray, own: np.ndarray, title: str, subtitle: str) -> go.Figure:
    """A window's mask [T, T] over the layer's own (causal, maybe its family's window): keys it reads, keys the
    window hides, and keys the layer never reads (grey)."""
    mask, own = np.asarray(mask, bool), np.asarray(own, bool)
    if mask.shape != own.shape or mask.ndim != 2:
        raise ValueError(f"window_mask_figure: mask {mask.shape} and own mask {own.shape} must be one T × T shape")
    z = np.where(own & mask, 1.0, np.where(own, 0.0, np.nan)).astype(np.float32)
    fig = go.Figure(go.Heatmap(z=z, colorscale=[[0, "#f4a261"], [1, "#2a6f97"]], zmin=0, zmax=1, showscale=False,
                               hoverongaps=False,
                               hovertemplate="query %{y} → key %{x}<br>%{z:.0f} (1 read, 0 hidden by the window)"
                                             "<extra></extra>"))
    base_layout(fig, title, 380, top=64)
    fig.update_layout(title={"subtitle": {"text": subtitle, "font": {"size": 11}}}, plot_bgcolor=MASKED_COLOR,
                      margin={"l": 10, "r": 10, "b": 10})
    fig.update_xaxes(title_text="key position", title_font_size=10, automargin=True)
    fig.update_yaxes(title_text="query position", title_font_size=10, autorange="reversed", automargin=True)
    return fig


def window_weights_figure(full: np.ndarray, windowed: np.ndarray, title: str,
                          readable: np.ndarray | None = None) -> go.Figure:
    """One head's weights [T, T] with the full mask and with the window, side by side, and their difference
    (windowed − full, signed). readable [T, T] bool: the keys the layer may read at all (the lower triangle, a
    decoder's causal mask, by default; every key for an encoder); the rest is drawn grey (NaN)."""
    full, windowed = as_f32(full), as_f32(windowed)
    if full.shape != windowed.shape or full.ndim != 2:
        raise ValueError(f"window_weights_figure: {full.shape} and {windowed.shape} must be one T × T shape")
    n = full.shape[0]
    causal = np.tril(np.ones((n, n), bool)) if readable is None else np.asarray(readable, bool)
    diff = np.where(causal, windowed - full, np.nan)
    bound = float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() and np.nanmax(np.abs(diff)) > 0 else 1.0
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.06,
                        subplot_titles=["full mask", "window", "window − full"])
    for col, (z, name) in enumerate(((full, "full"), (windowed, "window")), start=1):
        fig.add_trace(go.Heatmap(z=np.where(causal, z, np.nan), colorscale=ATTENTION_COLORS, zmin=0, zmax=1,
                                 showscale=col == 1, hoverongaps=False,
                                 colorbar={"x": 1.02, "y": 0.75, "len": 0.45, "thickness": 10,
                                           "title": {"text": "weight"}},
                                 hovertemplate="query %{y} → key %{x}<br>%{z:.4f}<extra>" + name + "</extra>"),
                      row=1, col=col)
    fig.add_trace(go.Heatmap(z=diff, colorscale=SIGNED_COLORS, reversescale=True, zmid=0.0, zmin=-bound,
                             zmax=bound, hoverongaps=False,
                             colorbar={"x": 1.02, "y": 0.22, "len": 0.45, "thickness": 10, "title": {"text": "Δ"}},
                             hovertemplate="query %{y} → key %{x}<br>Δ %{z:.4f}<extra></extra>"), row=1, col=3)
    base_layout(fig, title, 360, top=64)
    fig.update_layout(plot_bgcolor=MASKED_COLOR, margin={"l": 10, "r": 60, "b": 10})
    fig.update_yaxes(autorange="reversed", tickfont={"size": 9})
    fig.update_xaxes(tickfont={"size": 9})
    fig.update_annotations(font_size=12)
    return fig
