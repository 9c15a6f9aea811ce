"""Deep links: the page's state (model, text when short, tab, layer, head; the Patching tab's corrupted prompt) as
query parameters, and back.

    http://127.0.0.1:7860/?model=smollm2-135m-instruct&tab=attention&layer=18&head=6&text=The+keeper+lit+the+lamp.

A link is read when a page opens; every value that is unknown or out of range falls back to the default with a
sentence saying so, never an error. No gradio here: app.py reads the request and shows the sentences.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit, urlunsplit

from ui.services.learn import course as syllabus
from ui.services.checks import index_of, public_text

TABS = ("generate", "attention", "positions", "masks", "heads", "patching", "inside", "corpus", "learn", "lab")
TABS_WITH_HEADS = ("attention", "positions", "masks", "heads", "inside")  # the tabs with a layer and a head to set
TABS_WITH_LAYER = (*TABS_WITH_HEADS, "patching")
MAX_LINK_TEXT = 600  # characters; a longer text stays out of the link (links of a few kB break in some mailers)
KEYS = ("model", "tab", "layer", "head", "text", "corrupted", "token", "lesson")
MAX_LINK_TOKEN = 4096  # a token position beyond any text a link carries


@dataclass
class LinkState:
    model: str | None = None  # None: keep the page's model
    tab: str | None = None
    layer: int | None = None
    head: int | str | None = None  # "mean": the mean of the layer's heads; None: not given, or not usable
    text: str | None = None
    corrupted: str | None = None  # the Patching tab's second prompt
    token: int | None = None      # the Inside tab's token to follow
    lesson: str | None = None     # the Learn tab's lesson (its name); a link with one opens the Learn tab
    messages: list[str] = field(default_factory=list)

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.model, self.tab, self.layer, self.head, self.text, self.corrupted,
                                           self.token, self.lesson))


def _whole(name: str, raw: str, high: int, messages: list[str]) -> int | None:
    try:
        value = int(raw.strip())
    except ValueError:
        messages.append(f"The link's {name} {raw[:20]!r} is not a whole number; showing {name} 0.")
        return None
    if not 0 <= value <= high:
        messages.append(f"The link's {name} {value} is out of range for this model (0–{high}); showing {name} 0.")
        return None
    return value


def parse(params: Mapping[str, str], names: Sequence[str], shape: Callable[[str], tuple[int, int]],
          current_model: str) -> LinkState:
    """The state a link asks for. names: the models a link may open (installed or in memory: opening a link never
    makes the server fetch weights); shape(model) → (layers, heads), raising when the model cannot be loaded."""
    state = LinkState()
    messages = state.messages
    unknown = sorted(set(params) - set(KEYS) - {"__theme"})
    if unknown:
        messages.append(f"The link's {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not read "
                        f"(a link holds {', '.join(KEYS)}).")
    model = params.get("model")
    if model is not None:
        if model not in names:
            messages.append(f"The link's model {model[:60]!r} is not installed on this server (choose it in the model "
                            f"picker to fetch it); showing {current_model}.")
        else:
            state.model = model
    try:
        n_layers, n_heads = shape(state.model or current_model)
    except Exception as exc:  # noqa: BLE001 - a model that fails to load falls back, with its reason
        messages.append(public_text(f"The link's model {state.model} cannot be loaded ({exc}); showing {current_model}."))
        state.model = None
        n_layers, n_heads = shape(current_model)
    tab = params.get("tab")
    if tab is not None:
        if tab.strip().lower() in TABS:
            state.tab = tab.strip().lower()
        else:
            messages.append(f"The link's tab {tab[:30]!r} does not exist (tabs: {', '.join(TABS)}); "
                            "showing the Attention tab.")
    if params.get("layer") is not None:
        state.layer = _whole("layer", params["layer"], n_layers - 1, messages)
    if params.get("head") is not None:
        raw = params["head"]
        state.head = "mean" if raw.strip().lower() in ("mean", "mean of heads") else _whole("head", raw, n_heads - 1,
                                                                                            messages)
    if params.get("token") is not None:
        state.token = _whole("token", params["token"], MAX_LINK_TOKEN, messages)
    if params.get("lesson") is not None:
        state.lesson = _lesson(params["lesson"], messages)
        if state.lesson is not None and state.tab is None:
            state.tab = "learn"
    state.text = _text("text", params.get("text"), messages)
    state.corrupted = _text("corrupted prompt", params.get("corrupted"), messages)
    return state


def linked_tab(params: Mapping[str, str], tabs: Sequence[str]) -> str | None:
    """The tab a link opens on and sets (one of `tabs`, else the Attention tab), or None for a query that names
    nothing a link holds."""
    if not any(key in params for key in KEYS):
        return None
    tab = str(params.get("tab") or ("learn" if params.get("lesson") else "attention")).strip().lower()
    return tab if tab in tabs else "attention"


def _lesson(raw: str, messages: list[str]) -> str | None:
    try:
        return syllabus.find(raw).name
    except ValueError:
        messages.append(f"The link's lesson {raw[:40]!r} does not exist (lessons: {', '.join(syllabus.names())}); "
                        "showing the first.")
        return None


def _text(name: str, text: str | None, messages: list[str]) -> str | None:
    if text is None:
        return None
    if not text.strip():
        messages.append(f"The link's {name} is empty; showing the example text.")
    elif len(text) > MAX_LINK_TEXT:
        messages.append(f"The link's {name} has {len(text):,} characters; a link carries at most "
                        f"{MAX_LINK_TEXT}, so the example text is shown.")
    else:
        return text
    return None


def make(page_url: str, model: str, tab: str | None, layer, head, text: str | None,
         corrupted: str | None = None, token=None, lesson: str | None = None) -> tuple[str, str]:
    """A link to `page_url` (its own query dropped) with this state, and a note on what it leaves out."""
    params: dict[str, str] = {"model": model}
    if tab in TABS:
        params["tab"] = tab
    if index_of(layer) is not None and tab in TABS_WITH_LAYER:  # a field that holds no whole number is left out
        params["layer"] = str(index_of(layer))
    if head in ("mean", "mean of heads") and tab in TABS_WITH_HEADS:
        params["head"] = "mean"
    elif index_of(head) is not None and tab in TABS_WITH_HEADS:
        params["head"] = str(index_of(head))
    if index_of(token) is not None and tab == "inside":
        params["token"] = str(index_of(token))
    if tab == "learn" and lesson:
        params["lesson"] = str(lesson)
    note = ""
    if text and len(text) <= MAX_LINK_TEXT:
        params["text"] = text
    elif text:
        note = (f"The text ({len(text):,} characters) is longer than a link carries ({MAX_LINK_TEXT}): whoever opens "
                "the link sees the example text.")
    if corrupted and len(corrupted) <= MAX_LINK_TEXT and tab == "patching":
        params["corrupted"] = corrupted
    elif corrupted and tab == "patching":
        note += (" " if note else "") + (f"The corrupted prompt is longer than a link carries ({MAX_LINK_TEXT}).")
    parts = urlsplit(page_url or "/")
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", urlencode(params), "")), note

