"""The figures of the course's lessons on the block (each sublayer's output against the residual it joins, per layer)
and on the encoder-decoder (the Lab model's cross-attention, output letters against source letters)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ui.plots.attention import attention_heatmap
from ui.plots.base import empty_figure, log_axis
from ui.plots.charts import line_figure


def shares_figure(measured):
    values = measured.values
    if len(values.get("layers", ())) == 0:
        return empty_figure("Nothing was measured.")
    layers = np.asarray(values["layers"])
    fig = line_figure(layers, {"feed-forward output": values["mlp"], "attention output": values["attn"]},
                      "Each sublayer's output as a % of the residual it joins", "layer",
                      "% of the residual (log scale)", subtitle=f"median over the text's {values['n_tokens']} tokens")
    # the 100 % line as a trace, not a shape: a shape's y on a log axis is read as log10(y), so y = 100 would
    # stretch the axis to 10^100 and flatten the data along its bottom
    fig.add_trace(go.Scatter(x=[layers.min(), layers.max()], y=[100.0, 100.0], mode="lines",
                             name="as large as the residual", line={"dash": "dash", "color": "grey"}))
    fig.update_yaxes(**log_axis(values["mlp"], values["attn"], [100.0]))
    return fig


def cross_figure(measured):
    values = measured.values
    weights = values.get("weights")
    if weights is None or np.asarray(weights).size == 0:
        return empty_figure("Nothing was measured.")
    sources = [f"{i} {t}" for i, t in enumerate(values["source"])]
    targets = [f"{i} {t}" for i, t in enumerate(values["target"])]
    return attention_heatmap(np.asarray(weights), targets, sources,
                             f"Cross-attention of the Lab's reversing model, layer {values['layer']} (mean of heads)",
                             height=480)


FIGURES = {"block": shares_figure, "encoder-decoder": cross_figure}
