"""Predict, then see: before Reveal a lesson's page (its text, question, the line under the figure, and every
string of its figure: title, subtitle, annotations, trace names, hover, custom data, tick labels) does not state
the measured answer as the page formats it, nor the figure's line; Reveal gives the answer beside the guess, the
whole figure and its line. Every lesson, on a tiny decoder and encoder (on the real SmolLM2 and MiniLM, the page
itself is read before and after Reveal in Chromium: tests/browser/test_browser_learn.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tiny import OneModel
from tiny_app_model import build_tiny_bert, build_tiny_llama

from core import load_model
from ui.services import learn
from ui.services.learn import course as syllabus
from ui.views.learn import course as views


def services_for(model):
    return SimpleNamespace(models=OneModel(model), lessons=syllabus.LessonCache())


def strings(value) -> list[str]:
    """Every string in a figure's JSON: titles, subtitles, annotations, names, hover, text, tick labels (and the
    tokens that label a heatmap's axes)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in strings(item)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in strings(item)]
    return []


def shown_before_reveal(page: views.LessonPage, question: learn.Question) -> str:
    figure = page.figure.to_plotly_json()
    texts = [page.place, page.text, page.question, page.alt, *strings(figure)]
    for trace in figure["data"]:
        for key in ("customdata", "hovertext", "text"):
            if trace.get(key) is not None:   # numbers here would show on hover or on the marks
                texts += [str(v) for v in (trace[key].tolist() if hasattr(trace[key], "tolist") else trace[key])]
    return "\n".join(texts)


def check_every_lesson(model, model_name: str) -> None:
    services = services_for(model)
    for lesson in syllabus.lessons():
        page = views.lesson_page(services, model_name, lesson.name)
        result = services.lessons.get(model_name, model, lesson)
        before = shown_before_reveal(page, lesson.question)
        drawn = bool(page.figure.data)
        if drawn:   # a figure with values: no hover, no subtitle, no printed values before Reveal
            assert page.figure.layout.hovermode is False, lesson.name
            assert not (page.figure.layout.title.subtitle and page.figure.layout.title.subtitle.text), lesson.name
            assert all(trace.text is None and trace.hovertemplate is None for trace in page.figure.data), lesson.name
            assert result.alt not in before, (lesson.name, model_name)
        numeric = lesson.question.numeric and not isinstance(result.answer, str)
        if numeric:
            shown = learn.number(result.answer)
            if len(shown) == 1 and lesson.question.unit:  # one digit is in every tick label and in "0.3": the page
                # would state it with its unit (a random tiny model has 0 % sink heads)
                assert f"{shown} {lesson.question.unit}" not in before and f"{shown}{lesson.question.unit}" not in \
                    before, (lesson.name, model_name, shown, before)
            else:
                assert shown not in before, (lesson.name, model_name, shown, before)
        guess = lesson.question.choices[0] if lesson.question.choices else "1"
        words, whole, line = views.revealed(services, model_name, lesson.name, guess)
        full = views.figure(lesson.name, result)   # the figure's numbers come back with the answer
        assert line == result.alt and whole.to_json() == full.to_json(), lesson.name
        if numeric:
            assert f"measured: {learn.number(result.answer)}" in words and "Your guess: 1" in words, lesson.name
        elif lesson.question.choices and result.answer in lesson.question.choices:
            assert f"measured: “{result.answer}”" in words, lesson.name


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learn-reveal")
    return {"tiny-llama": load_model(str(build_tiny_llama(folder / "llama")), device="cpu"),
            "tiny-bert": load_model(str(build_tiny_bert(folder / "bert")), device="cpu")}


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bert"])
def test_no_lesson_states_its_answer_before_reveal_on_tiny_models(tiny_models, name):
    check_every_lesson(tiny_models[name], name)


def test_a_veiled_figure_keeps_its_shapes_and_drops_its_numbers():
    from ui.plots.charts import bar_figure

    fig = bar_figure(["a", "b"], {"s": [1.5, 3072.0]}, "Title", "y", text_format=",.0f", subtitle="3,072 in all")
    veiled = views.veiled(fig)
    assert list(veiled.data[0].y) == [1.5, 3072.0] and veiled.layout.title.text == "Title"
    assert "3,072" not in "\n".join(strings(veiled.to_plotly_json()))
    assert "3,072" in "\n".join(strings(fig.to_plotly_json()))   # the original keeps them for Reveal
