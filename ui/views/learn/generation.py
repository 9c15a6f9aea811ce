"""The figures of the lessons on generation and cost (ui/services/learn/generation.py): the KV cache's size at a few
lengths with and without grouped-query attention (on linear axes: it grows linearly), and the growth of one
head's weights against the time of a forward pass, on log axes beside n and n²."""

from __future__ import annotations

import numpy as np

from ui.plots.base import empty_figure, linear_lengths, log_axis
from ui.plots.charts import line_figure


def kv_cache_figure(measured):
    """Megabytes of the cache against tokens: the allocated tensors for this model, eq. 6.9 with h_kv = h."""
    v = measured.values
    if not v.get("lengths"):
        return empty_figure(measured.alt)
    lengths = np.asarray(v["lengths"])
    series = {f"this model, allocated (h_kv = {v['kv_heads']})": np.asarray(v["allocated"]) / 1e6}
    if v["heads"] != v["kv_heads"]:
        series[f"without GQA, eq. 6.9 (h_kv = h = {v['heads']})"] = np.asarray(v["no_gqa"]) / 1e6
    fig = line_figure(lengths, series, "The KV cache grows with every token", "tokens n", f"MB ({v['dtype']})",
                      subtitle=f"2 · {v['layers']} layers · n · h_kv · {v['head_dim']} · {v['bytes_per']} bytes "
                               "(eq. 6.9); the allocated tensors equal the formula")
    # linear axes: the cache grows linearly in n (eq. 6.9), a straight line through 0 (on a log n axis it bends)
    fig.update_xaxes(**linear_lengths(lengths))
    fig.update_yaxes(rangemode="tozero")
    return fig


def cost_figure(measured):
    """Growth from the shortest length, log-log: the counted weights of one head and the fastest forward pass,
    with n and n² as guides."""
    v = measured.values
    lengths = np.asarray(v["lengths"])
    grows = lengths / lengths[0]
    series = {
        "one head's weights (counted bytes)": np.asarray(v["per_head_bytes"], float) / v["per_head_bytes"][0],
        "forward pass without a cache (seconds)": np.asarray(v["seconds"], float) / v["seconds"][0],
        "∝ n": grows.astype(float),
        "∝ n²": grows.astype(float) ** 2,
    }
    fig = line_figure(lengths, series, "What grows as n², and what a pass's time does", "tokens n",
                      f"× its value at {lengths[0]} tokens",
                      subtitle=f"time ∝ n^{v['exponent']:.2f} here; the weights ∝ n² (eq. 6.12)")
    for name in ("∝ n", "∝ n²"):
        fig.update_traces(selector={"name": name}, line={"dash": "dot", "color": "grey"}, mode="lines")
    fig.update_xaxes(**log_axis(lengths, ticks=lengths))
    fig.update_yaxes(**log_axis(*series.values()))
    return fig


FIGURES = {"kv-cache": kv_cache_figure, "cost": cost_figure}
