"""Predict, then see: before Reveal a lesson's page shows its text, question and the set-up of its measurement, a
figure of axes that nothing measured fills (no trace; its titles, tick labels and axis ranges state neither the
measured answer, as a value or as a share × 100 to the precision the answer shows, nor the figure's line); Reveal
gives the answer beside the guess, the measured figure with a numeric guess marked on it, and its line. Every
lesson, on a tiny decoder and encoder (on the real SmolLM2 and MiniLM, the page itself is read before and after
Reveal in Chromium: tests/browser/test_browser_learn.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from learn_checks import carries, numbers
from tiny import OneModel
from tiny_app_model import build_tiny_bert, build_tiny_llama

from core import load_model
from ui.services import learn
from ui.services.learn import course as syllabus
from ui.views.learn import course as views
from ui.views.learn import setup


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


def shown_before_reveal(page: views.LessonPage) -> str:
    figure = page.figure.to_plotly_json() if page.figure is not None else {}
    return "\n".join([page.place, page.text, page.question, *strings(figure)])


def trace_values(trace: dict) -> list[float]:
    """Every number a trace draws or hovers: its x, y, z and values, its custom data and text."""
    return [v for key in ("x", "y", "z", "values", "customdata", "text") for v in numbers(trace.get(key))]


def axis_ranges(figure: dict) -> list:
    layout = figure.get("layout", {})
    return [v for key, axis in layout.items() if key.startswith(("xaxis", "yaxis")) for v in axis.get("range", [])]


def check_every_lesson(model, model_name: str) -> None:
    services = services_for(model)
    for lesson in syllabus.lessons():
        page = views.lesson_page(services, model_name, lesson.name)
        result = services.lessons.get(model_name, model, lesson)
        before = shown_before_reveal(page)
        assert result.alt not in before, (lesson.name, model_name)
        guess = lesson.question.choices[0] if lesson.question.choices else "1"
        words, whole, line = views.revealed(services, model_name, lesson.name, guess)
        assert line == result.alt
        if page.figure is None:   # nothing measured on this model: the note says why, and Reveal draws no values
            assert result.note and not whole.data, (lesson.name, model_name)
        else:   # the set-up: axes and words, no trace; and the measured figure only on Reveal
            assert not page.figure.data and whole.data, (lesson.name, model_name)
            assert page.figure.layout.hovermode is False, lesson.name
        numeric = lesson.question.numeric and not isinstance(result.answer, str)
        if numeric:
            shown = learn.number(result.answer)
            if len(shown) == 1 and lesson.question.unit:  # one digit is in every tick label and in "0.3": the page
                # would state it with its unit (a random tiny model has 0 % sink heads)
                assert f"{shown} {lesson.question.unit}" not in before and f"{shown}{lesson.question.unit}" not in \
                    before, (lesson.name, model_name, shown, before)
            else:
                assert shown not in before, (lesson.name, model_name, shown, before)
            if page.figure is not None:
                figure = page.figure.to_plotly_json()
                assert not carries(axis_ranges(figure), result.answer), (lesson.name, model_name)
                assert not any(carries(trace_values(t), result.answer) for t in figure["data"]), lesson.name
            assert f"measured: {learn.number(result.answer)}" in words and "Your guess: 1" in words, lesson.name
        elif lesson.question.choices and result.answer in lesson.question.choices:
            assert f"measured: “{result.answer}”" in words, lesson.name
        full = views.figure(lesson.name, result, learn.read_guess(lesson.question, guess)[0])
        assert whole.to_json() == full.to_json(), lesson.name


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learn-reveal")
    return {"tiny-llama": load_model(str(build_tiny_llama(folder / "llama")), device="cpu"),
            "tiny-bert": load_model(str(build_tiny_bert(folder / "bert")), device="cpu")}


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bert"])
def test_no_lesson_states_its_answer_before_reveal_on_tiny_models(tiny_models, name):
    check_every_lesson(tiny_models[name], name)


def test_a_numeric_guess_is_marked_on_the_measured_figure_where_it_is_on_an_axis(tiny_models):
    """sqrt-dk's guess on its variance bar, masks' as a line at the guessed share, kv-cache's at 1,024 tokens; a
    choice, no guess, or a guess of no axis (the reading ratio) marks nothing."""
    model = tiny_models["tiny-llama"]
    services = services_for(model)
    marked = {}
    for name in ("sqrt-dk", "masks", "kv-cache", "why-attention", "positions"):
        lesson = syllabus.find(name)
        guess = lesson.question.choices[0] if lesson.question.choices else "37.5"
        _, whole, _ = views.revealed(services, "tiny-llama", name, guess)
        _, plain, _ = views.revealed(services, "tiny-llama", name, "")
        assert not [t for t in plain.data if t.name == setup.GUESS], name
        marked[name] = [t for t in whole.data if t.name == setup.GUESS]
    assert not marked["why-attention"] and not marked["positions"]
    (scale,), (masks,), (cache,) = marked["sqrt-dk"], marked["masks"], marked["kv-cache"]
    assert list(scale.y) == [37.5] and list(scale.x) == [setup.SCALE_CATEGORIES[0]]
    assert set(masks.y) == {0.375} and masks.mode == "lines"
    assert list(cache.x) == [1024] and list(cache.y) == [37.5]


def test_carries_reads_the_answer_at_its_shown_precision():
    assert carries([12.6714], 12.67) and carries([[0.1, 0.5002]], 50.0) and carries([0], 0.0)
    assert carries([[884736.2]], 884736.0) and carries([None, "x", 3.0], 3.004)
    assert not carries([12.5, 0.13, -0.5, 100, None], 12.67) and not carries([1e-9], 0.0)
