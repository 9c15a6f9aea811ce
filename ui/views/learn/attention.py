"""The figures of the course's attention lessons (ui/services/learn/attention.py), drawn from Measured.values."""

from __future__ import annotations

import numpy as np

from ui.plots.charts import bar_figure, line_figure, matrix_heatmap


def reading_figure(measured):
    """The two ways of reading the text, each run's time in ms."""
    v = measured.values
    runs = {f"run {i + 1}": [1e3 * a, 1e3 * b] for i, (a, b) in enumerate(zip(v["at_once"], v["one_by_one"]))}
    later = "each step reruns the prefix" if v["encoder_only"] else "a KV-cache step per token"
    return bar_figure(["one pass", "one token at a time"], runs, f"Reading {v['tokens']} tokens", "milliseconds",
                      text_format=".0f", subtitle=f"{later}; one pass {v['ratio']:.1f}× faster (medians)")


def scores_figure(measured):
    """One head's QKᵀ over the text, the masked cells left blank."""
    v = measured.values
    labels = v["labels"]
    return matrix_heatmap(v["scores"], f"Scores q·k, layer {v['layer']}, head {v['head']} (before the scale)",
                          "key", "query", x=labels, y=labels, value_name="q·k")


def scale_figure(measured):
    """The head's variance after the scale and its entropy with and without it, beside random unit vectors."""
    v = measured.values
    categories = ["Var(q·k) after the scale", "entropy with the scale (nats)", "entropy without it (nats)"]
    series = {f"layer {v['layer']}, head {v['head']}": [v["scaled_variance"], *v["entropy"]],
              "random unit-variance q, k": [v["random_variance"], *v["random_entropy"]]}
    return bar_figure(categories, series, "What the scale does: a real head against eq. 2.2's random vectors",
                      "value", text_format=".2f",
                      subtitle=(f"d_k = {v['d_head']}; before the scale Var(q·k) = {v['raw_variance']:.0f}; "
                                f"component variance of q {v['var_q']:.2f}, of k {v['var_k']:.2f}"))


def masks_figure(measured):
    """Per layer, the attention that leaks: onto later tokens without the causal mask, onto padding without its."""
    v = measured.values
    layers = np.arange(len(v["later_share"]))
    later = "on later tokens, causal mask off" if v["decoder_only"] else "on later tokens (no causal mask)"
    series = {later: np.asarray(v["later_share"])}
    if v["pad_share"] is not None:
        series["on padding, padding mask off"] = np.asarray(v["pad_share"])
    return line_figure(layers, series, "Where attention goes when a mask is off", "layer", "share of attention",
                       reference={"with the masks on": 0.0}, subtitle="mean over heads and queries")


def heads_figure(measured):
    """W^Q, W^K, W^V, W^O of one layer as counted, against d² each (4d² in all)."""
    v = measured.values
    names = ["W^Q", "W^K", "W^V", "W^O"]
    d = v["d_model"]
    return bar_figure(names, {"this model": [v["counts"][n] for n in names], "d² each (4d² in all)": [d * d] * 4},
                      "One layer's attention weights", "parameters", text_format=",.0f",
                      subtitle=f"d = {d}, {v['n_heads']} query heads, {v['n_kv_heads']} key/value heads of "
                               f"{v['head_dim']}")


FIGURES = {"why-attention": reading_figure, "queries-keys-values": scores_figure, "sqrt-dk": scale_figure,
           "masks": masks_figure, "heads": heads_figure}
