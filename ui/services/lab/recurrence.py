"""Recurrence beside attention, as the project ships it (assets/recurrence, made by core/lab/recurrent): a GRU and
the Lab's small attention decoder with matched parameter counts, trained on the same copy task. The Lab's first
screen and the course's first lesson read it; the findings are computed here from the saved numbers, so both say
the same. Never imports gradio."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from core.lab import recurrent as engine
from core.lab.recurrent import ModelResult, Recurrence
from ui.services.lab.saved import read_result

SAVED = Path(__file__).resolve().parents[3] / "assets" / "recurrence"
SAVED_COMMAND = "python -m core.lab.recurrent --threads 1 --out assets/recurrence"
# the course's first lesson, before Reveal: what the saved experiment is, without its numbers
LESSON_TEXT = ("The chain has a second price: what the end needs from an early token must survive every step between, "
               "and so must the gradient that trains it. The answer's words quote a GRU and an attention decoder of "
               "one size trained to copy in the Lab (accuracy by distance, gradient by distance, sequential steps); "
               "its figure is the timing above, and the Lab's first screen draws those two curves.")


@functools.lru_cache(maxsize=1)
def saved(folder: Path = SAVED) -> Recurrence | None:
    """The result the repository ships, made by SAVED_COMMAND; None when it is absent or unreadable."""
    return read_result(engine.load, folder, "recurrence")


@dataclass(frozen=True)
class Side:
    """One model's numbers as the page states them."""
    name: str
    parameters: int
    near: tuple[int, float]       # (the shortest distance, copy accuracy there)
    far: tuple[int, float]        # (the longest distance, copy accuracy there)
    reach: int                    # how far back the farthest input lies from the loss's position
    gradient_far: float           # ‖∂loss/∂x‖ at the farthest input over the loss's own position, trained
    gradient_far_untrained: float
    sequential_steps: int
    step_ms: float                # median training step


def side(model: ModelResult) -> Side:
    near, far = min(model.accuracy), max(model.accuracy)
    return Side(model.name, model.parameters, (near, model.accuracy[near]), (far, model.accuracy[far]),
                len(model.gradient_trained) - 1,
                model.gradient_trained[-1] / model.gradient_trained[0],
                model.gradient_untrained[-1] / model.gradient_untrained[0],
                model.sequential_steps, model.median_step_ms)


def sides(result: Recurrence) -> dict[str, Side]:
    """{"attention": …, "GRU": …}."""
    return {m.name: side(m) for m in result.models}


def caveat(result: Recurrence) -> str:
    c = result.config
    threads = f"{result.threads} thread{'s' if result.threads != 1 else ''}"
    return (f"One seed ({c.seed}) on one task (copying {c.lengths[0]} to {c.lengths[1]} letters and digits), "
            f"{c.steps:,} steps of "
            f"{c.batch} texts each, {threads}, {result.date}: another seed or task moves the numbers.")


def finding(result: Recurrence) -> str:
    """The result in words, every number read from it."""
    s = sides(result)
    a, g = s["attention"], s["GRU"]
    after = (f"after training the GRU's gates pass {g.gradient_far:.1e} of it (the decoder {a.gradient_far:.1e})"
             + (", yet its accuracy still falls with the distance" if g.far[1] < g.near[1] else ""))
    return (f"With {a.parameters:,} and {g.parameters:,} parameters, trained on the same batches, the attention "
            f"decoder copies {a.near[1]:.0%} of the symbols at distance {a.near[0]} and {a.far[1]:.0%} at "
            f"{a.far[0]}; the GRU {g.near[1]:.0%} and {g.far[1]:.0%} at the same distances. Before training, the gradient of the last "
            f"copy's loss that reaches the first token, {a.reach} places back, is {a.gradient_far_untrained:.1e} of "
            f"what reaches the loss's own position in the decoder and {g.gradient_far_untrained:.1e} in the GRU, "
            f"which shrinks it at every step of the chain (the vanishing gradient); {after}. To read a text of "
            f"{result.longest_tokens} tokens the GRU runs {g.sequential_steps} steps one after another, the decoder "
            f"{a.sequential_steps} (one per layer, every position at once); a training step took "
            f"{a.step_ms:.1f} ms for the decoder and {g.step_ms:.1f} ms for the GRU (medians; the two alternate step by "
            "step, so the machine's load falls on both alike and their ratio is the comparison)."
            + (step_words(result) if g.step_ms <= a.step_ms else ""))


def step_words(result: Recurrence) -> str:
    """Why the GRU's step can be the faster one here, although its path is longer."""
    where = "one CPU thread" if result.threads == 1 else f"{result.threads} CPU threads"
    return (f" On {where} little runs side by side anyway, so the decoder's short path does not make its step "
            "faster at this size: the path pays where many positions can be computed at once (a GPU), and in "
            "what the model can learn.")


def lesson_words() -> str:
    """The course's first lesson on Reveal: beyond the time, what the saved experiment found."""
    result = saved()
    if result is None:
        return ("The Lab's recurrence experiment (a GRU beside a small attention decoder) is not saved in this copy, "
                "so its accuracy and gradients cannot be shown here.")
    return ("Time is not the only cost. In the Lab a GRU and a small attention decoder with matched parameter counts "
            f"learned the same copy task: {finding(result)} {caveat(result)}")


def lesson_values() -> dict | None:
    """The saved result's numbers the words above state, for the lesson's values."""
    result = saved()
    if result is None:
        return None
    return {name: vars(one) for name, one in sides(result).items()} | {"longest_tokens": result.longest_tokens}
