"""The course: the `lesson` endpoint through gradio_client on the tiny app Llama (every lesson gives its text with
its question, the measured figure, and its answer, the answer's number the lesson's own measurement on the same
model, computed once per model into the lessons' own cache); links that name a lesson; the guess read as a number
or a choice, never as page text; bad names and models in words."""

from __future__ import annotations

import json
import os

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402
from ui import links  # noqa: E402
from ui.services import learn  # noqa: E402
from ui.services.learn import course as syllabus  # noqa: E402
from ui.views.learn import course as views  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    llama = str(build_tiny_llama(tmp_path_factory.mktemp("learn-models") / "tiny-llama"))
    demo, url, services = launch_app([llama], llama)
    yield dict(llama=llama, services=services, client=Client(url, verbose=False))
    demo.close()


def test_every_lesson_comes_through_the_api_with_its_measured_answer(served):
    services, llama = served["services"], served["llama"]
    model = services.models.get(llama)
    for number, lesson in enumerate(syllabus.lessons(), start=1):
        text, plot, answer = served["client"].predict(llama, lesson.name, api_name="/lesson")
        assert f"Lesson {number} of {len(syllabus.lessons())}" in text and lesson.title in text
        assert lesson.question.prompt in text
        kept = services.lessons.get(llama, model, lesson)             # the server's own, computed once
        # the measured figure (the endpoint gives the answer too), not the set-up the page shows before Reveal:
        # something drawn, or a note saying why this model has nothing to show
        drawn = json.loads(plot["plot"])["data"]
        assert len(drawn) == len(views.figure(lesson.name, kept).data), lesson.name
        assert drawn or (kept.note and kept.note in text), lesson.name
        if isinstance(kept.answer, str) and not lesson.question.choices:
            shown = f"nothing ({kept.answer})"
        else:
            shown = f"“{kept.answer}”" if lesson.question.choices else learn.number(kept.answer)
        assert f"Measured: {shown}" in answer and "Why:" in answer and kept.alt in answer
    assert len(services.lessons) == len(syllabus.lessons())
    services.lessons.get(llama, model, syllabus.lessons()[0])              # a second visit: no new entry
    assert len(services.lessons) == len(syllabus.lessons())


@pytest.mark.parametrize("args, words", [(("no-such-lesson",), "There is no lesson"),
                                         (("",), "There is no lesson")])
def test_a_wrong_lesson_is_named(served, args, words):
    with pytest.raises(AppError, match=words):
        served["client"].predict(served["llama"], *args, api_name="/lesson")


def test_a_wrong_model_is_named(served):
    with pytest.raises(AppError, match="is not in the list of choices"):   # the picker's own check
        served["client"].predict("no/such/model", syllabus.names()[0], api_name="/lesson")


def test_links_name_a_lesson():
    first, third = syllabus.names()[0], syllabus.names()[2]
    shape = lambda name: (2, 4)  # noqa: E731 - layers and heads of any model
    state = links.parse({"lesson": third.upper()}, ["m"], shape, "m")
    assert state.lesson == third and state.tab == "learn" and not state.messages
    state = links.parse({"tab": "learn", "lesson": "<b>nope</b>"}, ["m"], shape, "m")
    assert state.lesson is None and state.tab == "learn" and "does not exist" in state.messages[0]
    assert links.linked_tab({"lesson": first}, links.TABS) == "learn"
    url, note = links.make("http://127.0.0.1:7860/?x=1", "m", "learn", 1, 2, "a text", lesson=third)
    assert url == f"http://127.0.0.1:7860/?model=m&tab=learn&lesson={third}&text=a+text" and not note
    assert links.make("http://h/", "m", "attention", 1, 2, None, lesson=third)[0] == (
        "http://h/?model=m&tab=attention&layer=1&head=2")   # a lesson only on the Learn tab


def test_a_guess_is_read_as_a_number_or_a_choice_and_never_as_text():
    numeric = learn.Question("How many?", unit="heads")
    choice = learn.Question("Which?", ("left", "right"))
    measured = learn.Measured(answer=12.67, answer_text="It is 12.67.", why="Because.", alt="line")
    lesson = learn.Lesson("x", "X", "text", numeric, lambda model, progress=None: measured)
    assert learn.read_guess(numeric, " 1,200 ") == (1200.0, "")
    assert learn.read_guess(numeric, "") == (None, "")
    value, note = learn.read_guess(numeric, "<img src=x onerror=alert(1)>")
    assert value is None and "not a number" in note and "<" not in note
    assert learn.read_guess(numeric, "inf")[0] is None
    assert learn.read_guess(choice, "right") == ("right", "")
    assert learn.read_guess(choice, "<b>up</b>")[0] is None
    words = learn.reveal(lesson, measured, "10")
    assert words.startswith("**Your guess: 10.0 heads; measured: 12.7 heads.**")
    words = learn.reveal(lesson, measured, "<script>")
    assert "<script>" not in words and "Measured: 12.7 heads" in words
    picked = learn.Lesson("y", "Y", "text", choice,
                          lambda model, progress=None: learn.Measured("right", "Right.", "Why.", "line"))
    assert "(right)" in learn.reveal(picked, picked.measure(None), "right")
    assert "not this time" in learn.reveal(picked, picked.measure(None), "left")
