"""Figures of approximate attention: each head's error as a map (layers across, heads down; a head left exact is a
grey cell, "not approximated"), the model's change and the cache's bytes per token as two small bar panels, and the
time of one attention layer against length, each method a line on log axes with the length from which an
approximation is faster than its exact reference starred. Arrays and strings in, plotly figures out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.plots.base import ATTENTION_COLORS, MASKED_COLOR, as_f32, base_layout, fit_narrow, log_axis

NOT_APPROXIMATED = "not approximated (exact attention)"
EXACT_STYLE = {"sdpa": {"color": "#222222", "width": 3}, "eager": {"color": "#7f7f7f", "width": 2, "dash": "dash"},
               "sdpa_bi": {"color": "#222222", "width": 2, "dash": "dot"}}
CROSSING = {"symbol": "star", "size": 15, "line": {"width": 1, "color": "#222222"}}


def error_map(values: np.ndarray, measure: str, title: str, subtitle: str = "") -> go.Figure:
    """values [layers, heads] ≥ 0, NaN where a head is not approximated: a heatmap with layers across and heads down
    (z is [heads, layers], as every head map of the app), its colour bar titled `measure`, each cell hovering as
    "L3 H5" with its value or "not approximated"; the NaN cells are gaps over a grey ground."""
    values = as_f32(values)
    if values.ndim != 2:
        raise ValueError(f"error_map wants [layers, heads], got shape {values.shape}")
    n_layers, n_heads = values.shape
    finite = values[np.isfinite(values)]
    top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    cells = [[f"L{layer} H{head}: " + (f"{measure} {values[layer, head]:.4g}" if np.isfinite(values[layer, head])
                                        else NOT_APPROXIMATED) for layer in range(n_layers)] for head in range(n_heads)]
    fig = go.Figure(go.Heatmap(z=np.ascontiguousarray(values.T), x=np.arange(n_layers), y=np.arange(n_heads),
                               text=cells, hovertemplate="<b>%{text}</b><extra></extra>", hoverongaps=True,
                               colorscale=ATTENTION_COLORS, zmin=0.0, zmax=top, xgap=1, ygap=1,
                               colorbar={"title": {"text": measure, "side": "right"}, "thickness": 14}))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"grey: {NOT_APPROXIMATED}",
                             marker={"symbol": "square", "size": 12, "color": MASKED_COLOR}, hoverinfo="skip"))
    base_layout(fig, title, min(620, 220 + 26 * n_heads))
    fig.update_layout(title={"subtitle": {"text": subtitle}}, plot_bgcolor=MASKED_COLOR, showlegend=True)
    fig.update_xaxes(title_text="layer", tickmode="linear", tick0=0, dtick=1 if n_layers <= 16 else 2,
                     range=[-0.5, n_layers - 0.5], showgrid=False, zeroline=False)
    fig.update_yaxes(title_text="head", tickmode="linear", tick0=0, dtick=1, range=[n_heads - 0.5, -0.5],
                     showgrid=False, zeroline=False)
    return fit_narrow(fig)


def change_figure(measure: str, exact: float, approximate: float, bytes_exact: int, bytes_approx: int,
                  title: str) -> go.Figure:
    """Two small bar panels, exact beside approximate: the model's measure (a decoder's perplexity, an encoder's
    sentence-embedding cosine to exact attention's) and the KV cache's bytes per token."""
    # panel titles short enough to stand apart over two panels on a phone (about 18 characters each)
    left = "perplexity" if measure == "perplexity" else "cosine to exact"
    fig = make_subplots(rows=1, cols=2, subplot_titles=[left, "KV bytes per token"], horizontal_spacing=0.18)
    names, colors = ["exact", "approximate"], ["#4c78a8", "#e45756"]
    shown = (".4g", ",d")
    for col, values in enumerate(((exact, approximate), (bytes_exact, bytes_approx)), start=1):
        fig.add_trace(go.Bar(x=names, y=list(values), marker_color=colors, showlegend=False, cliponaxis=False,
                             text=[format(v, shown[col - 1]) for v in values], textposition="outside",
                             hovertemplate="%{x}: %{y:" + shown[col - 1] + "}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(range=[min(0, min(values)) * 1.25, max(max(values), 1e-12) * 1.25], row=1, col=col)
    base_layout(fig, title, 340)
    return fit_narrow(fig)


def cost_figure(lengths: Mapping[str, Sequence[int]], seconds: Mapping[str, Sequence[float]],
                names: Mapping[str, str], crossings: Mapping[str, int], title: str, subtitle: str = "",
                dashed: Sequence[str] = ()) -> go.Figure:
    """One layer's time against length, every method a line on log-log axes (meta = its key, so a reader finds it
    whatever its shown name), the exact kernels drawn black and grey; crossings: method → the first measured length
    at which it is faster than its reference, starred on its line. dashed: the methods drawn dotted (bidirectional)."""
    fig = go.Figure()
    for method, xs in lengths.items():
        ys = [float(s) * 1e3 for s in seconds[method]]
        at = crossings.get(method)
        style = EXACT_STYLE.get(method, {"width": 2, **({"dash": "dot"} if method in dashed else {})})
        marker = {"size": [CROSSING["size"] if n == at else 6 for n in xs],
                  "symbol": [CROSSING["symbol"] if n == at else "circle" for n in xs],
                  "line": CROSSING["line"]}
        hover = [f"{names[method]}<br>{n:,} tokens: {y:.3g} ms" + (" ★ from here faster than its exact reference"
                                                                   if n == at else "") for n, y in zip(xs, ys)]
        fig.add_trace(go.Scatter(x=list(xs), y=ys, mode="lines+markers", name=names[method], meta=method,
                                 line=style, marker=marker, text=hover, hovertemplate="%{text}<extra></extra>"))
    all_x = [n for xs in lengths.values() for n in xs]
    all_y = [float(s) * 1e3 for ys in seconds.values() for s in ys]
    base_layout(fig, title, 520)
    ticks = sorted(set(all_x))
    fig.update_layout(title={"subtitle": {"text": subtitle}},
                      xaxis={**log_axis(ticks=ticks, labels=[f"{n:,}" for n in ticks]), "title": "tokens n"},
                      yaxis={**log_axis(np.asarray(all_y)), "title": "ms per call (median)"})
    return fit_narrow(fig)
