"""The course's lesson on attention sinks (ui/services/learn/sinks.py): the share of heads whose mean attention on
the first token exceeds ε, against the attention maps of one forward pass counted here by hand, on SmolLM2 and on
a tiny encoder ([CLS], every query); the shipped StreamingLLM run quoted as the file has it; the revealed figure
rings the heads the answer counts, and before Reveal only the map's empty axes are drawn."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_app_model import build_tiny_bert

from core import load_model
from ui.services.heads import MAX_HEADS_TOKENS
from ui.services.learn import number
from ui.services.text import encode
from ui.services.learn import sinks as lesson
from ui.views.learn.setup import setup_figure
from ui.views.learn import sinks as views

(SINKS,) = lesson.LESSONS


def by_hand(model, causal: bool) -> np.ndarray:
    """[L, H]: each head's attention on token 0, averaged over queries 1..T−1 (a decoder) or every query."""
    ids = torch.tensor([encode(model, lesson.SINK_SAMPLE, MAX_HEADS_TOKENS).ids])   # cut to a tiny model's table
    with torch.inference_mode():
        maps = model(ids, capture_attention=True).attentions
    start = 1 if causal else 0
    return torch.stack([m[0, :, start:, 0].mean(-1) for m in maps]).float().numpy()


def check(measured, first: np.ndarray, where: str) -> None:
    above = int((first > lesson.EPSILON).sum())
    assert measured.answer == pytest.approx(100 * above / first.size)
    assert np.allclose(measured.values["first"], first, atol=1e-5)
    assert f"{above} of {first.size} heads ({number(measured.answer)} %)" in measured.answer_text
    assert f"on {where}" in measured.answer_text and f"{number(measured.answer)} %" in measured.alt
    fig = views.sinks_figure(measured)
    heat, *rings = fig.data                                             # no ring trace where no head is a sink
    assert np.allclose(np.asarray(heat.z, float), first.T, atol=1e-5)   # the map as measured: heads down
    layers, heads = np.nonzero(first > lesson.EPSILON)                  # the rings: the heads the answer counts
    ringed = [xy for trace in rings for xy in zip(trace.x, trace.y)]
    assert len(rings) == (1 if above else 0) and sorted(ringed) == sorted(zip(layers.tolist(), heads.tolist()))
    before = setup_figure("sinks", measured)                            # nothing measured before Reveal
    assert not before.data and f"{above} heads" not in before.to_json()
    assert len(before.layout.xaxis.ticktext) <= first.shape[0] and before.layout.yaxis.ticktext[-1] == \
        str(first.shape[1] - 1)


def test_on_smollm2_the_share_is_the_heads_counted_from_the_pass(smollm):
    measured = SINKS.measure(smollm, None)
    check(measured, by_hand(smollm, causal=True), "the first token")
    assert measured.link == {"tab": "heads", "text": lesson.SINK_SAMPLE, "show": "heads-sinks-map"}   # computed there


def test_on_an_encoder_the_share_is_cls_over_every_query(tmp_path):
    model = load_model(str(build_tiny_bert(tmp_path / "bert")), device="cpu")
    measured = SINKS.measure(model, None)
    check(measured, by_hand(model, causal=False), "[CLS]")
    assert "every query sees every key" in measured.answer_text
    if len(model.tokenizer(lesson.SINK_SAMPLE)["input_ids"]) > model.config.max_positions:   # the tiny encoder's table is shorter than the text: said, not hidden
        assert "were dropped" in measured.answer_text


def test_the_reason_quotes_the_shipped_streaming_run_as_the_file_has_it(tmp_path):
    run = json.loads(lesson.STREAMING_MEASURED.read_text(encoding="utf-8"))
    result = next(r for r in run["results"] if r["model"] == lesson.STREAMING_MODEL)
    text = [r for r in result["runs"] if r["positions"] == "text"]
    window = min(r["window"] for r in text if r["window"] is not None)
    pick = {(r["window"], r["sinks"]): r["perplexity"] for r in text}
    words = lesson.window_words(lesson.shipped_window_run())
    for value in (pick[(None, 0)], pick[(window, 0)], pick[(window, 1)]):
        assert f"{value:.1f}" in words
    assert f"last {window} keys" in words and run["date"] in words
    assert lesson.shipped_window_run(tmp_path / "missing.json") is None
    assert "not shipped" in lesson.window_words(None)


def test_the_revealed_map_rings_the_counted_heads_under_a_title_nothing_covers():
    """The ring trace is named by the lesson's ε and rings exactly the heads the answer counts; a map with no sink
    head has no ring trace at all; the one map's panel name (a repeat of the title) is gone, so nothing sits where
    the subtitle does, as the page lays the figure out (ui.views.learn.course.figure)."""
    from ui.services.learn import Measured
    from ui.views.learn import course as page

    first = np.full((4, 3), 0.1)
    first[1, 2], first[3, 0] = 0.9, 0.31
    for above in ([(1, 2), (3, 0)], []):
        shown = first if above else np.full((4, 3), 0.1)
        values = {"first": shown, "epsilon": 0.3, "where": "the first token", "share": 100 * len(above) / 12,
                  "above": above, "tokens": 20}
        fig = page.figure("sinks", Measured(0.0, "", "", "", values=values))
        scatter = [trace for trace in fig.data if trace.type == "scatter"]
        if above:
            (ring,) = scatter
            assert ring.name == "sink heads (above ε = 0.3)"
            assert set(zip(ring.x, ring.y)) == set(above)
        else:
            assert not scatter
        names = [a.name for a in fig.layout.annotations]
        assert names == ["title", "subtitle"], names
        assert fig.layout.annotations[1].text.startswith(f"{len(above)} heads above ε = 0.3")
