"""The online softmax of one query row (eq. 6.10), as FlashAttention reads the keys: per block, the block's own max,
the running max m and the running sum ℓ after it (the rescaling factor e^(m_old − m_new) in the hover), and the
softmax read that way overlaid on the plain one, key by key. Token labels are escaped."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.plots.base import as_f32, base_layout
from ui.plots.text import escaped

PLAIN_COLOR, ONLINE_COLOR, MAX_COLOR, SUM_COLOR = "#c7c7c7", "#d62728", "#1f77b4", "#2ca02c"


def finite_or_none(values: np.ndarray) -> list:
    # −∞ (a block whose keys are all masked, or m before any key) has no point on an axis
    return [float(v) if np.isfinite(v) else None for v in values]


def online_softmax_figure(starts: np.ndarray, stops: np.ndarray, block_max: np.ndarray, running_max: np.ndarray,
                          rescale: np.ndarray, running_sum: np.ndarray, plain: np.ndarray, online: np.ndarray,
                          keys: Sequence[str], title: str, height: int = 420) -> go.Figure:
    """Left: per block of keys, the block's max and the running max m; middle: the running sum ℓ; right: the plain
    softmax (bars) and the online one (points) over the keys. Arrays per block: starts/stops [blocks]; per key:
    plain/online [n], keys [n] labels."""
    blocks = [f"{a}–{b - 1}" if b - a > 1 else f"{a}" for a, b in zip(starts, stops)]
    if not len(blocks) == len(block_max) == len(running_max) == len(rescale) == len(running_sum):
        raise ValueError("online_softmax_figure: one value per block for the max, m, the rescale and ℓ")
    if not len(plain) == len(online) == len(keys):
        raise ValueError("online_softmax_figure: one plain and one online weight per key")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09, column_widths=[0.3, 0.3, 0.4],
                        subplot_titles=("max: the block's and the running m", "running sum ℓ",
                                        "weights: plain (bars) and online (points)"))
    hover = [f"rescale e^(m_old − m_new) = {r:.4g}" for r in rescale]
    fig.add_trace(go.Scatter(x=blocks, y=finite_or_none(block_max), mode="markers", name="the block's max",
                             marker={"color": MAX_COLOR, "symbol": "circle-open", "size": 9}), 1, 1)
    fig.add_trace(go.Scatter(x=blocks, y=finite_or_none(running_max), mode="lines+markers", name="running max m",
                             line={"color": MAX_COLOR}, text=hover,
                             hovertemplate="keys %{x}: m = %{y:.4g}<br>%{text}<extra></extra>"), 1, 1)
    fig.add_trace(go.Scatter(x=blocks, y=as_f32(running_sum), mode="lines+markers", name="running sum ℓ",
                             line={"color": SUM_COLOR}, text=hover,
                             hovertemplate="keys %{x}: ℓ = %{y:.4g}<br>%{text}<extra></extra>"), 1, 2)
    labels = [f"{i} {escaped(t)}" for i, t in enumerate(keys)]
    fig.add_trace(go.Bar(x=labels, y=as_f32(plain), name="plain softmax", marker_color=PLAIN_COLOR,
                         hovertemplate="%{x}: %{y:.6f}<extra>plain</extra>"), 1, 3)
    fig.add_trace(go.Scatter(x=labels, y=as_f32(online), mode="markers", name="online softmax",
                             marker={"color": ONLINE_COLOR, "size": 6},
                             hovertemplate="%{x}: %{y:.6f}<extra>online</extra>"), 1, 3)
    base_layout(fig, title, height, top=80)
    fig.update_xaxes(title_text="block of keys", col=1)
    fig.update_xaxes(title_text="block of keys", col=2)
    fig.update_xaxes(title_text="key", tickangle=-45, col=3)
    fig.update_layout(legend={"orientation": "h", "y": -0.35})
    return fig
