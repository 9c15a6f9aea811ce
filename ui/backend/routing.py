"""Where the model work runs: one seam between the page and the models, two backends behind it (this module
and ui/backend/ray_serve.py).

The page's model work is the set of events that run a model: those of the concurrency groups ANALYSIS and
GENERATE, and the Generate tab's step view and export, which read the attention rows kept where the generation
ran. `model_events(demo)` names them the same way on every copy of the page (index in demo.fns and name), so
a page built elsewhere from the same code can run the event a front asks for.

- `InProcess` (the default, `python app.py`): the page's own functions, in this process. Nothing is replaced.
- `ui.backend.ray_serve.RayBackend` (`python app.py --backend ray`): each model's events run on the replicas of one
  Ray Serve deployment, each replica a page of its own that is built and never launched. The front keeps the
  per-session state (gr.State values, which travel with each call) and models without weights (meta device:
  config and tokenizer, for the page's labels and limits).

`route(demo, backend)` replaces each model event's function with a proxy that sends the event's key, its
model's name and its arguments to the backend. gr.Progress and gr.Request cannot travel and are dropped (they
are the functions' trailing parameters); generators stream. What comes back is packed for the trip by `reply`
and unpacked by `received`: a gr.Error's message is raised again in the front, and a file an export wrote on a
replica comes back as its bytes and is written under the front's temporary folder.

A backend that runs corpus jobs in chunks (one with `corpus_chunks(model_name)`, as RayBackend has) gets the
Across texts tab's jobs differently: the page's own function runs here, on the front, where the upload and the
session's kept result are, and its measuring is sent to the backend as token ids (ui.services.corpus.chunked
.chunks_on): chunk by chunk (an ablation capped at its first texts before it is split), or for a head's top
examples and its query/key plane in one call each; the tab's cell clicks, which redraw that kept result, and its
Export, which reads the job saved here, stay here too.

Kept data (the KeptStore of ui.services: the Attention tab's captures, a generation's rows) stays where it was
computed. A session's calls go to the same replica where the backend can arrange it; where not, a ticket the
replica does not hold is a cache miss, which the services already handle (a capture is recomputed; a generation's rows are
reported as dropped).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import gradio as gr

from ui.services.corpus.chunked import chunks_on
from ui.tabs.events import MODEL_GROUPS, stays_behind, user_errors
from ui.views import export

TRACE_READERS = ("generation_step", "export_generation")  # read the rows a generation kept where it ran
CHUNKED = ("corpus_heads", "corpus_attribution", "corpus_patch", "corpus_ablation", "corpus_examples",
           "corpus_qk")  # corpus jobs run from here
ON_FRONT = ("corpus_cell",)  # redraws the result a chunked job kept on the front
PICKER_ID = "model-picker"  # elem_id of the model dropdown: its value names the model an event runs


@dataclass(frozen=True)
class ModelEvent:
    key: str  # "17:attention": the index in demo.fns and the event's name, equal on every copy of the page
    fn: Callable  # the page's own function
    generator: bool
    n_args: int  # arguments that travel: the inputs, without the trailing gr.Progress / gr.Request
    model_input: int | None  # position of the model dropdown among the inputs, if it is one
    file_outputs: tuple[int, ...]  # outputs that are gr.File: a path on the machine that ran the event


def model_events(demo: gr.Blocks) -> dict[str, ModelEvent]:
    """The page's model work, by key."""
    events = {}
    for index, block_fn in demo.fns.items():
        if block_fn.fn is None:
            continue
        if block_fn.concurrency_id not in MODEL_GROUPS and block_fn.name not in TRACE_READERS:
            continue
        key = f"{index}:{block_fn.api_name or block_fn.name}"
        model_input = next((i for i, block in enumerate(block_fn.inputs)
                            if getattr(block, "elem_id", None) == PICKER_ID), None)
        files = tuple(i for i, block in enumerate(block_fn.outputs) if isinstance(block, gr.File))
        events[key] = ModelEvent(key, block_fn.fn, inspect.isgeneratorfunction(block_fn.fn),
                                 travelling_args(block_fn.fn, key), model_input, files)
    return events


def travelling_args(fn: Callable, key: str) -> int:
    """How many leading parameters travel; the ones that cannot (gr.Progress, gr.Request) must come last, so
    that the function called elsewhere without them takes their defaults."""
    params = list(inspect.signature(fn).parameters.values())
    stays = [stays_behind(p) for p in params]
    n = stays.index(True) if True in stays else len(params)
    if any(not s for s in stays[n:]):
        raise TypeError(f"event {key}: gr.Progress / gr.Request must be the last parameters to run elsewhere")
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return -1  # *args: everything Gradio passes travels
    return n


class Backend(Protocol):
    """Runs the page's model events for the proxies that `route` installs."""

    def call(self, key: str, model_name: str, args: tuple, session: str | None) -> Any: ...

    def stream(self, key: str, model_name: str, args: tuple, session: str | None) -> Iterator: ...

    def close(self) -> None: ...


class InProcess:
    """The page's own functions, in this process: what `python app.py` runs. A page built with it needs no
    routing (app.main routes nothing); the tests route through it to check the proxies alone."""

    def __init__(self, demo: gr.Blocks):
        self.events = model_events(demo)

    def call(self, key: str, model_name: str, args: tuple, session: str | None = None) -> Any:
        return self.events[key].fn(*args)

    def stream(self, key: str, model_name: str, args: tuple, session: str | None = None) -> Iterator:
        yield from self.events[key].fn(*args)

    def close(self) -> None:
        pass


def route(demo: gr.Blocks, backend: Backend, default_model: str) -> list[str]:
    """Send every model event of the page to `backend`; returns their keys. Events without a model dropdown
    among their inputs run the model their state names (a generation trace's), else the default model. A backend
    with corpus_chunks gets the corpus jobs in chunks from here (chunked_here), and their cell redraws stay here."""
    routed = []
    limit = getattr(backend, "front_concurrency_limit", "unchanged")  # where the backend queues work itself
    chunking = hasattr(backend, "corpus_chunks")
    for key, event in model_events(demo).items():
        block_fn = demo.fns[int(key.split(":", 1)[0])]
        if limit != "unchanged":
            block_fn.concurrency_limit = limit
        if chunking and block_fn.name in ON_FRONT:
            continue
        if chunking and block_fn.name in CHUNKED and event.generator:
            block_fn.fn = chunked_here(event, backend, default_model)
        else:
            block_fn.fn = user_errors(proxy(event, backend, default_model))  # a dead replica is a message too
        routed.append(key)
    return routed


def proxy(event: ModelEvent, backend: Backend, default_model: str) -> Callable:
    """A function with the event function's signature (so Gradio passes the same arguments) that runs it
    through the backend."""

    def travelling(args: tuple) -> tuple[tuple, str, str | None]:
        args = args if event.n_args < 0 else args[:event.n_args]
        return args, model_named(event, args, default_model), session_id()

    if event.generator:
        @functools.wraps(event.fn)
        def streaming(*args):
            args, model_name, session = travelling(args)
            yield from backend.stream(event.key, model_name, args, session)

        return streaming

    @functools.wraps(event.fn)
    def calling(*args):
        args, model_name, session = travelling(args)
        return backend.call(event.key, model_name, args, session)

    return calling


def chunked_here(event: ModelEvent, backend: Backend, default_model: str) -> Callable:
    """The page's own corpus job run here, its measuring sent to the backend in chunks: each step of the
    function's generator runs inside chunks_on (a context variable, set again for every step because Gradio
    may take each step in another thread's copy of the context)."""

    @functools.wraps(event.fn)
    def running(*args, **kwargs):
        runner = backend.corpus_chunks(model_named(event, args, default_model))
        steps = event.fn(*args, **kwargs)
        try:
            while True:
                with chunks_on(runner):
                    try:
                        value = next(steps)
                    except StopIteration:
                        return
                yield value
        finally:
            with chunks_on(runner):
                steps.close()  # the page's Stop: the job's chunks under way are cancelled

    return user_errors(running)  # a cluster that cannot deploy the model is a message too


def model_named(event: ModelEvent, args: tuple, default_model: str) -> str:
    if event.model_input is not None and event.model_input < len(args) and args[event.model_input]:
        return str(args[event.model_input])
    for value in args:  # a generation trace says which model wrote it
        name = getattr(value, "model_name", None)
        if isinstance(name, str) and name:
            return name
    return default_model


def session_id() -> str | None:
    """The browser session of the event being processed (Gradio's session hash), for replica affinity."""
    request = gr.context.LocalContext.request.get(None)
    return getattr(request, "session_hash", None) if request is not None else None


# ---------------------------------------------------------------- the trip: what a replica sends back


@dataclass(frozen=True)
class ShippedFile:
    name: str
    data: bytes


@dataclass(frozen=True)
class RemoteError:
    message: str
    title: str = "Error"


def reply(event: ModelEvent, value: Any) -> Any:
    """An event's output made to travel: files as bytes (the path exists only where the event ran)."""
    if not event.file_outputs:
        return value
    values = list(value) if isinstance(value, (tuple, list)) else [value]
    for i in event.file_outputs:
        path = values[i] if i < len(values) else None
        if isinstance(path, (str, Path)) and Path(path).is_file():
            values[i] = ShippedFile(Path(path).name, Path(path).read_bytes())
    return tuple(values) if isinstance(value, (tuple, list)) else values[0]


def run_event(events: dict[str, ModelEvent], key: str, args: tuple) -> Any:
    """Run one event as a replica does: its output packed by `reply`, its gr.Error as a RemoteError."""
    event = known_event(events, key)
    try:
        return reply(event, event.fn(*args))
    except gr.Error as exc:
        return RemoteError(str(exc.message), exc.title or "Error")


def stream_event(events: dict[str, ModelEvent], key: str, args: tuple) -> Iterator:
    event = known_event(events, key)
    try:
        for value in event.fn(*args):
            yield reply(event, value)
    except gr.Error as exc:
        yield RemoteError(str(exc.message), exc.title or "Error")


def known_event(events: dict[str, ModelEvent], key: str) -> ModelEvent:
    if key not in events:
        raise KeyError(f"no model event {key!r} on this replica's page: the front and the replicas must run the "
                       "same code")
    return events[key]


def received(value: Any, folder: Path | None = None) -> Any:
    """A replica's reply as the front's event returns it: gr.Error raised again, files written here."""
    if isinstance(value, RemoteError):
        raise gr.Error(value.message, title=value.title, print_exception=False)
    if isinstance(value, ShippedFile):
        return str(write_shipped(value, folder))
    if isinstance(value, tuple) and any(isinstance(v, ShippedFile) for v in value):
        return tuple(str(write_shipped(v, folder)) if isinstance(v, ShippedFile) else v for v in value)
    return value


def write_shipped(shipped: ShippedFile, folder: Path | None) -> Path:
    """A replica's file written on the front, where Gradio serves it and the hourly sweep of exports removes it."""
    return export.write(shipped.data, Path(shipped.name).name, root=folder)

