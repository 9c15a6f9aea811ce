"""The course's lesson on composition (ui/services/learn/composition.py): on the Lab's saved induction run the answer
is the component core.lab.induction finds first (its previous-token head, as core.analysis.circuits names it), with
the same numbers; on SmolLM2 the strongest induction head is the probe's, its keys are traced as the Heads tab traces
them and the circuit is decided by the same rule; an encoder is told why its half is not measured; before Reveal no
bar and no name of one is drawn, only the heads traced."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_app_model import build_tiny_bert

from core import load_model
from core.analysis import circuits, heads as head_scores
from ui.services.lab import induction
from ui.services.learn import course, reveal
from ui.services.learn import composition as lessons
from ui.views.learn import figure
from ui.views.learn.setup import setup_figure

(LESSON,) = lessons.LESSONS


@pytest.fixture(scope="module")
def measured(smollm):
    return LESSON.measure(smollm, None)


def test_the_lab_half_is_the_circuit_the_core_finds(measured):
    found = induction.trace_saved()
    assert found.finding.found and found.labels[0] == str(found.finding.source)
    assert f"On the Lab's model, {found.finding.words()}." in measured.answer_text
    assert measured.answer == lessons.PREVIOUS and measured.answer in LESSON.question.choices
    assert (f"{found.labels[0]}** (share {found.mean[0]:+.2f} of the relative score, 95 % interval "
            f"[{found.low[0]:.2f}, {found.high[0]:.2f}] over {found.n} texts)") in measured.answer_text
    lab = measured.values["panels"][0]
    assert lab.labels == found.labels and np.array_equal(lab.mean, found.mean)
    assert measured.link == {"tab": "lab", "settings": {"lab_run": induction.RUN, "source": lessons.TRY_SOURCE},
                             "show": "lab-decoder"}
    assert course.names()[-1] == "composition" and measured.answer in reveal(LESSON, measured, lessons.OTHER)


def test_the_loaded_models_half_traces_its_strongest_induction_head(smollm, measured):
    probe = head_scores.induction(smollm, 100)
    scores = probe.scores[1:]
    flat = int(scores.flatten().argmax())
    layer, head = 1 + flat // smollm.config.n_heads, flat % smollm.config.n_heads
    real = measured.values["panels"][1]
    assert real.title == f"L{layer} H{head} of the loaded model" and (layer, head) == (18, 6)
    assert f"the strongest induction head is **L{layer} H{head}**" in measured.why
    assert f"fed most by **{real.labels[0]}** (share {real.mean[0]:+.2f})" in measured.why
    assert real.labels[0] == "L16 H0"
    # the circuit as core.analysis.circuits decides it from the same scores: named only above both minimums
    previous = float(head_scores.pattern_scores(smollm, probe.ids)["previous_token"][16, 0])
    named = previous >= circuits.PREVIOUS_MIN and float(probe.scores[layer, head]) >= circuits.INDUCTION_MIN
    rule = measured.why.split("By the circuit's rule")[1]
    assert f"{previous:.2f}" in rule and ("Olsson" in rule) == named and ("no circuit formed" in rule) != named


def test_an_encoder_gets_the_lab_half_and_a_reason(tmp_path):
    result = LESSON.measure(load_model(build_tiny_bert(tmp_path / "bert"), device="cpu"), None)
    assert result.answer == lessons.PREVIOUS and len(result.values["panels"]) == 1
    assert "the second half is not measured: the induction probe needs a decoder-only model" in result.why


def test_before_reveal_no_bar_and_no_name_is_drawn_only_the_heads_traced(measured):
    whole, before = figure("composition", measured), setup_figure("composition", measured)
    assert whole.data and not before.data
    names = {label for panel in measured.values["panels"] for label in panel.labels}
    shown = before.to_json()
    assert not any(f'"{name}"' in shown for name in names)
    assert all(panel.title in before.layout.title.subtitle.text for panel in measured.values["panels"])


def test_the_axis_says_what_the_bars_are_signed_parts_that_sum_to_one(measured):
    """The words give a share past 1 ("share +2.42 of the relative score"); the bars' axis, before and after
    Reveal, calls it a signed share of the relative score whose parts sum to 1, and each panel's bars (the named
    parts and the rest) do sum to 1, with a negative part beside any share past 1."""
    from ui.plots.heads import SHARE_AXIS

    whole, before = figure("composition", measured), setup_figure("composition", measured)
    titles = [axis.title.text for name, axis in whole.layout.to_plotly_json().items() if name.startswith("xaxis")
              for axis in [whole.layout[name]]]
    assert titles and set(titles) == {SHARE_AXIS} and before.layout.xaxis.title.text == SHARE_AXIS
    assert "signed" in SHARE_AXIS and "sum to 1" in SHARE_AXIS
    for trace in whole.data:
        bars = np.asarray(trace.x, dtype=float)
        assert bars.sum() == pytest.approx(1.0, abs=1e-3), trace.y
        assert bars.max() <= 1 or bars.min() < 0
