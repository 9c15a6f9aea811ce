"""The attention lessons of the course: each answer recomputed here directly with the core on SmolLM2, and every
lesson measured and drawn on tiny decoder, encoder and encoder-decoder models."""

import math

import numpy as np
import pytest
import torch
from tiny_app_model import build_tiny_bert, build_tiny_llama, build_tiny_marian

from core import load_model
from core.analysis import heads as core_heads
from core.analysis.inspect import parameter_counts, queries_keys
from ui.services.learn import attention as lessons
from ui.services.learn import reveal
from ui.services.text import as_batch
from ui.views.learn.attention import FIGURES

BY_NAME = {lesson.name: lesson for lesson in lessons.LESSONS}


def test_the_lessons_and_their_figures_are_named_alike():
    assert list(BY_NAME) == ["why-attention", "queries-keys-values", "sqrt-dk", "masks", "heads"]
    assert set(FIGURES) == set(BY_NAME)


def head_scores(model, text, layer, head):
    """q·k of one head over `text` [T, T], from the core's recorded queries and keys (GQA: the shared key head)."""
    ids = model.tokenizer(text)["input_ids"]
    q, k = queries_keys(model, as_batch(ids), layer, rotate=True)
    kv = head // (model.config.n_heads // model.config.n_kv_heads)
    return ids, q[0, head].float() @ k[0, kv].float().T


def test_reading_in_one_pass_equals_reading_token_by_token_and_is_faster(smollm, monkeypatch):
    monkeypatch.setattr(lessons, "TIMING_RUNS", 1)
    monkeypatch.setattr(lessons, "MAX_READ_TOKENS", 12)
    ids = smollm.tokenizer(lessons.READ_TEXT)["input_ids"][:12]
    with torch.inference_mode():
        full = smollm(as_batch(ids)).logits[0, -1].float()
    _, stepped = lessons.read_step_by_step(smollm, ids, {})
    assert torch.allclose(stepped, full, atol=1e-3)
    measured = lessons.measure_reading(smollm)
    v = measured.values
    assert measured.answer == pytest.approx(v["one_by_one"][0] / v["at_once"][0])
    assert measured.answer > 1 and v["tokens"] == 12 and v["max_logit_diff"] < 1e-3
    assert f"{measured.answer:.1f}×" in measured.answer_text


def test_the_last_query_scores_highest_where_the_core_says(smollm):
    measured = BY_NAME["queries-keys-values"].measure(smollm, None)
    ids, scores = head_scores(smollm, lessons.HEAD_TEXT, *lessons.HEAD)
    key = int(scores[-1].argmax())                             # the last row: every key is allowed
    assert measured.values["key"] == key
    assert measured.answer == lessons.key_kind(ids, len(ids) - 1, key)
    assert measured.answer in BY_NAME["queries-keys-values"].question.choices
    shown = measured.values["scores"]
    allowed = np.tril(np.ones_like(shown, dtype=bool))
    assert np.allclose(shown[allowed], scores.numpy()[allowed], atol=1e-3) and np.isnan(shown[~allowed]).all()
    with torch.inference_mode():
        probs = smollm(as_batch(ids), capture_attention=True).attentions[lessons.HEAD[0]][0, lessons.HEAD[1]]
    assert measured.values["weight"] == pytest.approx(float(probs[-1, key]), abs=1e-4)
    assert FIGURES["queries-keys-values"](measured).data


def test_the_scaled_variance_is_the_core_heads_and_not_the_textbooks_one(smollm):
    measured = BY_NAME["sqrt-dk"].measure(smollm, None)
    _, scores = head_scores(smollm, lessons.HEAD_TEXT, *lessons.HEAD)
    allowed = scores[torch.ones_like(scores, dtype=torch.bool).tril()]
    d_k = smollm.config.head_dim
    assert measured.values["raw_variance"] == pytest.approx(float(allowed.var()), rel=1e-4)
    assert measured.answer == pytest.approx(float((allowed / math.sqrt(d_k)).var()), rel=1e-4)
    assert measured.answer == pytest.approx(12.67, abs=0.01)   # SmolLM2 L3 H2 on the Inside tab's text
    assert measured.values["random_variance"] == pytest.approx(1.0, abs=0.1)
    with_scale, without = measured.values["entropy"]
    assert without < with_scale
    assert "12.67" in reveal(BY_NAME["sqrt-dk"], measured, "1")
    assert FIGURES["sqrt-dk"](measured).data


def test_without_the_causal_mask_tokens_read_ahead_as_the_core_measures(smollm):
    measured = BY_NAME["masks"].measure(smollm, None)
    ids = smollm.tokenizer(lessons.MASK_TEXT)["input_ids"]
    with torch.inference_mode():
        attentions = smollm(as_batch(ids), causal_mask=False, capture_attention=True).attentions
    n = len(ids)
    later = np.triu(np.ones((n, n)), 1)
    shares = [float((a[0].numpy() * later).sum(-1)[:, :n - 1].mean()) for a in attentions]
    assert measured.values["later_share"] == pytest.approx(shares, abs=1e-5)
    assert measured.answer == pytest.approx(100 * np.mean(shares), abs=1e-3)
    (acc_on, acc_off), pad = measured.values["causal"]["accuracy"], measured.values["padding"]["results"]
    assert acc_off > acc_on                                    # it copies the token it should predict
    assert max(pad["padding mask on"]["pad_mass"]) == 0 < min(pad["padding mask off"]["pad_mass"])
    assert FIGURES["masks"](measured).data


def test_attention_weights_are_counted_from_the_state_dict_and_heads_are_found(smollm):
    measured = BY_NAME["heads"].measure(smollm, None)
    cfg = smollm.config
    d, h, h_kv, d_k = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    assert measured.answer == parameter_counts(smollm)["per_layer"]["attention"]
    assert measured.answer == d * (h + 2 * h_kv) * d_k + h * d_k * d < 4 * d * d   # grouped-query attention
    induction = measured.values["induction"]
    layer, head, score = measured.values["top_induction"]
    assert induction[layer, head] == induction.max() == pytest.approx(score)
    assert score > core_heads.SCORES["induction"][1]           # passes the Heads tab's naming threshold
    # the link opens that head on the probe it was found on: random tokens, then the same again
    probe = core_heads.induction_probe(cfg.vocab_size, 100, 0, avoid=tuple(smollm.tokenizer.all_special_ids))
    text = smollm.tokenizer.decode(probe[0].tolist(), skip_special_tokens=True)
    assert measured.link == {"tab": "heads", "layer": layer, "head": head, "text": text,
                             "settings": {"score": "induction"},   # the map the tab opens on: the score it was found by
                             "show": "heads-map"}
    assert FIGURES["heads"](measured).data


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("learn-attention")
    return {name: load_model(str(build(root / name)), device="cpu") for name, build in
            (("llama", build_tiny_llama), ("bert", build_tiny_bert), ("marian", build_tiny_marian))}


@pytest.mark.parametrize("kind", ["llama", "bert", "marian"])
def test_every_lesson_measures_and_draws_on_each_kind_of_model(tiny_models, kind, monkeypatch):
    monkeypatch.setattr(lessons, "TIMING_RUNS", 1)
    monkeypatch.setattr(lessons, "MAX_READ_TOKENS", 8)
    model, measured = tiny_models[kind], {}
    for lesson in lessons.LESSONS:
        measured[lesson.name] = result = lesson.measure(model, None)
        if lesson.question.choices:
            assert result.answer in lesson.question.choices
        else:
            assert math.isfinite(result.answer)
        assert result.alt and result.why and result.link["tab"]
        assert FIGURES[lesson.name](result).data, lesson.name
    reading, masks, found = measured["why-attention"], measured["masks"], measured["heads"]
    if kind == "bert":   # an encoder cannot cache: its left-to-right reading reruns the prefix, and says so
        assert reading.values["max_logit_diff"] is None and "encoder" in reading.note
    else:
        assert reading.values["max_logit_diff"] < 1e-4
    assert masks.values["decoder_only"] == (kind == "llama")
    assert (masks.values["padding"] is None) == (kind == "marian") and (kind != "marian" or masks.note)
    assert (found.values["induction"] is None) == (kind != "llama")
