"""The course's lesson on positions: its numbers are the model's own forward pass (layer 0's attn_out record,
the positions and causal_mask switches, with and without positions, a sliding window included), the
past-the-trained-length numbers are read back from the saved Lab run, and the lesson is measured and drawn on tiny
models (one with a window), on the real SmolLM2 and on the real encoder minilm-l6."""

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_app_model import build_tiny_bert, build_tiny_llama, build_tiny_marian, build_tokenizer

import tiny
from core import load_model
from core.lab.extrapolation import load
from ui.services.lab.extrapolation import SAVED
from ui.services.learn import positions as lesson_module
from ui.services.learn import reveal
from ui.views.learn.positions import FIGURES

LESSON = lesson_module.LESSONS[0]


def test_the_lesson_and_its_figure_are_named():
    assert [lesson.name for lesson in lesson_module.LESSONS] == ["positions"] and set(FIGURES) == {"positions"}
    assert LESSON.question.choices == (lesson_module.SAME, lesson_module.SLIGHTLY, lesson_module.DIFFERENT)


def forward_layer0(model, ids: list[int], positions: bool, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 0's attn_out [T, d] and pattern [H, T, T] from the model's full forward pass with its own switches:
    positions=False leaves out RoPE (and any position rows or score bias), causal_mask=False the causal mask."""
    with torch.inference_mode():
        out = model(torch.tensor([ids]), positions=positions, causal_mask=causal, record=["attn_out", "pattern"],
                    return_logits=False)
    return out.records["attn_out"][0][0].float(), out.records["pattern"][0][0].float()


def test_the_lessons_numbers_are_smollms_own_forward_with_and_without_positions(smollm):
    ids = smollm.tokenizer(lesson_module.SAMPLE)["input_ids"]
    perm = torch.as_tensor(lesson_module.shuffle_order(len(ids)))
    conditions = ((False, False), (True, False), (False, True))      # the lesson's three, in its order
    forward = {c: forward_layer0(smollm, ids, *c) for c in conditions}
    moved = {c: forward_layer0(smollm, [ids[p] for p in perm], *c) for c in conditions}
    for c in conditions:              # the lesson's layer is the forward's own record, with and without RoPE
        torch.testing.assert_close(lesson_module.layer_output(smollm, ids, *c), forward[c][0], atol=1e-5, rtol=1e-5)
    # what the lesson claims, in the forward's own pattern: with no positions and no mask, shuffled tokens give
    # the same weights shuffled (P·A·Pᵀ); with RoPE they do not
    plain = forward[False, False][1]
    torch.testing.assert_close(moved[False, False][1], plain[:, perm][:, :, perm], atol=1e-5, rtol=0)
    rotated = forward[True, False][1]
    assert (moved[True, False][1] - rotated[:, perm][:, :, perm]).abs().max() > 1e-2
    # the lesson's measure on the forward's outputs: max |f(Px) − P·f(x)| ÷ max |f(x)|
    relative = [float((moved[c][0] - forward[c][0][perm]).abs().max() / forward[c][0].abs().max())
                for c in conditions]

    measured = LESSON.measure(smollm, None)
    v = measured.values
    assert v["conditions"] == ["no positions, no mask", "its own positions: RoPE", "no positions, the causal mask"]
    assert v["n_tokens"] == len(ids) and v["window"] is None and v["relative"][0] < lesson_module.ROUNDING
    assert measured.answer == lesson_module.SAME and measured.answer in LESSON.question.choices
    assert relative[0] < lesson_module.ROUNDING
    assert v["relative"][1:] == pytest.approx(relative[1:], rel=1e-3)
    assert min(v["relative"][1:]) > lesson_module.SLIGHT                     # RoPE and the mask let the order in
    # the sentences read the numbers they describe
    assert f"by at most {v['max_difference'][0]:.1e}" in measured.answer_text
    assert f"With the model's own positions (RoPE) they differ by {v['relative'][1]:.1e}" in measured.answer_text
    assert f"the causal mask (each token reads only those before it), by {v['relative'][2]:.1e}" in \
        measured.answer_text
    assert f"({v['relative'][0]:.1e} is the rounding" in measured.why
    assert f"the difference is {v['relative'][1]:.1e}" in measured.why
    assert f"{v['relative'][0]:.1e}" in measured.alt and "cut to" not in measured.answer_text
    # Try it lands on the same check in the Positional encoding tab, computed there
    assert measured.link == {"tab": "positions", "text": lesson_module.SAMPLE, "show": "pe-shuffle"}
    assert FIGURES["positions"](measured).data[0].y == tuple(v["relative"])
    shown = reveal(LESSON, measured, lesson_module.DIFFERENT)
    assert f"measured: “{lesson_module.SAME}”" in shown and measured.why in shown


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """A tiny Mistral whose every layer attends within a window of 5 keys, with a tokenizer to read the sample."""
    folder = Path(tiny.save(tiny.mistral(vocab_size=400), str(tmp_path_factory.mktemp("windowed"))))
    build_tokenizer(folder)
    return load_model(str(folder), device="cpu")


def test_the_window_is_the_models_own_and_the_lesson_reads_a_text_it_hides_nothing_of(windowed):
    window = windowed.config.sliding_window
    ids = torch.randint(3, 390, (13,), generator=torch.Generator().manual_seed(0)).tolist()
    for positions in (False, True):            # the window is in the lesson's layer: it is the forward's
        torch.testing.assert_close(lesson_module.layer_output(windowed, ids, positions, False),
                                   forward_layer0(windowed, ids, positions, False)[0], atol=1e-5, rtol=1e-5)
    pattern = forward_layer0(windowed, ids, False, False)[1]                              # [H, 13, 13]
    far = torch.arange(13)[:, None] - torch.arange(13)[None, :] >= window
    assert (pattern[:, far] == 0).all() and (pattern[:, ~far] > 0).all()     # no causal mask; the window stays
    # on 13 tokens the window lets the order in, with no positions and no causal mask; on `window` tokens it hides
    # nothing, so the lesson reads at most that many
    assert lesson_module.shuffle_check(windowed, ids, False, False, "").relative > lesson_module.SLIGHT
    assert lesson_module.lesson_tokens(windowed) == window
    measured = LESSON.measure(windowed, None)
    assert measured.values["n_tokens"] == window and measured.values["window"] == window
    assert measured.answer == lesson_module.SAME
    assert f"cut to layer 0's sliding window of {window} tokens" in measured.answer_text


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
    assert accuracy == {} and "missing" in words and "python -m core.lab.extrapolation" in words


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
