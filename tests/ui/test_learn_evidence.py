"""The course's lesson on what attention does not tell you (ui/services/learn/evidence.py): on SmolLM2 and the IOI
pair, the attention on “Mary” is the captured weights, the rank correlation is Spearman's ρ of the two maps
(scipy's), the most restoring head's score is one patched pass, and the direct logit attribution is the core's;
an encoder is told in words why the lesson cannot read it; the figure draws every head."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from tiny_app_model import build_tiny_bert, build_tiny_llama

from core import load_model
from core.analysis import patching
from core.probe import Patch
from ui.services.learn import evidence as lessons
from ui.services.learn import reveal
from ui.views.learn import evidence as views

(LESSON,) = lessons.LESSONS


@pytest.fixture(scope="module")
def measured(smollm):
    return LESSON.measure(smollm, None)


def ids_of(model, text: str) -> torch.Tensor:
    return model.tokenizer(text, return_tensors="pt").input_ids


def test_the_attention_and_its_rank_correlation_are_the_models(smollm, measured):
    v = measured.values
    clean = ids_of(smollm, lessons.IOI_CLEAN)
    mary = smollm.tokenizer(lessons.ANSWER, add_special_tokens=False).input_ids[0]
    assert v["answer_id"] == mary and clean[0, v["position"]] == mary
    with torch.inference_mode():
        maps = smollm(clean, capture_attention=True, return_logits=False).attentions
    attention = torch.stack([m[0, :, -1, v["position"]] for m in maps]).numpy()
    np.testing.assert_allclose(v["attention"], attention, atol=1e-5)
    rho = spearmanr(v["attention"].flatten(), v["patching"].flatten()).statistic
    assert v["rho"] == pytest.approx(rho, abs=1e-9) and f"ρ = {rho:.2f}" in measured.alt
    rho_dla = spearmanr(v["attention"].flatten(), v["attribution"].flatten()).statistic
    assert v["rho_attribution"] == pytest.approx(rho_dla, abs=1e-9)
    looked, carried = np.argmax(v["attention"]), np.argmax(v["patching"])
    assert measured.answer in LESSON.question.choices
    assert (measured.answer == lessons.SAME) == (looked == carried)
    assert v["top"]["attention"][0][0] == f"L{looked // 9} H{looked % 9}"
    assert measured.answer in reveal(LESSON, measured, measured.answer)


def test_the_patching_score_is_one_patched_pass_and_the_attribution_the_cores(smollm, measured):
    v = measured.values
    clean, corrupted = ids_of(smollm, lessons.IOI_CLEAN), ids_of(smollm, lessons.IOI_CORRUPTED)
    answer, foil = v["answer_id"], v["foil_id"]
    layer, head = divmod(int(np.argmax(v["patching"])), smollm.config.n_heads)
    with torch.inference_mode():
        runs = {name: smollm(ids, record={"z"}) for name, ids in (("clean", clean), ("corrupted", corrupted))}
        where = torch.zeros(1, clean.shape[1], smollm.config.n_heads, 1, dtype=torch.bool)
        where[:, :, head] = True
        patched = smollm(corrupted, patches=[Patch("z", layer, runs["clean"].records["z"][layer], where)])
    difference = {name: (out.logits[0, -1, answer] - out.logits[0, -1, foil]).item()
                  for name, out in (*runs.items(), ("patched", patched))}
    score = (difference["patched"] - difference["corrupted"]) / (difference["clean"] - difference["corrupted"])
    assert v["patching"][layer, head] == pytest.approx(score, abs=1e-4)
    assert v["clean_metric"] == pytest.approx(difference["clean"], abs=1e-4)
    attribution = patching.logit_attribution(smollm, clean, answer, foil)
    np.testing.assert_allclose(v["attribution"], attribution.heads.numpy(), atol=1e-5)
    fig = views.FIGURES["not-explanations"](measured)
    assert len(fig.data) == 1 and len(fig.data[0].x) == smollm.config.n_layers * smollm.config.n_heads
    assert sorted(fig.data[0].y) == pytest.approx(sorted(v["patching"].flatten()), abs=1e-6)


def test_the_shortcut_is_atp_of_every_head_against_the_same_sweep(smollm, measured):
    """AtP's agreement in the answer is the Patching tab's comparison of the same two maps: ρ is scipy's over the
    heads whose output differs, and the overlap counts the exact sweep's strongest heads in AtP's top k."""
    from core.analysis import shortcuts

    v = measured.values
    clean, corrupted = ids_of(smollm, lessons.IOI_CLEAN), ids_of(smollm, lessons.IOI_CORRUPTED)
    atp = shortcuts.approximate_sweep(smollm, clean, corrupted, v["answer_id"], v["foil_id"], "z").scores
    cells = shortcuts.changed_cells(smollm, clean, corrupted, "z")
    exact = torch.from_numpy(v["patching"])
    assert v["atp"]["rho"] == pytest.approx(spearmanr(exact[cells], atp[cells]).statistic, abs=1e-6)
    k = v["atp"]["k"]
    top_exact = set(exact[cells].abs().argsort(descending=True)[:k].tolist())
    top_atp = set(atp[cells].abs().argsort(descending=True)[:k].tolist())
    assert v["atp"]["overlap"] == pytest.approx(len(top_exact & top_atp) / k)
    assert f"ρ = {v['atp']['rho']:.2f} against it" in measured.answer_text
    assert f"finds {round(v['atp']['overlap'] * k)} of its {k} strongest heads" in measured.answer_text


def test_an_encoder_is_told_why_in_words(tmp_path):
    bert = load_model(str(build_tiny_bert(tmp_path / "bert")), device="cpu")
    measured = LESSON.measure(bert, None)
    assert "encoder" in measured.note and "predicts no next token" in measured.answer_text
    assert "not measured on this model" in reveal(LESSON, measured, lessons.SAME)
    fig = views.FIGURES["not-explanations"](measured)
    assert not fig.data and "encoder" in fig.layout.annotations[0].text


def test_a_decoder_whose_tokenizer_splits_the_names_is_told_so(tmp_path):
    llama = load_model(str(build_tiny_llama(tmp_path / "llama", max_positions=64)), device="cpu")
    assert len(llama.tokenizer(lessons.ANSWER, add_special_tokens=False).input_ids) > 1
    measured = LESSON.measure(llama, None)
    assert "one token each" in measured.answer_text and measured.note == measured.answer_text
    assert not views.FIGURES["not-explanations"](measured).data
