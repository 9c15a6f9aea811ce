"""Positions past the trained length, as the Lab runs it: core.lab.extrapolation in a background thread, followed by
the page, stoppable, and the saved result that the Lab's first screen shows. Plain Python; never imports gradio.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from core.lab import extrapolation as engine
from core.lab.extrapolation import Extrapolation, ExtrapolationConfig, KindResult
from ui.services.checks import UserError, check_range
from ui.services.jobs import TimeCap
from ui.services.lab.configs import POLL_S
from ui.services.lab.saved import read_result

SAVED = Path(__file__).resolve().parents[3] / "assets" / "extrapolation"
SAVED_COMMAND = "python -m core.lab.extrapolation --threads 1 --out assets/extrapolation"
KIND_WORDS = {
    "sinusoidal": "sinusoids added to the embeddings (eq. 4.1)",
    "learned": "a learned table added to the embeddings, one row per position",
    "rope": "rotary angles on q and k (eq. 6.2)",
    "alibi": "ALiBi: −m_h·(i − j) on the scores (eq. 6.3)",
    "relative": "T5's learned bias per bucket of distance (eq. 6.4)",
    "none": "nothing: the causal mask alone",
}
MIN_STEPS = 10
CHANCE = 1 / len(engine.lab_engine.SYMBOLS)  # a uniform guess among the symbols


@dataclass
class ExtrapolationJob:
    config: ExtrapolationConfig
    results: list[KindResult] = field(default_factory=list)
    kind: str = ""  # the kind training now
    step: int = 0
    error: str = ""
    stop_requested: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    cap: TimeCap | None = None  # the server's time cap per job (the corpus jobs' rule), asked before every step

    def run(self) -> None:
        stop = self.stop_requested.is_set
        if self.cap is not None:
            self.cap.stop = stop
            stop = self.cap
        try:
            for result in engine.extrapolation(self.config, stop, self.progress):
                self.results.append(result)
        except Exception as exc:  # noqa: BLE001 - the page shows the failure; the server log has the traceback
            logging.getLogger(__name__).exception("extrapolation run failed")
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()

    def progress(self, kind: str, step: int, steps: int) -> None:
        self.kind, self.step = kind, step

    @property
    def fraction(self) -> float:
        total = len(self.config.kinds) * self.config.steps
        return min(1.0, (len(self.results) * self.config.steps + (0 if self.done.is_set() else self.step)) / total)

    def result(self) -> Extrapolation:
        return Extrapolation(self.config, list(self.results), "", 0.0,
                             stopped=len(self.results) < len(self.config.kinds))


def make_config(kinds, steps, seed, max_steps: int) -> ExtrapolationConfig:
    """The config from the page's or the API's fields; what is wrong is named."""
    if isinstance(kinds, str):
        kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    if not isinstance(kinds, (list, tuple)) or not kinds:
        raise UserError(f"Pick at least one kind of position among {', '.join(engine.KINDS)}.")
    unknown = [k for k in kinds if k not in engine.KINDS]
    if unknown:
        raise UserError(f"Unknown kind(s) of position {', '.join(map(repr, unknown))}; the kinds are "
                        f"{', '.join(engine.KINDS)}.")
    steps, seed = check_range("Steps", steps, MIN_STEPS, max_steps), check_range("Seed", seed, 0, 2**31 - 1)
    ordered = tuple(k for k in engine.KINDS if k in kinds)  # the figures' order, whatever the order asked
    config = ExtrapolationConfig(kinds=ordered, steps=steps, seed=seed)
    config.check()
    return config


def run(config: ExtrapolationConfig, interval: float = POLL_S, max_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic) -> Iterator[ExtrapolationJob]:
    """Start the job in its own thread and yield it whenever it has moved, then once done. Closing the iterator
    (the page cancelled, or went away) stops the training before its next step; so does passing max_seconds (the
    corpus jobs' cap, TimeCap: the kinds finished by then are the result, and job.cap.words() says so)."""
    job = ExtrapolationJob(config, cap=TimeCap(max_seconds, clock=clock))
    thread = threading.Thread(target=job.run, name="extrapolation", daemon=True)
    thread.start()
    try:
        seen = None
        yield job
        while not job.done.wait(interval):
            now = (len(job.results), job.kind, job.step)
            if now != seen:
                seen = now
                yield job
        yield job
    finally:
        job.stop_requested.set()


@functools.lru_cache(maxsize=1)
def saved(folder: Path = SAVED) -> Extrapolation | None:
    """The result the repository ships, made by SAVED_COMMAND; None when it is absent or unreadable."""
    return read_result(engine.load, folder, "extrapolation")
