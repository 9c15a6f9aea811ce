"""Saved Lab runs on a shared server (a Space, or `python app.py --public`): private to the session that saved
them. Each is stored under weights/.private/TOKEN/NAME (a hidden folder: the weight store lists none of it),
known to the model picker by an alias that only its session is shown ("NAME (this page's run, abc123…)"), and
deleted `ttl_s` after it was saved, on time, by a thread that sleeps until the next run is due (an idle server
keeps nothing longer); whoever listens (on_expire: the model store) then forgets the alias. On a laptop none of
this applies: runs go to weights/NAME for everyone."""

from __future__ import annotations

import logging
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PRIVATE_DIR = ".private"
log = logging.getLogger(__name__)


@dataclass
class PrivateRun:
    session: str
    name: str
    alias: str
    folder: Path
    saved_at: float


class PrivateRuns:
    """Every session's private runs, behind one lock; one object per server. The first run saved starts the
    expiry thread (a daemon; close() stops it)."""

    def __init__(self, root: Path, ttl_s: float):
        self.root, self.ttl_s = root / PRIVATE_DIR, ttl_s
        self._runs: dict[str, PrivateRun] = {}        # alias → run
        self._tokens: dict[str, str] = {}             # session → its folder's random token
        self.gone: set[str] = set()                   # aliases of runs deleted after ttl_s
        self.on_expire: list[Callable[[str], object]] = []  # called with each expired alias, its files gone
        self._held: dict[str, int] = {}               # session → its jobs under way (held(): none of its runs expires)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a run added, or close(): the expiry thread looks again
        self._expiry: threading.Thread | None = None
        self._closed = False

    def clear(self) -> None:
        """Remove what an earlier process left: its aliases died with it, so nothing can reach those folders."""
        shutil.rmtree(self.root, ignore_errors=True)

    def folder(self, session: str, name: str) -> Path:
        """Where this session's run NAME goes (not yet created)."""
        with self._lock:
            token = self._tokens.setdefault(session, secrets.token_hex(8))
        return self.root / token / name

    def taken(self, session: str, name: str) -> bool:
        self.expire()
        with self._lock:
            return any(r.session == session and r.name == name for r in self._runs.values())

    def add(self, session: str, name: str, folder: Path) -> PrivateRun:
        token = folder.parent.name
        run = PrivateRun(session, name, f"{name} (this page's run, {token[:6]}…{token[-4:]})", folder, time.time())
        with self._lock:
            self._runs[run.alias] = run
            if self._expiry is None and not self._closed:
                self._expiry = threading.Thread(target=self._expire_on_time, name="private-runs-expiry", daemon=True)
                self._expiry.start()
            self._changed.notify_all()
        return run

    @contextmanager
    def held(self, session: str) -> Iterator[None]:
        """While a job of `session` runs, none of its runs expires (a job still writing is never deleted under it,
        however long one item takes); when its last job ends, each of its runs' clocks starts again from then."""
        with self._lock:
            self._held[session] = self._held.get(session, 0) + 1
        try:
            yield
        finally:
            with self._changed:
                self._held[session] -= 1
                if not self._held[session]:
                    del self._held[session]
                    now = time.time()
                    for run in self._runs.values():
                        if run.session == session:
                            run.saved_at = max(run.saved_at, now)
                self._changed.notify_all()

    def _expire_on_time(self) -> None:
        """Sleep until the oldest run is due (or forever while there is none), then expire; until close()."""
        while True:
            with self._changed:
                if self._closed:
                    return
                due = min((r.saved_at + self.ttl_s for r in self._runs.values() if r.session not in self._held),
                          default=None)
                wait = None if due is None else due - time.time()
                if wait is None or wait > 0:
                    self._changed.wait(wait)
                    continue
            self.expire(now=max(time.time(), due))  # due itself, however the clock's sums round

    def close(self) -> None:
        """Stop the expiry thread (the runs stay where they are)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._expiry is not None:
            self._expiry.join()

    def choices(self, session: str | None) -> list[str]:
        """The aliases this session may see, oldest first."""
        self.expire()
        with self._lock:
            return [r.alias for r in sorted(self._runs.values(), key=lambda r: r.saved_at) if r.session == session]

    def resolve(self, alias: str) -> Path | None:
        """The folder of a private run's alias (None: not an alias, or its run has expired)."""
        self.expire()
        with self._lock:
            run = self._runs.get(alias)
        return None if run is None else run.folder

    def expire(self, now: float | None = None) -> list[str]:
        """Delete the runs saved ttl_s ago or earlier, then tell on_expire; returns their aliases."""
        now = time.time() if now is None else now
        with self._lock:
            old = [r for r in self._runs.values() if now - r.saved_at >= self.ttl_s and r.session not in self._held]
            for run in old:
                del self._runs[run.alias]
                self.gone.add(run.alias)
        for run in old:
            shutil.rmtree(run.folder, ignore_errors=True)
            for listener in self.on_expire:
                try:
                    listener(run.alias)
                except Exception:  # noqa: BLE001 - one listener's failure must not stop the expiry thread
                    log.exception("could not forget the expired run %s", run.alias)
        return [r.alias for r in old]
