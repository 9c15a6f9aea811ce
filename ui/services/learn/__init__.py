"""The course (the Learn tab): the theory in order, each lesson a short text, a question, and one measurement on
the loaded model that answers it.

A lesson is data (`Lesson`): a stable name (in links: ?tab=learn&lesson=sqrt-dk), a title, the text with its
equations numbered as in docs/theory.md, a question (`Question`: choices, or a number to guess) and `measure`, the
function that computes the answer on a model (`Measured`: the answer, its words, the figure's values and one line
stating its main number, and the state the "try it" link opens). The lessons live in this folder's modules, one
module a part of the theory; ui/views/learn draws their figures. Nothing here imports gradio.

The course itself (the lessons in order, found by name, and their cache) is course.py: this module holds only what
a lesson is made of, so the lesson modules import it and course.py imports them, with no cycle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


ProgressFn = Callable[[float, str], None]


@dataclass(frozen=True)
class Question:
    """What the reader answers before the reveal. choices: the options (one is the measured answer); empty for a
    number to guess, in `unit`."""

    prompt: str
    choices: tuple[str, ...] = ()
    unit: str = ""

    @property
    def numeric(self) -> bool:
        return not self.choices


@dataclass
class Measured:
    """A lesson computed on one model.

    answer: the measured value the question asks for (a number; for a choice question, the right choice's text).
    answer_text: the answer in one or two sentences, with its number; why: one sentence on why it is so, measured
    (where the model differs from the textbook, why it does). alt: the figure's one text line, with its main number.
    values: what the figure draws (arrays, numbers, labels). link: the state "try it" opens (ui.links.make's
    fields: tab, and any of layer, head, text; the tab's settings; "show", the elem_id of the tab's figure that
    holds the lesson's subject, which "try it" computes). note: a sentence when the model lacks the feature and the lesson
    measured another model (which, and why).
    """

    answer: float | str
    answer_text: str
    why: str
    alt: str
    values: dict[str, Any] = field(default_factory=dict)
    link: dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class Lesson:
    """One lesson. measure(model, progress) → Measured, on a loaded core model (with its tokenizer)."""

    name: str
    title: str
    text: str
    question: Question
    measure: Callable[[Any, ProgressFn | None], Measured]
    text_sample: str = ""  # the ready-made text the measurement reads, shown under the figure


# the Generate tab's settings when a lesson opens it: the lesson's text as it is (no chat template), continued
# greedily for a few tokens, so it lands computed in seconds and the same every time
TRY_GENERATE = {"chat": False, "max_new_tokens": 24, "temperature": 0.0}


def generate_link(model, text: str, show: str) -> dict:
    """The state a lesson's "Try it" opens in the Generate tab: its text and TRY_GENERATE, generated there, and
    `show`, the Generate tab's figure that holds the lesson's subject, computed after; only opened (compute: False)
    on a model that writes no next token, whose reason the tab shows."""
    from ui.services.generation import generation_reason

    link = {"tab": "generate", "text": text, "settings": dict(TRY_GENERATE), "show": show}
    if generation_reason(model):
        link["compute"] = False
    return link


def read_guess(question: Question, guess) -> tuple[float | str | None, str]:
    """The reader's guess as the question takes it, and a note when it cannot be read (never an error: the reveal
    works with or without a guess). Empty → (None, "")."""
    if guess is None or (isinstance(guess, str) and not guess.strip()):
        return None, ""
    if not question.numeric:
        if isinstance(guess, str) and guess in question.choices:
            return guess, ""
        return None, "That guess is not one of the choices, so it is left out."
    text = str(guess).strip().replace(",", "").replace("−", "-").replace("%", "")
    try:
        value = float(text)
    except ValueError:
        return None, "Your guess is not a number (write one like 12 or 0.5), so it is left out."
    if not math.isfinite(value):
        return None, "That guess is not a finite number, so it is left out."
    return value, ""


def number(value: float) -> str:
    """A measured number as the answer shows it: 3 significant figures, thousands separated."""
    if isinstance(value, str):
        return value
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(value)))))
    return f"{value:,.{digits}f}"


def reveal(lesson: Lesson, measured: Measured, guess) -> str:
    """The revealed answer in words (markdown, the project's own words and numbers: no user text but the guess's
    number or choice, which is one of our choices or a float): the guess beside the measured value, then why."""
    value, note = read_guess(lesson.question, guess)
    unit = f" {lesson.question.unit}" if lesson.question.unit else ""
    lines = []
    if isinstance(measured.answer, str) and lesson.question.numeric:  # nothing to measure here (note says why)
        lines.append(f"**Measured: nothing ({measured.answer}).** {measured.answer_text}")
    elif value is None:
        shown = f"“{measured.answer}”" if not lesson.question.numeric else f"{number(measured.answer)}{unit}"
        lines.append(f"**Measured: {shown}.** {measured.answer_text}")
    elif lesson.question.numeric:
        lines.append(f"**Your guess: {number(value)}{unit}; measured: {number(measured.answer)}{unit}.** "
                     f"{measured.answer_text}")
    else:
        verdict = "right" if value == measured.answer else "not this time"
        lines.append(f"**Your guess: “{value}”; measured: “{measured.answer}” ({verdict}).** {measured.answer_text}")
    lines.append(f"*Why:* {measured.why}")
    if note:
        lines.append(f"_{note}_")
    return "\n\n".join(lines)
