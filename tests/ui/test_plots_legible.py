"""Legible attention figures: the heatmap names every token up to 64 per axis."""

from __future__ import annotations

import numpy as np
import pytest

from ui.plots.attention import LABEL_EVERY_TOKEN_UP_TO, attention_heatmap, label_font_px, label_pitch_px


def causal_weights(n: int, seed: int = 0, sharpness: float = 3.0) -> np.ndarray:
    """A causal attention matrix [n, n] whose rows sum to 1, peaked enough to use every opacity level."""
    scores = np.random.default_rng(seed).normal(size=(n, n)) * sharpness
    scores[np.triu_indices(n, 1)] = -np.inf
    w = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def token_labels(n: int) -> list[str]:
    return [f"{i} tok{i}" for i in range(n)]


@pytest.mark.parametrize("n", [40, 64])
def test_heatmap_names_every_token_in_order_on_both_axes(n):
    labels = token_labels(n)
    fig = attention_heatmap(causal_weights(n), labels, labels, "head")
    for axis in (fig.layout.xaxis, fig.layout.yaxis):
        assert axis.tickmode == "array"
        assert list(axis.ticktext) == labels and list(axis.tickvals) == labels
        assert axis.tickfont.size == label_font_px(n)
    assert fig.layout.xaxis.tickangle == -90  # keys written upwards: one font height per column
    assert fig.layout.height >= 60 + n * label_pitch_px(n)  # every row has room for its label


def test_heatmap_labels_shrink_and_the_figure_grows_with_the_tokens():
    assert [label_font_px(n) for n in (6, 16, 40, 64)] == [12, 12, 10, 8]
    assert label_pitch_px(64) > label_font_px(64)
    heights = [attention_heatmap(causal_weights(n), token_labels(n), token_labels(n), "h").layout.height
               for n in (6, 40, 64)]
    assert heights[0] == 640 and heights[0] < heights[1] < heights[2]  # the old default stays the floor


def test_heatmap_beyond_64_tokens_keeps_plotlys_thinned_labels():
    n = LABEL_EVERY_TOKEN_UP_TO + 1
    fig = attention_heatmap(causal_weights(n), token_labels(n), token_labels(n), "h", height=560)
    assert fig.layout.xaxis.tickmode is None and fig.layout.yaxis.ticktext is None
    assert fig.layout.height == 560


def test_heatmap_of_a_window_keys_other_than_queries_labels_each_axis_by_its_own_tokens():
    queries, keys = token_labels(70)[3:8], token_labels(70)[1:41]
    fig = attention_heatmap(np.full((5, 40), 1 / 40), queries, keys, "window")
    assert list(fig.layout.yaxis.ticktext) == queries and list(fig.layout.xaxis.ticktext) == keys
    assert fig.layout.yaxis.tickfont.size == 12 and fig.layout.xaxis.tickfont.size == 10


def test_heatmap_draws_markup_in_tokens_as_text():
    labels = ["0 <b>x</b>", "1 a&b", "2 <br>"]
    fig = attention_heatmap(np.eye(3), labels, labels, "h")
    escaped = ["0 &lt;b&gt;x&lt;/b&gt;", "1 a&amp;b", "2 &lt;br&gt;"]  # plotly reads &lt; as <, and <b> as bold
    assert list(fig.layout.xaxis.ticktext) == escaped and list(fig.data[0].y) == escaped
