"""The course: every lesson in order (ui/services/learn's modules, one a part of the theory), found by its name,
and the cache that computes each lesson once per model for every visitor."""

from __future__ import annotations

from ui.services.checks import UserError
from ui.services.kept import FirstViews
from ui.services.learn import Lesson, Measured, ProgressFn
from ui.services.learn import attention, block, composition, efficient, evidence, generation, positions, sinks

LESSON_CACHE = 64  # lessons kept server-wide (14 lessons × a few models); each holds a few small arrays


def lessons() -> tuple[Lesson, ...]:
    """Every lesson, in the course's order."""
    return (*attention.LESSONS, *positions.LESSONS, *block.LESSONS, *generation.LESSONS, *efficient.LESSONS,
            *sinks.LESSONS, *evidence.LESSONS, *composition.LESSONS)


def names() -> list[str]:
    return [lesson.name for lesson in lessons()]


def find(name) -> Lesson:
    """The lesson called `name`, or a UserError listing the names."""
    for lesson in lessons():
        if isinstance(name, str) and lesson.name == name.strip().lower():
            return lesson
    shown = repr(name[:40]) if isinstance(name, str) else f"a {type(name).__name__}"
    raise UserError(f"There is no lesson {shown}; the lessons are {', '.join(names())}.")


def position(name: str) -> tuple[int, int]:
    """(the lesson's number from 1, how many lessons)."""
    all_names = names()
    return all_names.index(find(name).name) + 1, len(all_names)


class LessonCache:
    """Lessons computed once per model (by name and the model object's id: a reloaded model is computed afresh),
    for every visitor; two sessions opening one lesson at once compute it once."""

    def __init__(self, size: int = LESSON_CACHE):
        self._views = FirstViews(size)

    def __len__(self) -> int:
        return len(self._views)

    def get(self, model_name: str, model, lesson: Lesson, progress: ProgressFn | None = None) -> Measured:
        return self._views.get(("lesson", lesson.name, model_name, id(model)),
                               lambda: lesson.measure(model, progress))
