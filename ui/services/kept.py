"""What sessions keep for reuse, server-wide, within one byte budget (AppSettings.kept_budget_bytes), and the
cheap tabs' first screens, computed once per model for every visitor."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class KeptRef:
    """What a session's gr.State holds for a value kept in the KeptStore: its ticket and key, a few bytes. version
    changes with the value (a trace that grew), so Gradio, which compares a State's hash, sees a new value."""

    ticket: str
    key: tuple
    version: tuple = ()


def nbytes_of(value, seen: set | None = None) -> int:
    """The bytes a value holds in its tensors (numel × element size), numpy arrays and strings, found through
    dataclasses, dicts, lists, tuples and objects' attributes; each array counted once. Plain numbers and the
    containers themselves are left out: next to the arrays they are small."""
    seen = set() if seen is None else seen
    if isinstance(value, (str, bytes, bytearray)):  # counted wherever it appears: a caller can add them up too
        return len(value)
    if value is None or isinstance(value, (bool, int, float, complex)) or id(value) in seen:
        return 0
    seen.add(id(value))
    if hasattr(value, "element_size") and hasattr(value, "numel"):  # a torch tensor
        return value.numel() * value.element_size()
    if hasattr(value, "nbytes") and hasattr(value, "dtype"):  # a numpy array
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(nbytes_of(k, seen) + nbytes_of(v, seen) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return sum(nbytes_of(v, seen) for v in value)
    if dataclasses.is_dataclass(value):
        return sum(nbytes_of(getattr(value, f.name), seen) for f in dataclasses.fields(value))
    if hasattr(value, "__dict__"):
        return nbytes_of(vars(value), seen)
    return 0


def keeping(view: Callable, kept: KeptStore, key: tuple, param: str = "previous") -> Callable:
    """view(services, ..., previous=value) → (..., value) as a function whose `previous` is the KeptRef that a
    session's State holds: the view gets the kept value (None after a miss, so it recomputes) and the value it
    returns last is kept under the same ticket, the event returning its KeptRef. A generator view is kept at
    every yield. The view's signature stays, so its parameters still name the API's inputs."""

    def take(args, kwargs) -> tuple[tuple, dict, KeptRef | None]:
        bound = inspect.signature(view).bind(*args, **kwargs)
        ref = bound.arguments.get(param)
        if isinstance(ref, KeptRef):
            bound.arguments[param] = kept.find(ref)
        else:  # an API call sends no State: nothing kept yet
            ref, bound.arguments[param] = None, None
        return bound.args, bound.kwargs, ref

    def give(outputs, ref: KeptRef | None):
        *rest, value = outputs
        return (*rest, None if value is None else kept.keep(value, key, ref))

    if inspect.isgeneratorfunction(view):
        @functools.wraps(view)
        def kept_generator(*args, **kwargs):
            args, kwargs, ref = take(args, kwargs)
            for outputs in view(*args, **kwargs):
                outputs = give(outputs, ref)
                ref = outputs[-1] or ref  # every yield under the one ticket
                yield outputs
        return kept_generator

    @functools.wraps(view)
    def kept_view(*args, **kwargs):
        args, kwargs, ref = take(args, kwargs)
        return give(view(*args, **kwargs), ref)
    return kept_view


class KeptStore:
    """What sessions keep for reuse, server-wide, within one byte budget: the Attention tab's float16 overview,
    the Generate tab's trace with its float16 attention rows, the Heads tab's results, under a ticket per session
    and value, the least recently used dropped first. A session holds only its tickets (a KeptRef, or the key of
    what it kept), so the budget bounds them all.
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

    def keep(self, value, key: tuple, ref: KeptRef | None = None, version: tuple = ()) -> KeptRef:
        """Keep value under the ticket of `ref` (a new one when None), counted by nbytes_of; the KeptRef a
        session's State holds for it. A value over the whole budget is not kept: finding it is a miss."""
        ticket = ref.ticket if ref is not None else new_ticket()
        self.put(ticket, key, value, nbytes_of(value))
        return KeptRef(ticket, key, version)

    def find(self, ref: KeptRef | None):
        """The value `ref` names, or None: no ref, or the budget dropped it (the caller recomputes)."""
        return None if ref is None else self.get(ref.ticket, ref.key)

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
