"""The course's lessons on generation and cost (ui/services/learn/generation.py): on SmolLM2 the KV cache's size
equals eq. 6.9 and the keys and values a forward pass computes, one head's weights grow as n² from a recorded pass,
the fitted exponent is the fit of the measured times, and the online softmax of a real head equals its softmax
and its output; an encoder is told in words why it keeps no cache; every figure draws its numbers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tiny_app_model import build_tiny_bert, build_tiny_llama

from core import load_model
from core.attention import causal_mask, online_attention, softmax_bytes
from ui.services.learn import generation as lessons
from ui.services.learn import read_guess, reveal
from ui.services import inside
from ui.services.inside import online_softmax_memory
from ui.services.learn.cost import COST_MEASURED
from ui.views.learn import course
from ui.views.learn import generation as views

KV, COST = lessons.LESSONS


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("learn-generation")
    return (load_model(str(build_tiny_llama(root / "llama", max_positions=128)), device="cpu"),
            load_model(str(build_tiny_bert(root / "bert")), device="cpu"))


@pytest.fixture(scope="module")
def kv(smollm):
    return KV.measure(smollm, None)


@pytest.fixture(scope="module")
def cost(smollm):
    return COST.measure(smollm, None)


def test_the_lessons_are_named_and_drawn():
    assert [lesson.name for lesson in lessons.LESSONS] == ["kv-cache", "cost"]
    assert set(views.FIGURES) == {"kv-cache", "cost"}
    assert all(lesson.question.numeric and "eq. 6." in lesson.text for lesson in lessons.LESSONS)


def test_the_kv_cache_is_eq_6_9_and_the_tensors_a_pass_computes(smollm, kv):
    cfg = smollm.config
    expected = 2 * cfg.n_layers * 1024 * cfg.n_kv_heads * cfg.head_dim * 4       # float32, eq. 6.9
    assert kv.answer == expected / 1e6 and kv.values["allocated"][-1] == expected
    assert kv.values["allocated"] == kv.values["formula"]
    assert kv.values["no_gqa"][-1] == expected * cfg.n_heads // cfg.n_kv_heads
    # the keys and values one forward pass computes for the sample: what a prefill writes into the cache
    ids = smollm.tokenizer(lessons.KV_SAMPLE, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = smollm(ids, record={"k", "v"}, return_logits=False)
    computed = sum(t.numel() * t.element_size() for name in ("k", "v") for t in out.records[name])
    assert kv.values["filled_bytes"] == computed and kv.values["filled_tokens"] == ids.shape[1]
    assert f"{kv.answer:.3g} MB" in kv.answer_text and "eq. 6.9" in kv.answer_text
    assert f"{cfg.n_kv_heads} key/value heads" in kv.why and "3× smaller" in kv.why
    value, _ = read_guess(KV.question, "50")
    assert value == 50.0 and "47.2 MB" in reveal(KV, kv, "50")
    fig = views.FIGURES["kv-cache"](kv)
    np.testing.assert_allclose(fig.data[0].y, np.asarray(kv.values["allocated"]) / 1e6)
    assert len(fig.data) == 2 and kv.link["tab"] == "generate"


def test_an_encoder_is_told_why_it_keeps_no_cache_and_a_tiny_decoder_is_measured(tiny):
    llama, bert = tiny
    measured = KV.measure(bert, None)
    assert isinstance(measured.answer, str) and "encoder" in measured.note and "does not generate" in measured.note
    assert "Measured: nothing (this model keeps no cache)" in reveal(KV, measured, "3")
    fig = views.FIGURES["kv-cache"](measured)
    assert not fig.data and "encoder" in fig.layout.annotations[0].text
    small = KV.measure(llama, None)
    cfg = llama.config
    assert small.values["lengths"] == [64, 128]            # its context is 128 tokens
    assert small.answer == 2 * cfg.n_layers * 128 * cfg.n_kv_heads * cfg.head_dim * 4 / 1e6


def test_the_weights_grow_as_n_squared_and_the_exponent_is_the_fit_of_the_times(cost):
    v = cost.values
    lengths = v["lengths"]
    assert lengths == list(lessons.COST_LENGTHS)
    assert v["per_head_bytes"] == [n * n * 4 for n in lengths]           # eq. 6.12: n² float32 per head per layer
    assert cost.answer == 4.0 and "4.00×" in cost.answer_text
    slope = np.polyfit(np.log(lengths), np.log(v["seconds"]), 1)[0]
    assert math.isfinite(v["exponent"]) and v["exponent"] == pytest.approx(slope, abs=1e-9)
    assert f"n^{v['exponent']:.2f}" in cost.why and f"n^{v['exponent']:.2f}" in cost.alt
    memory = online_softmax_memory()                      # the shipped measurement, and the formula at its settings
    counted = v["softmax_bytes"]
    assert (counted["n"], counted["block"], counted["d_head"]) == (memory.rows[-1].n, memory.block, memory.d_head)
    assert {k: counted[k] for k in ("plain", "online")} == softmax_bytes(counted["n"], counted["n"], memory.block,
                                                                          memory.d_head)
    assert v["softmax_measured"]["rows"][-1] == {"n": memory.rows[-1].n, "plain": memory.rows[-1].plain,
                                                 "online": memory.rows[-1].online, "fused": memory.rows[-1].fused}
    measured_words, formula_words = cost.answer_text.split("Apart from that, the formula")
    assert "Its memory, measured: " in measured_words and memory.date in measured_words
    assert inside.LESSON_METHOD in measured_words and "VmHWM" not in measured_words    # plain words in a lesson
    assert f"{memory.rows[-1].plain / memory.rows[-1].online:,.1f}× less" in measured_words
    assert "not measured" in formula_words and f"{counted['plain'] / counted['online']:,.1f}× less" in formula_words
    assert "64×" not in cost.answer_text
    fig = views.FIGURES["cost"](cost)
    np.testing.assert_allclose(fig.data[0].y, [(m / lengths[0]) ** 2 for m in lengths])
    assert len([t for t in fig.data if t.xaxis in (None, "x")]) == 4 and fig.layout.yaxis.type == "log"


def test_the_online_softmax_of_a_real_head_is_its_softmax(smollm, cost):
    v = cost.values
    assert v["online_max_error"] <= 1e-6 and v["online_output_error"] <= 1e-5
    layer, head = v["online_layer"], v["online_head"]
    ids = smollm.tokenizer(lessons.COST_SAMPLE, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = smollm(ids, record={"q", "k", "v", "z"}, return_logits=False)
    kv_head = head // (smollm.config.n_heads // smollm.config.n_kv_heads)
    q, k, value = (out.records[name][layer][0, :, h] for name, h in (("q", head), ("k", kv_head), ("v", kv_head)))
    mask = causal_mask(len(q), len(q))
    online = online_attention(q, k, value, lessons.ONLINE_BLOCK, mask=mask)
    plain = torch.softmax((q @ k.T / math.sqrt(q.shape[1])).masked_fill(~mask, float("-inf")), -1) @ value
    assert (online - plain).abs().max() <= 1e-5
    assert (online - out.records["z"][layer][0, :, head]).abs().max() <= 1e-4


def test_an_encoder_still_measures_the_cost(tiny):
    _, bert = tiny
    measured = COST.measure(bert, None)
    assert measured.values["lengths"] == [32, 64, 128] and measured.answer == 4.0
    assert measured.values["online_max_error"] <= 1e-6
    assert len([t for t in views.FIGURES["cost"](measured).data if t.xaxis in (None, "x")]) == 4


def test_the_cost_figure_draws_the_layer_alone_from_the_shipped_run_beside_this_runs_point(tiny):
    """The second panel: the bench's fastest run per length and method as the JSON holds them, each named with the
    exponent the bench fitted, this run's layer alone at the lesson's longest length, on labelled log axes; the
    set-up before Reveal draws none of it."""
    llama, _ = tiny
    measured = COST.measure(llama, None)
    raw = json.loads(COST_MEASURED.read_text(encoding="utf-8"))
    rows = sorted(raw["layer"], key=lambda r: r["n"])
    fig = course.figure("cost", measured, 4.0)
    below = [t for t in fig.data if t.xaxis == "x2"]
    for method in ("dense", "online", "fused"):
        fit = raw["fits"]["layer"][method]["fastest"]["exponent"]
        trace = next(t for t in below if t.name.startswith(f"{method}, saved run"))
        assert list(trace.x) == [r["n"] for r in rows] and trace.yaxis == "y2"
        np.testing.assert_allclose(trace.y, [1e3 * min(r[method]["seconds"]) for r in rows])
        assert f"∝ n^{fit:.2f} at 2,048–8,192 tokens" in trace.name
    dense = raw["fits"]["layer"]["dense"]["fastest"]["exponent"]
    assert f"n^{dense:.2f} on the plain path" in views.FIGURES["cost"](measured).layout.title.subtitle.text
    now = measured.values["layer_now"]
    live = next(t for t in below if t.name == f"this run, at {now['n']} tokens")
    assert now["n"] == measured.values["lengths"][-1] == 128 and (now["heads"], now["d_head"]) == (raw["heads"],
                                                                                                  raw["d_head"])
    assert list(live.x) == [128, 128] and list(live.text) == ["dense", "fused"]
    np.testing.assert_allclose(live.y, [1e3 * now["seconds"]["dense"], 1e3 * now["seconds"]["fused"]])
    assert all(y > 0 for y in live.y)
    x, y = fig.layout.xaxis2, fig.layout.yaxis2
    assert x.type == y.type == "log" and x.title.text == "tokens n" and y.title.text.startswith("ms")
    assert list(x.tickvals) == [128, 256, 512, 1024, 2048, 4096, 8192] and x.ticktext[-1] == "8,192"
    assert all(len(label) > 1 or label == "1" for label in y.ticktext)     # decades written out, no bare digit
    assert [t.name for t in fig.data if t.name == "your guess"] and fig.data[-1].xaxis in (None, "x")
    before = course.before_reveal("cost", measured)
    assert not before.data and f"{dense:.2f}" not in before.to_json() and "8,192 tokens" in before.to_json()
