"""The course's lesson on positions: the shuffle check recomputed here by hand from SmolLM2's weights (its first
layer's W_Q, W_K, W_V, W_O, eq. 2.1 written out, RoPE from core.layers), the past-the-trained-length numbers read
back from the saved Lab run, and the lesson measured and drawn on tiny models and on the real encoder minilm-l6."""

import math

import numpy as np
import pytest
import torch
from tiny_app_model import build_tiny_bert, build_tiny_llama, build_tiny_marian

from core import load_model
from core.extrapolation import load
from core.layers import apply_rope
from ui.services.lab.extrapolation import SAVED
from ui.services.learn import positions as lesson_module
from ui.services.learn import reveal
from ui.views.learn.positions import FIGURES

LESSON = lesson_module.LESSONS[0]


def test_the_lesson_and_its_figure_are_named():
    assert [lesson.name for lesson in lesson_module.LESSONS] == ["positions"] and set(FIGURES) == {"positions"}
    assert LESSON.question.choices == (lesson_module.SAME, lesson_module.SLIGHTLY, lesson_module.DIFFERENT)


def first_layer_by_hand(model, ids: list[int], rope: bool, causal: bool) -> torch.Tensor:
    """SmolLM2's layer-0 attention output [T, d] from its weights: RMSNorm of the token rows, q = x·W_Q (no biases
    in this family), softmax(q·kᵀ/√d_k)·v per head (query head h reads key head h // group), Σ_h z_h·W_O[h]."""
    block, w = model.stack.blocks[0], model.head_weights(0)
    with torch.inference_mode():
        x = block.attn_norm(model.stack.embed.tokens.weight[torch.tensor(ids)]).float()       # [T, d]
        q = torch.einsum("td,hde->hte", x, w.W_Q.float())                                      # [H, T, d_k]
        k = torch.einsum("td,hde->hte", x, w.W_K.float())                                      # [H_kv, T, d_k]
        v = torch.einsum("td,hde->hte", x, w.W_V.float())
        if rope:
            places = torch.arange(len(ids))[None]
            q, k = apply_rope(q[None], places, model.inv_freq)[0], apply_rope(k[None], places, model.inv_freq)[0]
        group = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])                                # [H, T, T]
        if causal:
            scores = scores.masked_fill(~torch.ones(len(ids), len(ids), dtype=torch.bool).tril(), float("-inf"))
        z = torch.softmax(scores, -1) @ v                                                      # [H, T, d_k]
        return torch.einsum("hte,hed->td", z, w.W_O.float())


def shuffled_difference(model, ids, rope: bool, causal: bool) -> float:
    perm = lesson_module.shuffle_order(len(ids))
    out = first_layer_by_hand(model, ids, rope, causal)
    shuffled = first_layer_by_hand(model, [ids[p] for p in perm], rope, causal)
    return float((shuffled - out[torch.as_tensor(perm)]).abs().max() / out.abs().max())


def test_shuffling_without_positions_only_reorders_smollm_and_rope_or_the_mask_do_not(smollm):
    ids = smollm.tokenizer(lesson_module.SAMPLE)["input_ids"]
    for rope in (False, True):   # the lesson's layer equals the hand-written one
        assert torch.allclose(lesson_module.layer_output(smollm, ids, rope, False),
                              first_layer_by_hand(smollm, ids, rope, False), atol=1e-4)
    measured = LESSON.measure(smollm, None)
    v = measured.values
    assert v["conditions"] == ["no positions, no mask", "its own positions: RoPE", "no positions, the causal mask"]
    assert v["n_tokens"] == len(ids) and v["relative"][0] < lesson_module.ROUNDING
    assert measured.answer == lesson_module.SAME and measured.answer in LESSON.question.choices
    assert shuffled_difference(smollm, ids, False, False) < lesson_module.ROUNDING
    assert v["relative"][1] == pytest.approx(shuffled_difference(smollm, ids, True, False), rel=1e-3)
    assert v["relative"][2] == pytest.approx(shuffled_difference(smollm, ids, False, True), rel=1e-3)
    assert min(v["relative"][1:]) > lesson_module.SLIGHT                     # RoPE and the mask let the order in
    assert f"{v['relative'][1]:.1e}" in measured.answer_text and f"{v['relative'][0]:.1e}" in measured.alt
    assert measured.link == {"tab": "positions", "text": lesson_module.SAMPLE}
    assert FIGURES["positions"](measured).data[0].y == tuple(v["relative"])
    shown = reveal(LESSON, measured, lesson_module.DIFFERENT)
    assert f"measured: “{lesson_module.SAME}”" in shown and measured.why in shown


def test_the_numbers_past_the_trained_length_are_the_saved_runs():
    saved = load(SAVED)
    words, accuracy = lesson_module.extrapolation_words()
    for kind in saved.kinds:
        for n in saved.config.test_lengths:
            assert accuracy[kind.kind][n] == kind.accuracy.get(n)
    alibi, rope = saved.kind("alibi"), saved.kind("rope")
    assert f"alibi: {100 * alibi.accuracy[12]:.1f} %, {100 * alibi.accuracy[24]:.1f} %, " \
           f"{100 * alibi.accuracy[48]:.1f} %" in words
    assert f"rope: {100 * rope.accuracy[12]:.1f} %" in words and "learned: 100.0 %, no row to read" in words
    best = max((k for k in saved.kinds if 48 in k.accuracy), key=lambda k: k.accuracy[48])
    assert f"At 48 symbols {best.kind} keeps the most ({100 * best.accuracy[48]:.1f} %)" in words


def test_a_missing_saved_run_is_said_in_words(monkeypatch):
    monkeypatch.setattr(lesson_module, "saved", lambda: None)
    words, accuracy = lesson_module.extrapolation_words()
    assert accuracy == {} and "missing" in words and "python -m core.extrapolation" in words


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("learn-positions")
    return {name: load_model(str(build(root / name)), device="cpu") for name, build in
            (("llama", build_tiny_llama), ("bert", build_tiny_bert), ("marian", build_tiny_marian))}


@pytest.mark.parametrize("kind", ["llama", "bert", "marian"])
def test_the_lesson_measures_and_draws_on_each_kind_of_model(tiny_models, kind):
    measured = LESSON.measure(tiny_models[kind], None)
    assert measured.answer == lesson_module.SAME                  # a set in, a set out, whatever the family
    assert len(measured.values["conditions"]) == (3 if kind == "llama" else 2)   # the mask check: decoders only
    assert all(np.isfinite(measured.values["relative"])) and measured.why and measured.alt
    assert FIGURES["positions"](measured).data


def test_the_real_encoder_reads_a_set_until_its_learned_positions_are_added():
    from core.store import WeightsUnavailable, ensure

    try:
        model = load_model(ensure("minilm-l6"), device="cpu")
    except WeightsUnavailable as error:
        pytest.skip(f"minilm-l6 is not installed here: {error}")
    measured = LESSON.measure(model, None)
    assert measured.answer == lesson_module.SAME
    assert measured.values["conditions"][1] == "its own positions: a learned position table"
    assert measured.values["relative"][1] > lesson_module.ROUNDING
    assert FIGURES["positions"](measured).data
