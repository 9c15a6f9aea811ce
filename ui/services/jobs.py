"""Long work (a sweep) in a worker thread that reports its progress, as an iterator the page follows: each report
is yielded as it comes, and closing the iterator (the page stopped, the client went away) stops the work at its
next report. HeavyJobs holds the server to one long job per session at a time, and hands the allocator's free
memory back to the system when each one ends. Turns lets many streams (generations) take their steps in turn."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ui import memory
from ui.services.checks import UserError
from ui.settings import CORPUS_SECONDS_SETTING


@dataclass
class JobUpdate:
    done: int
    total: int
    result: Any  # the work's return value once finished, else None
    seconds: float
    finished: bool = False


class JobStopped(Exception):
    """Raised inside the work at its next report once the reader went away."""


ABANDONED_S = 10.0  # updates waiting this long unread: the reader is gone (a page that left without closing us)


class JobCapped(Exception):
    """Raised inside the work at its first report past the job's time cap."""


def capped_words(max_seconds: float, smaller: str = "fewer items") -> str:
    return (f"This job passed the server's time cap of {max_seconds:g} s per job and was stopped: ask for "
            f"{smaller} ({CORPUS_SECONDS_SETTING} sets the cap).")


@dataclass
class TimeCap:
    """A long job's stop(): the caller's stop, or the job's time cap passed (None: no cap), the one rule of the
    corpus jobs and the extrapolation run. The job asks it between its steps (a corpus job also between a batch's
    layers) and, once past the cap, stops there keeping what it finished. clock: seconds, time.monotonic unless a
    test gives a fake one that ticks."""
    max_seconds: float | None
    stop: Callable[[], bool] | None = None
    clock: Callable[[], float] = time.monotonic
    started: float | None = None
    hit: bool = False

    def __post_init__(self):
        if self.started is None:
            self.started = self.clock()

    def __call__(self) -> bool:
        if self.stop is not None and self.stop():
            return True
        if self.max_seconds is not None and self.clock() - self.started > self.max_seconds:
            self.hit = True
        return self.hit

    def words(self, finished: str = "items") -> str:
        """What the page says once the job ends: stopped at the cap (the `finished` shown are those done by then),
        or past it (one step ran beyond the cap before it was asked again), else nothing."""
        if self.max_seconds is None:
            return ""
        if self.hit:
            return (f"**Stopped at the time cap** of {self.max_seconds:g} s per job: the figures show the {finished} "
                    f"finished by then. {CORPUS_SECONDS_SETTING} sets the cap.")
        took = self.clock() - self.started
        if took > self.max_seconds:
            return (f"**Past the time cap** of {self.max_seconds:g} s per job: its last step ended at {took:,.0f} s, "
                    "before the cap was asked again; the figures show all of it. "
                    f"{CORPUS_SECONDS_SETTING} sets the cap.")
        return ""


def stream_job(work: Callable[[Callable[[int, int], None]], Any], total: int, name: str,
               abandoned_s: float = ABANDONED_S, max_seconds: float | None = None,
               smaller: str = "fewer items") -> Iterator[JobUpdate]:
    """Run work(report) in a thread; report(done, total) yields an update here. Errors are raised to the reader.
    The work stops at its next report once the iterator is closed, or once its updates have gone unread for
    `abandoned_s` (a client that disconnected may leave the iterator suspended rather than closed); and at its
    first report past `max_seconds`, when the reader gets a UserError saying so (for work with no partial result
    worth showing: a corpus job that has one asks its own stop() instead, ui.services.corpus.over.TimeCap); `smaller`
    names what to ask for instead."""
    updates: queue.Queue = queue.Queue()
    stopped = threading.Event()
    last_read = [time.monotonic()]
    deadline = None if max_seconds is None else time.monotonic() + max_seconds

    def report(done: int, of: int) -> None:
        if stopped.is_set() or (not updates.empty() and time.monotonic() - last_read[0] > abandoned_s):
            raise JobStopped
        if deadline is not None and time.monotonic() > deadline:
            raise JobCapped
        updates.put(("progress", done, of))

    def run() -> None:
        try:
            updates.put(("done", work(report)))
        except JobStopped:
            pass
        except JobCapped:
            updates.put(("error", UserError(capped_words(max_seconds, smaller))))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            updates.put(("error", exc))

    started = time.perf_counter()
    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        yield JobUpdate(0, total, None, 0.0)
        while True:
            message = updates.get()
            last_read[0] = time.monotonic()
            seconds = time.perf_counter() - started
            if message[0] == "progress":
                yield JobUpdate(message[1], message[2], None, seconds)
            elif message[0] == "done":
                yield JobUpdate(total, total, message[1], seconds, finished=True)
                return
            else:
                raise message[1]
    finally:
        stopped.set()


class HeavyJobs:
    """The long jobs running now (sweeps, integrated gradients), by session. A session runs one at a time, so one
    user cannot fill the server's heavy slots; a second is refused with a message saying what is running.
    release() runs when a job ends, however it ends: by default ui.memory.trim, which returns the memory the job's
    activations held (freed, but still resident in the allocator's arenas) to the system."""

    def __init__(self, release: Callable[[], object] = memory.trim):
        self._running: dict[str, str] = {}
        self._lock = threading.Lock()
        self._release = release

    @contextmanager
    def hold(self, session: str, what: str):
        with self._lock:
            if session in self._running:
                raise UserError(f"{what} was not started: this page is already running {self._running[session]}. "
                                "One long job per session at a time: wait for it to finish, or stop it first.")
            self._running[session] = what
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(session, None)
            self._release()

    def running(self) -> dict[str, str]:
        with self._lock:
            return dict(self._running)


class Turns:
    """The steps of long streams (a generation's tokens) taken in turn: at most `slots` steps run at once, and a
    stream waiting for a slot gets one before any stream that asked after it (first come, first served), so one
    that has just finished a step cannot take its slot again ahead of one that waited. Eight generations then
    each write a token in turn, instead of two running to their end while six wait for a first token."""

    def __init__(self, slots: int):
        self.slots = slots
        self._free = slots
        self._waiting: deque[object] = deque()
        self._changed = threading.Condition()

    def waiting(self) -> int:
        """How many streams are waiting for a slot now."""
        with self._changed:
            return len(self._waiting)

    @contextmanager
    def turn(self):
        me = object()
        with self._changed:
            self._waiting.append(me)
            while self._waiting[0] is not me or self._free == 0:
                self._changed.wait()
            self._waiting.popleft()
            self._free -= 1
            self._changed.notify_all()  # the next in line may take another free slot
        try:
            yield
        finally:
            with self._changed:
                self._free += 1
                self._changed.notify_all()

