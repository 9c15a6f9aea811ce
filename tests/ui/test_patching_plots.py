"""The Patching tab's figures and words as pure functions: a flow-graph attention edge's hover lists its heads
strongest first and its click names the strongest; an edge with no head above 0 is drawn but names no head; the
sweep's colour bar and lead lines say what a cell means in each direction."""

from __future__ import annotations

import json
import re

import numpy as np

from ui.plots.patching import HOVER_HEADS, flow_figure, patch_heatmap
from ui.views.patching import MODE_WORDS, how_to_read

TOKENS = ["When", " Mary", " and", " John", " gave", " to"]
HEAD_ID = re.compile(r"^\d+\.\d+$")   # what the page's click bridge looks for among a point's customdata


def attention_trace(fig) -> dict:
    return next(t for t in json.loads(fig.to_json())["data"] if t.get("name") == "attention edge")


def test_an_attention_edges_hover_lists_its_heads_strongest_first_and_a_click_names_the_strongest():
    many = tuple((h, 0.2 - 0.01 * h) for h in range(HOVER_HEADS + 3))       # more heads than the hover lists
    edges = [("attention", 3, 2, 1, 5, 7, 0.31, ((2, 0.12), (5, 0.04), (0, 0.01))),
             ("attention", 1, 0, 0, 1, 3, 1.0, many),
             ("residual", 3, None, 5, 5, 7, 0.6, ()),
             ("mlp", 3, None, 5, 5, 8, 0.2, ())]
    trace = attention_trace(flow_figure(TOKENS, 4, edges, 5, "t"))
    first, second = trace["customdata"]
    assert first[0] == "3.2" and first[4] == "L3 H2 0.12, L3 H5 0.04, L3 H0 0.01"
    assert second[0] == "1.0" and second[4].endswith(" … (3 more)")
    assert second[4].count("L1 H") == HOVER_HEADS
    for custom in trace["customdata"]:   # the strongest head is the first "layer.head" the click bridge finds
        assert next(str(v) for v in custom if HEAD_ID.match(str(v))) == custom[0]


def test_an_edge_with_no_head_above_zero_is_drawn_but_names_no_head():
    edges = [("attention", 0, None, 0, 0, 1, 0.0, ()), ("attention", 0, 1, 0, 2, 1, 0.5, ((1, 0.5),))]
    fig = flow_figure(TOKENS, 1, edges, 2, "t")
    assert [c[0] for c in attention_trace(fig)["customdata"]] == ["0.1"]
    lines = [t for t in json.loads(fig.to_json())["data"] if t.get("mode") == "lines"]
    assert sum(x is not None for t in lines for x in t["x"]) == 4   # both edges drawn, two ends each


def test_the_sweeps_words_follow_the_direction():
    scores = np.array([[1.0, 0.0], [0.5, -0.2]], dtype=np.float32)
    for mode, value, back, zero in (("denoise", "restored", "1 clean answer back", "0 no change"),
                                    ("noise", "kept", "1 no change", "0 needed")):
        words = MODE_WORDS[mode]
        fig = json.loads(patch_heatmap(scores, scores, "layer", "position", TOKENS[:2], "t",
                                       value_name=words["value"], scale_ticks=words["ticks"]).to_json())
        heatmap = fig["data"][0]
        assert heatmap["colorbar"]["title"]["text"] == value
        assert heatmap["colorbar"]["ticktext"] == [back, zero] and heatmap["colorbar"]["tickvals"] == [1, 0]
        assert f"<br>{value} %{{z:.3f}}" in heatmap["hovertemplate"]
    assert "brings back the clean prompt's answer" in how_to_read("denoise")
    noise = how_to_read("noise")
    assert "**1** means this patch changes nothing" in noise and "activation is needed" in noise
    assert "back" not in noise and "restor" not in noise
