"""Recurrence beside attention where the student meets it: the saved result the repository ships
(assets/recurrence, core/lab/recurrent) loads, the Lab's first screen shows its words and figures with its numbers,
and the course's first lesson states them on Reveal; an absent result is a stated empty state."""

from __future__ import annotations

import gradio as gr
import numpy as np
import pytest
from tiny_app_model import build_tiny_llama

from core import load_model
from core.lab import recurrent as engine
from ui.services.lab import recurrence as service
from ui.services.learn import attention as lessons
from ui.tabs.lab import recurrence_section
from ui.views.learn import recurrence as views


@pytest.fixture(scope="module")
def result():
    saved = service.saved()
    assert saved is not None, f"the shipped result is missing: `{service.SAVED_COMMAND}` makes it"
    return saved


def test_the_shipped_result_is_the_commands_and_holds_both_models(result):
    raw = (service.SAVED / "result.json").read_text(encoding="utf-8")
    assert service.SAVED_COMMAND in raw                                # made by the command docs/lab.md gives
    assert [m.name for m in result.models] == ["attention", "GRU"]
    attention, gru = result.models
    assert abs(attention.parameters - gru.parameters) / attention.parameters < 0.01
    assert gru.sequential_steps == result.longest_tokens and attention.sequential_steps == result.config.n_layers
    lo, hi = result.config.lengths
    for m in result.models:
        assert sorted(m.accuracy) == list(range(lo + 1, hi + 2))
        assert len(m.step_ms) == result.config.steps


def test_the_words_state_the_saved_numbers(result):
    words = service.finding(result)
    for m in result.models:
        near, far = min(m.accuracy), max(m.accuracy)
        assert f"{m.parameters:,}" in words
        assert f"{m.accuracy[near]:.0%}" in words and f"{m.accuracy[far]:.0%}" in words
        assert f"{m.gradient_untrained[-1] / m.gradient_untrained[0]:.1e}" in words
        assert f"{m.median_step_ms:.1f} ms" in words and f" {m.sequential_steps} " in words
    assert f"{result.config.steps:,} steps" in service.caveat(result) and "One seed" in service.caveat(result)


def test_the_figures_draw_the_saved_numbers(result):
    accuracy, gradient = views.accuracy_figure(result), views.gradient_figure(result)
    for trace, m in zip(accuracy.data, result.models):
        np.testing.assert_allclose(trace.y, [100 * m.accuracy[d] for d in sorted(m.accuracy)])
    by_name = {t.name: t for t in gradient.data}
    for m in result.models:
        trained = np.asarray(m.gradient_trained)
        np.testing.assert_allclose(by_name[f"{m.name}, trained"].y, trained / trained[0], rtol=1e-6)
    assert gradient.layout.yaxis.type == "log"


def test_the_labs_first_screen_shows_the_result(result):
    with gr.Blocks() as page:
        recurrence_section()
    by_id = {c.elem_id: c for c in page.blocks.values() if getattr(c, "elem_id", None)}
    assert service.finding(result) in by_id["lab-recurrence-note"].value
    assert service.SAVED_COMMAND in by_id["lab-recurrence-note"].value
    for name in ("lab-recurrence-accuracy", "lab-recurrence-gradient"):
        assert by_id[name].value is not None


def test_an_absent_result_is_a_stated_empty_state(tmp_path, monkeypatch):
    assert service.saved.__wrapped__(tmp_path) is None
    monkeypatch.setattr(service, "saved", lambda: None)
    words, accuracy, gradient = views.lab_recurrence()
    assert "No saved result" in words and service.SAVED_COMMAND in words
    assert "not saved" in service.lesson_words() and service.lesson_values() is None


def test_the_first_lesson_uses_the_result_on_reveal(tmp_path, result):
    model = load_model(str(build_tiny_llama(tmp_path / "llama")), device="cpu")
    measured = lessons.measure_reading(model)
    assert service.finding(result) in measured.why
    values = measured.values["recurrence"]
    assert values["GRU"]["sequential_steps"] == result.longest_tokens
    assert values["attention"]["far"][1] == result.models[0].accuracy[max(result.models[0].accuracy)]
    # the lesson's own text types none of these numbers: they come on Reveal
    text = lessons.LESSONS[0].text
    assert f"{result.models[0].parameters:,}" not in text and "GRU" in text


def test_a_damaged_file_is_not_read_as_a_result(tmp_path):
    (tmp_path / "result.json").write_text('{"config": {}}', encoding="utf-8")
    with pytest.raises((KeyError, TypeError, ValueError)):
        engine.load(tmp_path)
    assert service.saved.__wrapped__(tmp_path) is None
