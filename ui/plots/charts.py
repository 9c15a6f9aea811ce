"""General charts: a matrix as a heatmap, lines against x, grouped bars."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

import plotly.io as pio

from ui.plots.base import SIGNED_COLORS, TEMPLATE, as_f32, base_layout

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
    matrix = as_f32(matrix)
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
    base_layout(fig, title, height)
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
    subtitle: str | None = None,
) -> go.Figure:
    """Several named curves over one x axis; `reference` adds dashed horizontal lines, `subtitle` a smaller line
    under the title."""
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
    base_layout(fig, title, height)
    integer_x = np.issubdtype(x.dtype, np.integer)
    fig.update_xaxes(
        title_text=x_title, tickformat="d" if integer_x else None, dtick=1 if integer_x and x.size <= 12 else None
    )
    fig.update_yaxes(title_text=y_title)
    fig.update_layout(legend={"orientation": "h", "y": -0.25})
    return with_subtitle(fig, subtitle)


def bar_figure(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    title: str,
    y_title: str,
    height: int = 380,
    text_format: str = ".3f",
    x_title: str | None = None,
    subtitle: str | None = None,
    mark_zeros: bool = False,
) -> go.Figure:
    """Grouped bars: one group per category, one bar per named series (values printed when there are few).

    A bar of exactly 0 has no height, and plotly draws nothing for it. mark_zeros puts a dot on the baseline
    where it stands, in its series' colour, that hovers as "exactly 0" (one dot trace per series, grouped with
    its bars, named in the legend where a series has a zero); the value itself stays 0. subtitle: a smaller line
    under the title."""
    fig = go.Figure()
    show_values = len(categories) <= 8
    colors = pio.templates[TEMPLATE].layout.colorway
    for index, (name, values) in enumerate(series.items()):
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
        if mark_zeros:
            color = colors[index % len(colors)]
            fig.data[-1].update(marker_color=color, offsetgroup=name, legendgroup=name)
            fig.add_trace(zero_marks(categories, values, name, color, text_format))
    base_layout(fig, title, height)
    fig.update_xaxes(title_text=x_title, type="category")
    fig.update_yaxes(title_text=y_title)
    # plotly shrinks a printed value to its bar's width: a gap between a group's bars keeps neighbouring values apart
    fig.update_layout(barmode="group", bargroupgap=0.15, legend={"orientation": "h", "y": -0.2}, margin={"t": 80})
    if mark_zeros:
        fig.update_layout(scattermode="group")  # each dot stands under its own bar of the group
    return with_subtitle(fig, subtitle)


def zero_marks(categories: Sequence[str], values: Sequence[float], name: str, color: str,
               text_format: str) -> go.Scatter:
    """Dots on the baseline under the bars of `values` that are exactly 0 (a gap elsewhere), at the bars' offset."""
    zeros = [v == 0.0 for v in values]
    return go.Scatter(
        x=list(categories),
        y=[0.0 if zero else None for zero in zeros],
        mode="markers",
        marker={"color": color, "size": 8, "symbol": "circle", "line": {"color": "white", "width": 1}},
        text=[format(0.0, text_format) if zero else "" for zero in zeros],
        name=f"{name}: exactly 0",
        offsetgroup=name,
        legendgroup=name,
        showlegend=any(zeros),
        cliponaxis=False,
        hovertemplate="%{x}: %{text} (exactly 0)<extra>" + name + "</extra>",
    )


def with_subtitle(fig: go.Figure, subtitle: str | None) -> go.Figure:
    """A smaller second line under the figure's title, with the top margin to hold both."""
    if subtitle:
        fig.update_layout(title={"subtitle": {"text": subtitle, "font": {"size": 12}}},
                          margin={"t": max(fig.layout.margin.t or 0, 80)})
    return fig


def score_bias_figure(distances: np.ndarray, bias: np.ndarray, title: str, height: int = 380,
                      subtitle: str = "the same in every layer") -> go.Figure:
    """A bias on the attention scores against distance, one line per head: distances [D] (i − j, query minus key;
    negative where the key comes after the query), bias [H, D]. ALiBi's lines are straight, −m_h·(i − j); T5's
    are steps, one learned value per bucket of distance."""
    bias = np.asarray(bias)
    if bias.ndim != 2 or bias.shape[1] != len(distances):
        raise ValueError(f"score_bias_figure: bias must be [heads, {len(distances)}], got {list(bias.shape)}")
    return line_figure(np.asarray(distances), {f"head {h}": bias[h] for h in range(bias.shape[0])}, title,
                       "distance i − j (query minus key; negative: the key comes after)", "bias added to the score",
                       height=height, reference={"no bias": 0.0}, subtitle=subtitle)
