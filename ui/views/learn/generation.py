"""The figures of the lessons on generation and cost (ui/services/learn/generation.py): the KV cache's size at a few
lengths with and without grouped-query attention (on linear axes: it grows linearly), and the growth of one
head's weights against the time of a forward pass, on log axes beside n and n², over one attention layer timed
alone on long texts (the shipped bench's run and this run's point)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.plots.base import base_layout, empty_figure, linear_lengths, log_axis
from ui.plots.charts import line_figure, with_subtitle


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


COST_PANELS = ("this model: one head's weights and a whole pass, from its shortest length",
               "one attention layer alone, on long texts (ms)")


def cost_figure(measured):
    """Two panels, log-log. Above: growth from the shortest length of the counted weights of one head and the
    fastest forward pass, with n and n² as guides. Below: one attention layer alone against length, the shipped
    bench's fastest runs per method with the exponent it fitted, and this run's point at the lesson's length."""
    v = measured.values
    lengths = np.asarray(v["lengths"])
    grows = lengths / lengths[0]
    series = {
        "one head's weights (counted bytes)": np.asarray(v["per_head_bytes"], float) / v["per_head_bytes"][0],
        "forward pass without a cache (seconds)": np.asarray(v["seconds"], float) / v["seconds"][0],
        "∝ n": grows.astype(float),
        "∝ n²": grows.astype(float) ** 2,
    }
    bench, now = v.get("layer_cost"), v.get("layer_now")
    rows = 2 if bench else 1
    fig = make_subplots(rows=rows, cols=1, subplot_titles=COST_PANELS[:rows], vertical_spacing=0.2)
    for name, ys in series.items():
        guide = name.startswith("∝")
        fig.add_trace(go.Scatter(x=lengths, y=ys, name=name, mode="lines" if guide else "lines+markers",
                                 line={"dash": "dot", "color": "grey"} if guide else None), row=1, col=1)
    subtitle = f"time ∝ n^{v['exponent']:.2f} here; the weights ∝ n² (eq. 6.12)"
    base_layout(fig, "What grows as n², and when the time does too", 380 * rows)
    fig.update_xaxes(title_text="tokens n", row=1, col=1, **log_axis(lengths, ticks=lengths))
    fig.update_yaxes(title_text=f"× its value at {lengths[0]} tokens", row=1, col=1, **log_axis(*series.values()))
    if bench:
        subtitle += "; " + layer_alone(fig, bench, now)
    fig.update_layout(legend={"orientation": "h", "y": -0.12})
    return with_subtitle(fig, subtitle)


def layer_alone(fig, bench: dict, now: dict | None) -> str:
    """The second panel: the bench's fastest run at each length per method, named with its fitted exponent, and
    this run's points at the lesson's length; returns the subtitle's words for it."""
    top = f"{bench['fit_lengths'][0]:,}–{bench['fit_lengths'][-1]:,}"
    drawn = []
    for method, run in bench["methods"].items():
        ms = np.asarray(run["fastest"], float) * 1e3
        drawn.append(ms)
        fig.add_trace(go.Scatter(x=run["lengths"], y=ms, mode="lines+markers",
                                 name=f"{method}, saved run: ∝ n^{run['fastest_exponent']:.2f} at {top} tokens"),
                      row=2, col=1)
    lengths = list(bench["methods"]["dense"]["lengths"])
    if now:
        ms = [1e3 * now["seconds"][m] for m in now["seconds"]]
        drawn.append(ms)
        fig.add_trace(go.Scatter(x=[now["n"]] * len(ms), y=ms, mode="markers+text", text=list(now["seconds"]),
                                 textposition="middle left", marker={"size": 11, "symbol": "diamond", "color": "black"},
                                 name=f"this run, at {now['n']} tokens"), row=2, col=1)
        lengths = sorted({*lengths, int(now["n"])})
    fig.update_xaxes(title_text="tokens n", row=2, col=1,
                     **log_axis(lengths, ticks=lengths, labels=[f"{n:,}" for n in lengths]))
    fig.update_yaxes(title_text=f"ms, fastest of {bench['repeats']} runs", row=2, col=1, **log_axis(*drawn))
    dense = bench["methods"]["dense"]["fastest_exponent"]
    return f"one layer alone at {top} tokens ∝ n^{dense:.2f} on the plain path"


FIGURES = {"kv-cache": kv_cache_figure, "cost": cost_figure}
