"""What sessions keep for reuse, server-wide, within one byte budget (AppSettings.kept_budget_bytes), and the
cheap tabs' first screens, computed once per model for every visitor."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict

class KeptStore:
    """What sessions keep for reuse, server-wide, within one byte budget: the Attention tab's float16 overview
    and the Generate tab's float16 attention rows, under a ticket per session, the least recently used dropped
    first. A session holds only its ticket (and the key of what it kept), so the budget bounds them all.
    Nothing kept refers to a model, so a model evicted from the ModelStore is freed; a dropped entry costs its
    session one more pass (or, for generation rows, the rows)."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, list] = OrderedDict()  # ticket → [key, value, nbytes]
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(entry[2] for entry in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, ticket: str, key: tuple, value, nbytes: int) -> bool:
        """Keep value under ticket (replacing what the ticket held); False when it alone exceeds the budget."""
        with self._lock:
            self._entries.pop(ticket, None)
            if nbytes > self.budget_bytes:
                return False
            self._entries[ticket] = [key, value, nbytes]
            self._evict()
            return True

    def grow(self, ticket: str, key: tuple, extra: int) -> bool:
        """Count `extra` more bytes for a kept value that grew; False (and the entry dropped) when it no
        longer fits the budget or is gone."""
        with self._lock:
            entry = self._entries.get(ticket)
            if entry is None or entry[0] != key:  # gone, or the ticket now holds something newer: leave it
                return False
            if entry[2] + extra > self.budget_bytes:
                del self._entries[ticket]
                return False
            entry[2] += extra
            self._entries.move_to_end(ticket)
            self._evict()
            return True

    def get(self, ticket: str, key: tuple):
        """The value kept under this ticket for this key, or None."""
        with self._lock:
            entry = self._entries.get(ticket)
            if entry is None or entry[0] != key:
                return None
            self._entries.move_to_end(ticket)
            return entry[1]

    def _evict(self) -> None:
        total = sum(entry[2] for entry in self._entries.values())
        while total > self.budget_bytes:
            _, (_, _, dropped) = self._entries.popitem(last=False)
            total -= dropped


class FirstViews:
    """The results a cheap tab shows when it opens on its default inputs, computed once per model and shared by
    every session, so a public Space does not recompute the same first screen for each visitor. Keyed by what
    the caller names (tab, model name, the model object's id: a reloaded model is computed afresh); at most
    `size` entries, the least recently used dropped. Two sessions opening the same tab at once compute it once:
    the second waits for the first."""

    def __init__(self, size: int = 16):
        self.size = size
        self._entries: OrderedDict[tuple, object] = OrderedDict()
        self._computing: dict[tuple, threading.Lock] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple, compute):
        """The value under key, computed by compute() the first time (an error is raised and nothing kept)."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            computing = self._computing.setdefault(key, threading.Lock())
        with computing:
            with self._lock:
                if key in self._entries:
                    return self._entries[key]
            try:
                value = compute()
            finally:
                with self._lock:
                    self._computing.pop(key, None)
            with self._lock:
                self._entries[key] = value
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
            return value


def new_ticket() -> str:
    return uuid.uuid4().hex
