"""Long work (a sweep) in a worker thread that reports its progress, as an iterator the page follows: each report
is yielded as it comes, and closing the iterator (the page stopped, the client went away) stops the work at its
next report. HeavyJobs holds the server to one long job per session at a time."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ui.services.checks import UserError


@dataclass
class JobUpdate:
    done: int
    total: int
    result: Any  # the work's return value once finished, else None
    seconds: float
    finished: bool = False


class JobStopped(Exception):
    """Raised inside the work at its next report once the reader went away."""


def stream_job(work: Callable[[Callable[[int, int], None]], Any], total: int, name: str) -> Iterator[JobUpdate]:
    """Run work(report) in a thread; report(done, total) yields an update here. Errors are raised to the reader."""
    updates: queue.Queue = queue.Queue()
    stopped = threading.Event()

    def report(done: int, of: int) -> None:
        if stopped.is_set():
            raise JobStopped
        updates.put(("progress", done, of))

    def run() -> None:
        try:
            updates.put(("done", work(report)))
        except JobStopped:
            pass
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            updates.put(("error", exc))

    started = time.perf_counter()
    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        yield JobUpdate(0, total, None, 0.0)
        while True:
            message = updates.get()
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
    user cannot fill the server's heavy slots; a second is refused with a message saying what is running."""

    def __init__(self):
        self._running: dict[str, str] = {}
        self._lock = threading.Lock()

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

    def running(self) -> dict[str, str]:
        with self._lock:
            return dict(self._running)
