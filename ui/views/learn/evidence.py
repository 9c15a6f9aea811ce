"""The figure of the lesson on what attention does not tell you (ui/services/learn/evidence.py): every head as one
point, its attention on the answer's earlier mention across, its patching score up."""

from __future__ import annotations

import numpy as np

from ui.plots.base import empty_figure
from ui.plots.charts import line_figure


def not_explanations_figure(measured):
    v = measured.values
    if "attention" not in v:
        return empty_figure(measured.alt)
    attention, scores = np.asarray(v["attention"], float), np.asarray(v["patching"], float)   # [L, H]
    n_heads = attention.shape[1]
    order = np.argsort(attention, axis=None, kind="stable")
    labels = [f"L{i // n_heads} H{i % n_heads}" for i in order]
    fig = line_figure(attention.flatten()[order], {"each head": scores.flatten()[order]},
                      f"Attention on {v['word']} is not what carries the answer", f"attention from the last token "
                      f"to {v['word']}", "patching score (1: restores the answer)",
                      subtitle=f"Spearman's ρ = {v['rho']:.2f} over {attention.size} heads")
    fig.update_traces(mode="markers", text=labels,
                      hovertemplate="%{text}: attention %{x:.3f}, patching %{y:.3f}<extra></extra>")
    fig.update_layout(showlegend=False)
    return fig


FIGURES = {"not-explanations": not_explanations_figure}
