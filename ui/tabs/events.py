"""How every tab's events run: their concurrency groups, errors in words (never a traceback in the page), every
input checked with its field's name, and `handler`, which turns a view function into an event function.

A view (ui/views) is `view(services, *inputs, previous=None, progress=None)`: plain values in, figures and
notes out. `handler(view, services, name)` gives the event function Gradio calls: the same parameters after
`services` (their names are the API's), gr.Progress appended, errors turned into messages, and every figure
the view named (ui.views.export.named) sent with its download settings.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable

import gradio as gr
from gradio.components.plot import PlotData
from gradio.exceptions import InvalidPathError

from core.store import WeightsError
from ui.services.checks import UserError, public_text
from ui.plots.text import escaped
from ui.services.text import check_text_size
from ui.views import UNCHANGED, export

log = logging.getLogger(__name__)

ANALYSIS = "analysis"  # concurrency group of the short forward-pass events: one at a time on a small CPU
ANALYSIS_LIMIT = 1
ON_ANALYSIS = dict(concurrency_id=ANALYSIS, concurrency_limit=ANALYSIS_LIMIT)
HEAVY = "heavy"  # sweeps and integrated gradients: apart from the short events, so those never wait behind them
HEAVY_LIMIT = 2  # two sessions' long jobs at once; one per session (HeavyJobs), so one user cannot take both
ON_HEAVY = dict(concurrency_id=HEAVY, concurrency_limit=HEAVY_LIMIT)
FIRST = "first"  # a tab's first screen when it opens: cached for every visitor, computed once per model
ON_FIRST = dict(concurrency_id=FIRST, concurrency_limit=1)
GENERATE = "generate"
GENERATE_LIMIT = 8  # eight streams at once, their tokens taken in turn (services.turns: two computed at a time)
LAB = "lab"  # concurrency group of the training streams; the server-wide job cap is the Lab's own
MODEL_GROUPS = (ANALYSIS, HEAVY, GENERATE, FIRST)  # the events that run a model: a backend or ZeroGPU takes these


def message(text: str) -> str:
    """A message as the page shows it (a toast renders its text as HTML): no server paths, and whatever it quotes
    (a model name, a file name, the user's text) escaped, so it reads as typed and never becomes an element."""
    return escaped(public_text(text))


def _as_gradio_error(exc: Exception) -> gr.Error:
    if isinstance(exc, gr.Error):
        return exc
    if isinstance(exc, UserError):
        return gr.Error(message(str(exc)), print_exception=False)
    if isinstance(exc, WeightsError):
        return gr.Error(message(f"Model weights: {exc}"), print_exception=False)
    if isinstance(exc, MemoryError):
        return gr.Error("Out of memory: try a shorter text or a smaller window.", print_exception=False)
    log.exception("unexpected error in an app event")
    return gr.Error(
        f"Something went wrong ({type(exc).__name__}); the server log has the details.", print_exception=False
    )


def user_errors(fn):
    """Run an event function so that bad input becomes a clear message in the page, never a traceback."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen_wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every error becomes a message
                raise _as_gradio_error(exc) from None

        return gen_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every error becomes a message
            raise _as_gradio_error(exc) from None

    return wrapper


def progress_callback(progress: gr.Progress | None):
    """core.store reports (fraction, message); Gradio's bar takes the same two things."""
    if progress is None:
        return None

    def report(fraction: float, message: str) -> None:
        progress(min(max(float(fraction), 0.0), 1.0), desc=message)

    return report


def present(value):
    """A view's outputs as Gradio takes them: each figure the view named, with its modebar's image settings
    (PNG, SVG at slide size, that name)."""
    if isinstance(value, tuple):
        return tuple(present(v) for v in value)
    if value is UNCHANGED:
        return gr.skip()
    name = export.image_name(value) if hasattr(value, "layout") and hasattr(value, "to_json") else None
    return value if name is None else PlotData(type="plotly", plot=export.figure_json(value, name))


def handler(view: Callable, services, name: str, progress: bool = True, heavy: str | None = None) -> Callable:
    """The event function of `view(services, *inputs, ...)`, named `name` (Gradio's event name). heavy: what the
    view is, in words ("An ablation sweep"); the event then runs only while its session runs no other long job."""
    params = list(inspect.signature(view).parameters.values())[1:]
    params = [p for p in params if p.name not in ("progress", "data")]
    if progress:
        params.append(inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress()))
    if heavy:  # Gradio passes the request to a parameter annotated gr.Request; it is not an API input
        params.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                        annotation=gr.Request))
    signature = inspect.Signature(params)

    def arguments(args, kwargs) -> dict:
        bound = signature.bind(*args, **kwargs)  # Gradio passes gr.Progress in its place, positionally
        if progress:
            bound.arguments["progress"] = progress_callback(bound.arguments.get("progress"))
        return bound.arguments

    def held(values: dict):
        request = values.pop("request", None)
        return services.heavy.hold(session_of(request), heavy) if heavy else contextlib.nullcontext()

    if inspect.isgeneratorfunction(view):
        def event(*args, **kwargs):
            values = arguments(args, kwargs)
            with held(values):
                for value in view(services, **values):
                    yield present(value)
    else:
        def event(*args, **kwargs):
            values = arguments(args, kwargs)
            with held(values):
                return present(view(services, **values))

    event.__name__ = event.__qualname__ = name
    event.__signature__ = signature
    event.__annotations__ = {"request": gr.Request} if heavy else {}
    return user_errors(event)


def stays_behind(param: inspect.Parameter) -> bool:
    """A parameter that Gradio fills and no call sends (gr.Progress, gr.Request): such parameters come last, and an
    event run elsewhere (ui.backend.routing) takes their defaults."""
    return isinstance(param.default, gr.Progress) or param.annotation in (gr.Request, "gr.Request")


FIELDS_OK = "fields_ok"  # the parameter `gated` adds: whether the page's check of the fields passed


def gated(event: dict, ok: gr.State) -> dict:
    """The arguments of `event` (fn, inputs, outputs, …) run only while the State `ok` holds: otherwise every output
    keeps what it shows (gr.skip). The State is one more input, before gr.Progress / gr.Request; an API call sends no
    State and gets its default, True, so the endpoint checks and fails as before."""
    fn, inputs, n_outputs = event["fn"], as_list(event["inputs"]), len(as_list(event["outputs"]))
    params = list(inspect.signature(fn).parameters.values())
    at = next((i for i, p in enumerate(params) if stays_behind(p)), len(params))
    # a gr.Request without a default (Gradio fills it) after FIELDS_OK's default takes None as its default
    params[at:] = [p.replace(default=None) if p.default is inspect.Parameter.empty else p for p in params[at:]]
    params.insert(at, inspect.Parameter(FIELDS_OK, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=True))
    signature = inspect.Signature(params)
    own = inspect.signature(fn)
    kept = tuple(gr.skip() for _ in range(n_outputs)) if n_outputs != 1 else gr.skip()

    def split(args, kwargs) -> tuple[bool, tuple, dict]:
        bound = signature.bind(*args, **kwargs)
        fine = bound.arguments.pop(FIELDS_OK, True)
        # bound again to fn's own parameters, so what came positionally goes on positionally: with FIELDS_OK taken
        # out of `bound`, its .args would stop there and hand gr.Progress on as a keyword, which a function taking
        # (*values, progress) through *args (a tab's first screen, `opening`) does not accept
        again = own.bind(**bound.arguments)
        return fine is not False, again.args, again.kwargs

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            fine, args, kwargs = split(args, kwargs)
            if not fine:
                yield kept
                return
            yield from fn(*args, **kwargs)
    else:
        @functools.wraps(fn)
        def run(*args, **kwargs):
            fine, args, kwargs = split(args, kwargs)
            return fn(*args, **kwargs) if fine else kept

    run.__signature__ = signature
    return {**event, "fn": run, "inputs": [*inputs, ok]}


def as_list(components) -> list:
    """An event's inputs or outputs, given as one component, a list, or None, as a list."""
    if components is None:
        return []
    return list(components) if isinstance(components, (list, tuple)) else [components]


def opening(services, tab: str, event: dict, fresh: tuple[int, ...] = ()) -> dict:
    """The arguments of the event that shows a tab's result when it opens (its select, or a link to it).

    event: the tab's run (fn, inputs with the model picker first, outputs). While its inputs hold the values the
    page was built with, the result is computed once per model and shared by every session
    (services.first_views); otherwise (a link's text) the tab's own event runs on what is there. Once per page:
    a State remembers the model the tab was shown for (a model change resets it). A streaming event shows its
    finished result. fresh: the outputs that are a session's own (a kept capture's ticket, a file to download that
    expires), handed out as None rather than shared."""
    fn, inputs, outputs = event["fn"], event["inputs"], event["outputs"]
    defaults = [getattr(component, "value", None) for component in inputs[1:]]
    shown = gr.State(False)

    def first(was_shown, model_name, *rest):
        *values, progress = rest
        if was_shown:
            return (gr.skip(), *[gr.skip()] * len(outputs))
        if list(values) == defaults:
            model = services.models.get(model_name)
            result = services.first_views.get((tab, model_name, id(model)),
                                              lambda: final(fn(model_name, *values, progress=progress)))
        else:
            result = final(fn(model_name, *values, progress=progress))
        return (model_name, *[None if i in fresh else value for i, value in enumerate(result)])

    first.__signature__ = signature(["was_shown", "model_name"] + [f"input_{i}" for i in range(len(defaults))])
    first.__name__ = first.__qualname__ = f"first_{tab}"
    first = user_errors(first)
    return dict(fn=first, inputs=[shown, *inputs], outputs=[shown, *outputs], api_visibility="private", **ON_FIRST)


def final(result):
    """A streaming view's last update (its finished result); any other view's result as it is."""
    if not inspect.isgenerator(result):
        return result
    last = None
    for last in result:
        pass
    return last


def signature(names: list[str]) -> inspect.Signature:
    """Named positional parameters and gr.Progress last, as Gradio and the backends' routing read them, for a
    function that takes (*names, progress) through *args."""
    return inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names]
                             + [inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                  default=gr.Progress())])


def session_of(request) -> str:
    """Who a request comes from: its page session (gradio_client has one per Client too), else its host."""
    session = getattr(request, "session_hash", None)
    if session:
        return str(session)
    client = getattr(request, "client", None)
    return f"host {getattr(client, 'host', 'unknown')}"


# ---------------------------------------------------------------- every input answered in words


def checked_inputs(demo: gr.Blocks, text_cap: int) -> gr.Blocks:
    """Every input of the page, answered in words and logged in one line.

    Number fields pass their raw value to the handler, which checks it with ui.services.checks.check_range or
    check_float and names the field: Gradio's own rounding and bounds fail first otherwise, on "1e999", NaN
    or a string from the API, with an error that names nothing. Typed text is held to the cap of uploads. Any
    other component that refuses a value (a dropdown value not among its choices) says so with the field's
    label, without a traceback in the log."""
    for block in demo.blocks.values():
        if isinstance(block, (gr.Number, gr.Slider)):
            block.preprocess = _unchanged
        elif isinstance(block, gr.Textbox):
            block.preprocess = _capped(block, block.preprocess, text_cap)
        elif isinstance(block, gr.components.Component):
            block.preprocess = _refusing_in_words(block, block.preprocess)
    demo.preprocess_data = _uploads_only(demo.preprocess_data)
    return demo


NOT_UPLOADED = ("A file must be uploaded through the page's file field (or gradio_client's handle_file, which "
                "uploads it): this server reads no path of its own that a call names.")


def _uploads_only(preprocess_data):
    """Blocks.preprocess_data with Gradio's refusal of a file it never received (a call naming a server path)
    answered in words: Gradio refuses the path before any handler runs, and its own error reaches the caller as
    an error with no message."""
    @functools.wraps(preprocess_data)
    async def checked(*args, **kwargs):
        try:
            return await preprocess_data(*args, **kwargs)
        except InvalidPathError:
            log.info("refused a file that was not uploaded")
            raise gr.Error(NOT_UPLOADED, print_exception=False) from None

    return checked


def _unchanged(payload):
    return payload


def _label(block) -> str:
    return getattr(block, "label", None) or getattr(block, "elem_id", None) or type(block).__name__


def _capped(block, preprocess, cap: int):
    @functools.wraps(preprocess)
    def checked(payload):
        try:
            return check_text_size(_label(block), preprocess(payload), cap)
        except UserError as exc:
            log.info("refused a text for %s: over the cap", _label(block))
            raise gr.Error(message(str(exc)), print_exception=False) from None

    return checked


def _refusing_in_words(block, preprocess):
    label = _label(block)
    one_choice = isinstance(block, (gr.Dropdown, gr.Radio)) and not getattr(block, "multiselect", False)

    @functools.wraps(preprocess)
    def checked(payload):
        if one_choice and isinstance(payload, (list, tuple, dict, set)):
            log.info("refused a %s for %s: one choice expected", type(payload).__name__, label)
            raise gr.Error(message(f"{label}: choose one value, not a {type(payload).__name__}."),
                           print_exception=False)
        try:
            return preprocess(payload)
        except Exception as exc:  # noqa: BLE001 - a refused value is the user's error, not the server's
            text = public_text(str(exc).strip('"') or type(exc).__name__)
            if len(text) > 300:
                text = text[:300] + "…"
            log.info("refused a value for %s: %s", label, text[:200])
            raise gr.Error(escaped(f"{label}: {text}"), print_exception=False) from None

    return checked


# ---------------------------------------------------------------- several steps, as one event


class Steps:
    """Several event functions run as ONE event (what follows a model change: each tab's fields set to the new
    model's ranges, then each tab's first screen or cleared results; what a page does as it opens). The page's
    frontend walks every component it has updated on each status change of each event, so twenty small events
    cost the browser seconds where one costs a fraction. Steps run in the order added; a step reads the values
    the steps before it wrote (a tab's first screen reads the layer its fields were just set to); a step that
    fails says why in a warning and leaves its outputs as they were, so it takes no other step down. A step gets
    the request and the progress bar where its signature names them (`request`, `progress`), after its inputs."""

    def __init__(self, name: str):
        self.name = name
        self.steps: list[tuple[Callable, list, list]] = []
        self.wired = False

    def add(self, fn: Callable, inputs: list, outputs: list) -> None:
        if self.wired:
            raise RuntimeError(f"a step added to {self.name} after it was wired would never run")
        self.steps.append((fn, list(inputs), list(outputs)))

    def wire(self, trigger: Callable, **options):
        """trigger(fn, inputs, outputs, **options): an event listener (a change's .success, demo.load); the
        steps' inputs and outputs are the unions of theirs. Returns the dependency, to chain on."""
        self.wired = True
        inputs = list({id(c): c for _, ins, _ in self.steps for c in ins}.values())
        outputs = list({id(c): c for _, _, outs in self.steps for c in outs}.values())
        at = {id(c): i for i, c in enumerate(outputs)}
        extras = [[name for name in inspect.signature(fn).parameters if name in ("request", "progress")]
                  for fn, _, _ in self.steps]

        def steps(*args):
            """Each step in order; yields (the outputs so far, True) when done, and while a streaming step (a
            generator: Generate's continuation) runs, (its outputs alone, False) at each of its updates."""
            *values, request, progress = args
            given = {"request": request, "progress": progress}
            current = {id(c): v for c, v in zip(inputs, values)}
            written = [gr.skip()] * len(outputs)
            for (fn, ins, outs), names in zip(self.steps, extras):
                try:
                    result = fn(*[current[id(c)] for c in ins], *[given[name] for name in names])
                    if inspect.isgenerator(result):
                        last = None
                        for last in result:
                            partial = [gr.skip()] * len(outputs)
                            for component, value in zip(outs, [last] if len(outs) == 1 else list(last)):
                                partial[at[id(component)]] = value
                            yield partial, False
                        result = last
                except gr.Error as exc:
                    gr.Warning(exc.message)
                    continue
                for component, value in zip(outs, [result] if len(outs) == 1 else list(result)):
                    written[at[id(component)]] = merged(written[at[id(component)]], value)
                    if id(component) in current and has_value(value):
                        current[id(component)] = new_value(value)
            yield written, True

        def sent(written):
            # a component returned as an update becomes the same update as a dict: it may travel to a backend
            written = [as_update(value) if isinstance(value, gr.components.Component) else value
                       for value in written]
            return written if len(outputs) > 1 else written[0]

        if any(inspect.isgeneratorfunction(fn) for fn, _, _ in self.steps):
            def run(*args):   # a streaming step's updates reach the page as they come
                for written, _ in steps(*args):
                    yield sent(written)
        else:
            def run(*args):
                return sent(next(written for written, done in steps(*args) if done))

        names = [f"input_{i}" for i in range(len(inputs))]
        run.__signature__ = inspect.Signature(
            [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names]
            + [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request),
               inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress())])
        run.__annotations__ = {"request": gr.Request}
        run.__name__ = run.__qualname__ = self.name
        run.steps = self.steps  # (fn, inputs, outputs) each, for a test to read
        return trigger(run, inputs, outputs, api_visibility="private", **options)


def is_update(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update"


def has_value(value) -> bool:
    if is_update(value):
        return "value" in value
    if isinstance(value, gr.components.Component):
        return "value" in value.constructor_args
    return True


def new_value(value):
    if is_update(value):
        return value["value"]
    if isinstance(value, gr.components.Component):
        return value.constructor_args["value"]
    return value


def merged(before, after):
    """Two steps' updates of one component: the later's where it says something, the earlier's where it skips
    (fields limits set to a new model's ranges keep their new labels when a first screen then sets their values)."""
    if is_update(after) and len(after) == 1:  # gr.skip()
        return before
    if is_update(before) and len(before) == 1:
        return after
    if is_update(before) or isinstance(before, gr.components.Component):
        return {**as_update(before), **as_update(after)}
    return after


def as_update(value) -> dict:
    if is_update(value):
        return value
    if isinstance(value, gr.components.Component):
        return {"__type__": "update", **value.constructor_args}
    return {"__type__": "update", "value": value}
