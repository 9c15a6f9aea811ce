"""Predict, then see: what a lesson draws before Reveal, and the reader's guess on what it draws after.

Before Reveal a lesson shows the set-up of its measurement and nothing measured: empty axes with their units and a
neutral title, labelled by what is known before the model runs (the text's tokens, the layers and heads, the
lengths it is read at, the model's shape). These figures have no traces at all, so no value, hover or range of
theirs can come from the measurement; their axes are set from the layout alone. A lesson with nothing measured on
this model (its note says why) has no set-up figure.

On Reveal the measured figure (ui/views/learn's FIGURES) is drawn whole, and where the guess is a number on one of
its axes it is marked there, a point or a line named "your guess".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from ui.plots.base import CHOSEN_COLOR, base_layout, linear_lengths, log_axis
from ui.plots.charts import with_subtitle

GUESS = "your guess"
MAX_TICKS = 16  # an axis of more labels names every k-th, so the labels keep apart on a phone
SETUP_BACKGROUND = "#f4f4f4"  # the plot's area, to be filled on Reveal


def labelled(labels: Sequence[str], reverse: bool = False) -> dict:
    """An axis of named places 0..n-1 (tokens, layers, heads, bars' names), every one named up to MAX_TICKS."""
    n = len(labels)
    step = max(1, math.ceil(n / MAX_TICKS))
    ends = [n - 0.5, -0.5] if reverse else [-0.5, n - 0.5]
    return {"type": "linear", "range": ends, "tickvals": list(range(0, n, step)),
            "ticktext": [str(labels[i]) for i in range(0, n, step)], "showgrid": False, "zeroline": False}


def spanned(low: float, high: float, log: bool = False, ticks: Sequence[float] | None = None,
            labels: Sequence[str] | None = None) -> dict:
    """A numeric axis from low to high (a log axis labelled at its decades, or at `ticks`)."""
    if not log:
        axis = {"type": "linear", "range": [low, high]}
        if ticks is not None:
            axis.update(tickvals=list(ticks), ticktext=list(labels or [f"{t:g}" for t in ticks]))
        return axis
    return log_axis(low=low, high=high, ticks=ticks, labels=labels)


UNNUMBERED = {"type": "linear", "range": [0, 1], "showticklabels": False, "showgrid": False, "zeroline": False}


def blank(title: str, x_title: str, y_title: str, x: dict, y: dict, subtitle: str | None = None,
          height: int = 380) -> go.Figure:
    """Axes with their titles and places and no trace: the set-up, nothing of the measurement."""
    fig = go.Figure()
    base_layout(fig, title, height)
    fig.update_xaxes(title_text=x_title, **x)
    fig.update_yaxes(title_text=y_title, **y)
    fig.update_layout(hovermode=False, showlegend=False, plot_bgcolor=SETUP_BACKGROUND)
    return with_subtitle(fig, subtitle)


def blank_map(title: str, x_title: str, y_title: str, columns: Sequence[str], rows: Sequence[str],
              subtitle: str | None = None, height: int = 460) -> go.Figure:
    """An empty map: its columns and rows named (tokens, layers, heads), its cells not yet filled."""
    fig = blank(title, x_title, y_title, labelled(columns), labelled(rows, reverse=True), subtitle, height)
    fig.update_xaxes(tickangle=-60 if len(columns) > 8 else 0)
    return fig


def reading_setup(v):
    later = "each step reruns the prefix" if v["encoder_only"] else "a KV-cache step per token"
    return blank(f"Reading {v['tokens']} tokens: in one pass, or one token at a time", "", "milliseconds",
                 labelled(["one pass", "one token at a time"]), UNNUMBERED, subtitle=later)


def scores_setup(v):
    return blank_map(f"Scores q·k, layer {v['layer']}, head {v['head']} (before the scale)", "key", "query",
                     v["labels"], v["labels"])


SCALE_CATEGORIES = ["Var(q·k) after the scale", "entropy with the scale (nats)", "entropy without it (nats)"]


def scale_setup(v):
    return blank(f"What the scale does: layer {v['layer']}, head {v['head']} against eq. 2.2's random vectors", "",
                 "value", labelled(SCALE_CATEGORIES), UNNUMBERED,
                 subtitle=f"d_k = {v['d_head']}: each q·k is divided by √{v['d_head']}")


def masks_setup(v):
    layers = [str(i) for i in range(len(v["later_share"]))]
    axis = spanned(0, 1, ticks=[0, 1], labels=["none", "all"])
    return blank("Where attention goes when a mask is off", "layer", "share of attention", labelled(layers), axis,
                 subtitle="mean over heads and queries")


HEAD_WEIGHTS = ["W^Q", "W^K", "W^V", "W^O"]


def heads_setup(v):
    return blank("One layer's attention weights", "", "parameters", labelled(HEAD_WEIGHTS), UNNUMBERED,
                 subtitle=f"d = {v['d_model']}, {v['n_heads']} query heads, {v['n_kv_heads']} key/value heads, "
                          f"d_head = {v['head_dim']}")


def shuffle_setup(v):
    if not v.get("conditions"):
        return None
    return blank(f"Shuffled {v['n_tokens']} tokens through layer {v['layer']}'s attention, put back in order", "",
                 "difference ÷ size (log scale)", labelled(v["conditions"]), spanned(1e-9, 10, log=True),
                 subtitle="float32 rounds at about 1e-7 of a value")


def shares_setup(v):
    if len(v.get("layers", ())) == 0:
        return None
    return blank("Each sublayer's output as a % of the residual it joins", "layer", "% of the residual (log scale)",
                 labelled([str(int(i)) for i in v["layers"]]), spanned(0.1, 1000, log=True),
                 subtitle=f"median over the text's {v['n_tokens']} tokens")


def cross_setup(v):
    if v.get("weights") is None:
        return None
    sources = [f"{i} {t}" for i, t in enumerate(v["source"])]
    targets = [f"{i} {t}" for i, t in enumerate(v["target"])]
    return blank_map(f"Cross-attention of the Lab's reversing model, layer {v['layer']} (mean of heads)",
                     "source letter (key)", "output letter (query)", sources, targets, height=480)


def lengths_axis(lengths) -> dict:
    """A log axis of tokens, labelled at the lengths measured."""
    lengths = [int(n) for n in lengths]
    return spanned(lengths[0] / 1.5, lengths[-1] * 1.5, log=True, ticks=lengths, labels=[f"{n:,}" for n in lengths])


def kv_cache_setup(v):
    if not v.get("lengths"):
        return None
    return blank("The KV cache's size against the text's length", "tokens n", f"MB ({v['dtype']})",
                 linear_lengths(v["lengths"]), UNNUMBERED,
                 subtitle=f"{v['layers']} layers, {v['kv_heads']} key/value heads, d_head = {v['head_dim']}, "
                          f"{v['bytes_per']} bytes a number")


def cost_setup(v):
    lengths, bench = v["lengths"], v.get("layer_cost")
    subtitle = "one head's attention weights, and the time of a forward pass, at each length"
    if bench:   # the lengths of the layer timed alone, which Reveal draws below (a trace-less panel shows no axes)
        long = bench["methods"]["dense"]["lengths"]
        subtitle += f"; on Reveal, one attention layer alone too, timed at {long[0]:,}–{long[-1]:,} tokens"
    return blank("What grows, and how fast, as the text doubles", "tokens n", f"× its value at {lengths[0]} tokens",
                 lengths_axis(lengths), UNNUMBERED, subtitle=subtitle)


def sinks_setup(v):
    first = v.get("first")
    if first is None:
        return None
    layers, heads = np.asarray(first).shape
    return blank_map(f"How much each head puts on {v['where']}", "layer", "head", [str(i) for i in range(layers)],
                     [str(i) for i in range(heads)], subtitle=f"each head's mean over the text's {v['tokens']} "
                                                              f"tokens; ε = {v['epsilon']:g}", height=380)


def not_explanations_setup(v):
    if "attention" not in v:
        return None
    return blank(f"Every head: its attention on {v['word']}, and what patching it restores",
                 f"attention from the last token to {v['word']}", "patching score (1: restores the answer)",
                 spanned(0, 1), UNNUMBERED, subtitle=f"one point a head, {np.asarray(v['attention']).size} heads")


def composition_setup(v):
    panels = v.get("panels")
    if not panels:
        return None
    from ui.plots.heads import SHARE_AXIS   # the revealed bars' own axis

    return blank("What feeds an induction head's keys", SHARE_AXIS, "", UNNUMBERED,
                 UNNUMBERED, subtitle="; ".join(p.title for p in panels))


def approximations_setup(v):
    """The run's tokens axis (labelled at the decades, not at the lengths timed: the answer may be one of them) and
    time; without the run, the bars' names of what this model will be measured under."""
    from ui.views.learn.cost import measure_title

    bench = v.get("bench")
    if bench:
        lengths = bench["lengths"]
        return blank("Which is faster, and from how many tokens", "tokens n", "ms per call",
                     spanned(lengths[0] / 1.5, lengths[-1] * 1.5, log=True), UNNUMBERED,
                     subtitle=f"one attention layer alone, exact and approximated, timed at {len(lengths)} lengths; on "
                              f"Reveal, this model under each approximation on the text's {v['tokens']} tokens too")
    ran = [r["short"] for r in v["live"] if not r["refused"]]
    if not ran:
        return None
    return blank("What each approximation does to this model", "", measure_title(v), labelled(ran), UNNUMBERED,
                 subtitle=f"on the text's {v['tokens']} tokens, every layer and head approximated")


SETUPS = {"why-attention": reading_setup, "queries-keys-values": scores_setup, "sqrt-dk": scale_setup,
          "masks": masks_setup, "heads": heads_setup, "positions": shuffle_setup, "block": shares_setup,
          "encoder-decoder": cross_setup, "kv-cache": kv_cache_setup, "cost": cost_setup, "sinks": sinks_setup,
          "not-explanations": not_explanations_setup, "composition": composition_setup,
          "approximations": approximations_setup}


def setup_figure(name: str, measured) -> go.Figure | None:
    """Lesson `name`'s figure before Reveal, or None where nothing was measured on this model."""
    return SETUPS[name](measured.values)


# where a numeric guess lands on the measured figure: (xs, ys) of a point or a line, in the figure's own units
def scale_guess(v, guess):
    return [SCALE_CATEGORIES[0]], [guess]


def masks_guess(v, guess):
    return [0, len(v["later_share"]) - 1], [guess / 100, guess / 100]


def block_guess(v, guess):
    return ([int(v["asked_layer"])], [guess]) if guess > 0 else None   # a log axis holds no guess ≤ 0


def kv_cache_guess(v, guess):
    return ([int(v["asked"])], [guess]) if v.get("lengths") else None


def cost_guess(v, guess):
    return ([2 * int(v["lengths"][0])], [guess]) if guess > 0 else None


def approximations_guess(v, guess):
    from ui.views.learn.cost import guess_place

    return guess_place(v, guess)


GUESSES = {"sqrt-dk": scale_guess, "masks": masks_guess, "block": block_guess, "kv-cache": kv_cache_guess,
           "cost": cost_guess, "approximations": approximations_guess}


def with_guess(name: str, fig: go.Figure, measured, guess) -> go.Figure:
    """The measured figure with the reader's numeric guess marked on it, where the guess is a number on one of its
    axes; the figure as it is otherwise (no guess, a choice, nothing drawn). Returns a copy when it marks."""
    place = GUESSES.get(name)
    if place is None or not isinstance(guess, float) or not fig.data:
        return fig
    where = place(measured.values, guess)
    if where is None:
        return fig
    xs, ys = where
    fig = go.Figure(fig)
    line = len(xs) > 1
    fig.add_trace(go.Scatter(
        x=xs, y=ys, name=GUESS, mode="lines" if line else "markers", cliponaxis=False, hoverinfo="skip",
        showlegend=True, line={"color": CHOSEN_COLOR, "dash": "dash", "width": 2},
        marker={"color": CHOSEN_COLOR, "symbol": "x-thin-open", "size": 16, "line": {"width": 3,
                                                                                   "color": CHOSEN_COLOR}}))
    return fig
