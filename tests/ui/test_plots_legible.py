"""Legible attention figures: the heatmap names every token up to 64 per axis, and the two-column view draws one
line per weight, at the weight's quantised opacity, grouped per token so that a hover can filter them."""

from __future__ import annotations

import numpy as np
import pytest

from ui.plots.attention import (LABEL_EVERY_TOKEN_UP_TO, MIN_LINE_WEIGHT, OPACITY_LEVELS, attention_heatmap,
                                label_font_px, label_pitch_px, line_levels, two_column_view)
from ui.plots.base import figure_nbytes
from ui.tabs.hover import hover_filter_js


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


def line_traces(fig, side: str):
    return [t for t in fig.data if t.meta and t.meta.get("role") == "lines" and t.meta["side"] == side]


def segments(trace) -> list[tuple[int, int]]:
    """The (query, key) pairs of one line trace: x = [0, 1, None, ...], y = [i, j, None, ...]."""
    x, y = list(trace.x), list(trace.y)
    assert x == [0, 1, None] * (len(x) // 3) and y[2::3] == [None] * (len(y) // 3)
    return list(zip(y[0::3], y[1::3]))


def test_two_column_lines_are_the_weights_at_their_quantised_opacity():
    n = 40
    w = causal_weights(n)
    fig = two_column_view(w, token_labels(n), "layer 0, head 1")
    step = 1 / OPACITY_LEVELS
    for side, shown in (("query", True), ("key", False)):
        drawn = {}
        for trace in line_traces(fig, side):
            opacity = trace.meta["opacity"]
            assert trace.opacity == (opacity if shown else 0)  # key groups wait for a hover
            for i, j in segments(trace):
                assert trace.meta["index"] == (i if side == "query" else j)
                assert abs(opacity - w[i, j]) <= step and opacity == line_levels(w)[i, j] / OPACITY_LEVELS
                assert (i, j) not in drawn
                drawn[(i, j)] = opacity
        assert set(drawn) == {(int(i), int(j)) for i, j in zip(*np.nonzero(w >= MIN_LINE_WEIGHT))}
    assert {level for level in np.unique(line_levels(w))} == set(range(OPACITY_LEVELS + 1))  # the test spans them


def test_line_levels_round_to_eighths_and_skip_small_weights():
    w = np.array([[0.005, 0.01, 0.0625, 0.3, 0.99, np.nan]])
    assert line_levels(w).tolist() == [[0, 1, 1, 2, 8, 0]]


def test_two_column_view_labels_every_token_once_per_column_as_text():
    labels = ["0 <b>x</b>", "1 the", "2 a&b", "3 </span><script>"]
    fig = two_column_view(causal_weights(4), labels, "h")
    texts = [t for t in fig.data if t.type == "scatter" and t.mode == "text"]
    assert len(texts) == 2
    escaped = ["0 &lt;b&gt;x&lt;/b&gt;", "1 the", "2 a&amp;b", "3 &lt;/span&gt;&lt;script&gt;"]
    for trace, x in zip(texts, (-0.03, 1.03)):  # beside the lines' ends at 0 and 1
        assert list(trace.text) == escaped and set(trace.x) == {x} and list(trace.y) == [0, 1, 2, 3]
        assert trace.hoverinfo == "skip"
    tokens = [t for t in fig.data if t.meta and t.meta.get("role") == "tokens"]
    assert len(tokens) == 1 and np.asarray(tokens[0].z).shape == (4, 3)  # queries, the gap, keys


def test_two_column_view_of_40_tokens_stays_a_few_hundred_traces_and_small():
    n = 40
    fig = two_column_view(causal_weights(n), token_labels(n), "h")
    assert len(fig.data) <= 2 * n * OPACITY_LEVELS + 3
    assert len(fig.data) < 600 and figure_nbytes(fig) < 400_000
    assert fig.layout.meta["view"] == "two-column" and fig.layout.height >= n * label_pitch_px(n)


def test_two_column_view_rejects_a_matrix_that_does_not_fit_its_labels():
    with pytest.raises(ValueError, match="square"):
        two_column_view(np.zeros((3, 4)), token_labels(3), "h")
    with pytest.raises(ValueError, match="at most 64"):
        two_column_view(np.eye(65), token_labels(65), "h")


def test_hover_filter_js_names_its_plots():
    js = hover_filter_js(["attn-columns", "gen-columns"])
    assert '["attn-columns", "gen-columns"]' in js and "PLOTS" not in js
    assert "plotly_hover" in js and "plotly_unhover" in js and "innerHTML" not in js


def test_fit_narrow_sets_a_long_title_and_subtitle_in_lines_above_the_plot_and_the_legend_under_it():
    import plotly.graph_objects as go

    from ui.plots.base import NARROW_SUBTITLE_CHARS, NARROW_TITLE_CHARS, base_layout, fit_narrow

    fig = go.Figure([go.Bar(x=["a", "b"], y=[1, 2], name="one"), go.Bar(x=["a", "b"], y=[2, 1], name="two")])
    title = "What the scale does: a real head against the random vectors of the equation"
    subtitle = "d_k = 64; before the scale Var(q·k) = 811; component variance of q 3.5, of k 3.6"
    base_layout(fig, title)
    fig.update_layout(title={"subtitle": {"text": subtitle}})
    fitted = fit_narrow(fig)
    notes = {a.name: a for a in fitted.layout.annotations}
    lines, sublines = notes["title"].text.split("<br>"), notes["subtitle"].text.split("<br>")
    assert " ".join(lines) == title and " ".join(sublines) == subtitle       # every word, in order
    assert len(lines) > 1 and max(map(len, lines)) <= NARROW_TITLE_CHARS
    assert len(sublines) > 1 and max(map(len, sublines)) <= NARROW_SUBTITLE_CHARS
    assert all(a.yref == "paper" and a.y == 1 and a.yanchor == "bottom" for a in notes.values())  # above the plot
    assert notes["title"].yshift > notes["subtitle"].yshift                  # the title over its subtitle
    assert fitted.layout.margin.t >= 19 * len(lines) + 16 * len(sublines)   # room for both
    assert not fitted.layout.title.text and not fitted.layout.title.subtitle.text
    assert fitted.layout.legend.yref == "container" and fitted.layout.legend.orientation == "h"
    assert fig.layout.title.text == title and not fig.layout.annotations     # the figure given is left as it was
    one = fit_narrow(go.Figure(go.Bar(x=["a"], y=[1], name="one")))            # one entry, no title: nothing moves
    assert not one.layout.annotations and one.layout.legend.yref is None


def test_fit_narrow_sets_the_title_over_the_top_rows_panel_titles_and_under_the_toolbars_band():
    """The title and subtitle stand above the first row's panel titles (make_subplots' annotations, anchored at the
    plot's top), and the top margin leaves a band over them for plotly's toolbar (the browser test measures both
    boxes: tests/browser/test_browser_learn.py)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from ui.plots.base import MODEBAR_PX, base_layout, fit_narrow, panel_titles_height

    fig = make_subplots(rows=2, cols=1, subplot_titles=["the first panel<br>in two lines", "the second panel"])
    base_layout(fig, "What feeds the head's keys")
    fig.update_layout(title={"subtitle": {"text": "on the loaded model"}})
    panels = panel_titles_height(fig)
    assert panels >= 2 * 16                                                   # two lines of 16 px type
    fitted = fit_narrow(fig)
    notes = {a.name: a for a in fitted.layout.annotations if a.name}
    assert notes["subtitle"].yshift >= panels and notes["title"].yshift > notes["subtitle"].yshift
    title_top = notes["title"].yshift + 19                                    # one line of the 14 px title
    assert fitted.layout.margin.t - title_top >= MODEBAR_PX
    assert panel_titles_height(fit_narrow(base_layout(go.Figure(go.Bar(x=["a"], y=[1])), "a title"))) == 0
