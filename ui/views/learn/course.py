"""The Learn tab's views: one lesson shown on the loaded model (its place in the course, text, question and the
set-up of its measurement), the revealed answer with the measured figure and its line, and the state its "try it"
button opens. Every word here is the project's own: the only thing a reader types, the guess, comes back as a
number or as one of the lesson's choices."""

from __future__ import annotations

from dataclasses import dataclass

from ui.plots.base import fit_narrow
from ui.plots.text import escaped
from ui.services import Services
from ui.services import learn
from ui.services.learn import course as syllabus
from ui.services.checks import index_of
from ui.views.learn import figure as lesson_figure
from ui.views.learn.setup import setup_figure, with_guess

# what "try it" computes where the tab's own figures are not the lesson's: what lands there, and what to press next
TRY_NOTES = {"generate": "The Generate tab writes the lesson's text on, greedily: pick a token in its strip for that "
                         "step's attention, or press **Measure the KV cache on this prompt** for the cache's size.",
             "gen-step-row": "The Generate tab writes the lesson's text on, greedily, a token at a time, and shows "
                             "the **first new token's step**: its attention row reaches every earlier token at once.",
             "gen-kv-fig": "The Generate tab writes the lesson's text on, greedily, and **measures its KV cache**: "
                           "its size by the formula and as allocated, and the time per new token with and without it.",
             "lab": "The Lab opens the run this lesson reads (**{lab_run}**, in its Run list) on “{source}” and draws "
                    "its attention; press **Train** there to train one yourself."}
TAB_TITLES = {"generate": "Generate", "attention": "Attention", "positions": "Positional encoding",
              "masks": "Masks", "heads": "Heads", "patching": "Patching", "inside": "Inside",
              "corpus": "Across texts", "lab": "Lab"}


@dataclass
class LessonPage:
    """What the tab shows for one lesson on one model before Reveal: its text and question, and the set-up of its
    measurement (ui.views.learn.setup: axes that nothing measured fills; None where nothing was measured on this
    model). `revealed` gives what Reveal shows: the answer, the measured figure and its line."""

    name: str
    place: str          # "Lesson 3 of 11 · Why divide by √d_k"
    text: str           # the lesson's text, then what it measured on
    question: str
    choices: tuple[str, ...]
    unit: str
    figure: object      # a plotly Figure, or None
    try_label: str
    link: dict
    try_note: str = ""  # what lands where the tab computes something beside the lesson's figure


def measured(services: Services, model_name: str, lesson: learn.Lesson, progress=None) -> learn.Measured:
    model = services.models.get(model_name, progress)
    return services.lessons.get(services.models.key(model_name), model, lesson, progress)


def lesson_page(services: Services, model_name: str, name: str, progress=None) -> LessonPage:
    """Lesson `name` computed on the model (a cache hit after the first visitor)."""
    lesson = syllabus.find(name)
    result = measured(services, model_name, lesson, progress)
    number, total = syllabus.position(lesson.name)
    parts = [lesson.text]
    if lesson.text_sample:
        parts.append(f"*Measured on `{escaped(model_name)}`, on the text:* “{escaped(lesson.text_sample)}”")
    else:
        parts.append(f"*Measured on `{escaped(model_name)}`.*")
    if result.note:
        parts.append(f"**Note.** {result.note}")
    tab = result.link.get("tab", "attention")
    question = f"**Before you look:** {lesson.question.prompt}"
    if lesson.question.numeric:
        question += f" (a number{', in ' + lesson.question.unit if lesson.question.unit else ''})"
    return LessonPage(name=lesson.name, place=f"**Lesson {number} of {total} · {lesson.title}**",
                      text="\n\n".join(parts), question=question, choices=lesson.question.choices,
                      unit=lesson.question.unit, figure=before_reveal(lesson.name, result),
                      try_label=f"Try it in the {TAB_TITLES.get(tab, tab)} tab", link=dict(result.link),
                      try_note=try_note(result.link))


def before_reveal(name: str, result: learn.Measured):
    """The lesson's set-up figure, laid out to read on a phone too; None where nothing was measured."""
    fig = setup_figure(name, result)
    return None if fig is None else fit_narrow(fig)


def answer(services: Services, model_name: str, name: str, guess=None, progress=None) -> str:
    """The revealed answer: the guess (if any) beside the measured value, and why."""
    lesson = syllabus.find(name)
    return learn.reveal(lesson, measured(services, model_name, lesson, progress), guess)


def revealed(services: Services, model_name: str, name: str, guess=None, progress=None) -> tuple[str, object, str]:
    """What Reveal shows: the answer with the guess beside it (`answer`), the measured figure with the guess marked
    on it where the guess is a number on one of its axes, and the figure's line."""
    lesson = syllabus.find(name)
    result = measured(services, model_name, lesson, progress)
    value, _ = learn.read_guess(lesson.question, guess)
    return learn.reveal(lesson, result, guess), figure(lesson.name, result, value), result.alt


def figure(name: str, result: learn.Measured, guess=None):
    """The lesson's measured figure as the page shows it, the reader's numeric guess marked on it (setup.with_guess),
    laid out to read on a phone too (ui.plots.base.fit_narrow)."""
    return fit_narrow(with_guess(name, lesson_figure(name, result), result, guess))


def neighbour(name: str, step: int) -> str:
    """The lesson `step` places after `name` (back: -1), staying at the first or last."""
    names = syllabus.names()
    at = names.index(syllabus.find(name).name) + step
    return names[max(0, min(len(names) - 1, at))]


def try_note(link: dict) -> str:
    """What "try it" lands on where the tab computes something else than the lesson's figure; nothing where it only
    opens the tab (the lesson's note says why this model cannot run it there)."""
    if link.get("compute") is False:
        return ""
    note = TRY_NOTES.get(link.get("show")) or TRY_NOTES.get(link.get("tab"))
    if note is None:
        return ""
    return note.format(**{key: escaped(str(value)) for key, value in
                                            (link.get("settings") or {}).items()})


def try_state(link: dict) -> dict:
    """The state "try it" opens: the tab, and its text (and corrupted prompt), layer and head where the lesson
    names them, the tab's settings it names (ui.tabs.widgets.Tab.settings), the figure that shows the lesson's
    subject there ("show": its elem_id, which the landing computes), and compute: False where the tab only opens."""
    state = {"tab": link.get("tab", "attention"), **dict(link.get("settings") or {})}
    if link.get("compute") is False:
        state["compute"] = False
    for key in ("layer", "head"):
        if index_of(link.get(key)) is not None:
            state[key] = index_of(link[key])
    for key in ("text", "corrupted"):  # the Patching tab's second prompt
        if isinstance(link.get(key), str) and link[key].strip():
            state[key] = link[key]
    if isinstance(link.get("show"), str) and link.get("compute") is not False:
        state["show"] = link["show"]
    return state


def api_lesson(services: Services, model_name: str, lesson: str, progress=None):
    """The `lesson` endpoint: the lesson's text with its question, the measured figure, and the answer with the
    figure's line, for a notebook or a course page. It returns the answer, so its figure is the revealed one."""
    page = lesson_page(services, model_name, lesson, progress)
    text = "\n\n".join([page.place, page.text, page.question]
                       + ([f"Choices: {', '.join(page.choices)}"] if page.choices else []))
    words, whole, alt = revealed(services, model_name, lesson)
    return text, whole, words + f"\n\n*Figure:* {alt}"
