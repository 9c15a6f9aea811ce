"""Saved Lab runs on a shared server (a Space, or `python app.py --public`): private to the session that saved
them. Each is stored under weights/.private/TOKEN/NAME (a hidden folder: the weight store lists none of it),
known to the model picker by an alias that only its session is shown ("NAME (this page's run, abc123…)"), and
deleted `ttl_s` after it was saved. On a laptop none of this applies: runs go to weights/NAME for everyone."""

from __future__ import annotations

import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PRIVATE_DIR = ".private"


@dataclass
class PrivateRun:
    session: str
    name: str
    alias: str
    folder: Path
    saved_at: float


class PrivateRuns:
    """Every session's private runs, behind one lock; one object per server."""

    def __init__(self, root: Path, ttl_s: float):
        self.root, self.ttl_s = root / PRIVATE_DIR, ttl_s
        self._runs: dict[str, PrivateRun] = {}        # alias → run
        self._tokens: dict[str, str] = {}             # session → its folder's random token
        self.gone: set[str] = set()                   # aliases of runs deleted after ttl_s
        self._lock = threading.Lock()

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
        return run

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
        """Delete the runs saved more than ttl_s ago; returns their aliases."""
        now = time.time() if now is None else now
        with self._lock:
            old = [r for r in self._runs.values() if now - r.saved_at > self.ttl_s]
            for run in old:
                del self._runs[run.alias]
                self.gone.add(run.alias)
        for run in old:
            shutil.rmtree(run.folder, ignore_errors=True)
        return [r.alias for r in old]
