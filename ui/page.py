"""The page: the model picker (with the link to share) and the card, closed, then the tabs; deep links read when a
page opens and written by its button; every input answered in words; on a ZeroGPU Space, the model work decorated
to run on the GPU. (Sending the model work to another backend is ui/backend's: app.main routes the built page.)"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

import gradio as gr

from ui import links, spaces
from ui.lookup import build_lookup
from ui.services.patching import IOI_PRESET
from ui.tabs import events
from ui.tabs import attention, generate, heads, inside, lab, masks, patching, picker as model_picker, positions
from ui.tabs.corpus import across
from ui.tabs.learn import course as learn_course
from ui.tabs.events import MODEL_GROUPS, ON_FIRST, Steps, checked_inputs, message, user_errors
from ui.tabs.widgets import SVG_BUTTON_JS, Tab, checked_pick

log = logging.getLogger(__name__)

TITLE = "The attention explorer"
LINK_JS = """(...args) => { args[args.length - 1] = window.location.href; return args; }"""  # the page's own URL
# the page's own query, to a tab's first opening only (its select as the page mounts, or as the link opens it); ""
# after that, when only its user can have opened it
FIRST_OPENING_JS = """(...args) => { const opened = (window.__tabsOpened ||= new Set());
  args[0] = opened.has("TAB") ? "" : window.location.search; opened.add("TAB"); return args; }"""
OPENS_ON = "attention"  # the tab selected as the page mounts, before a link moves the page to its own
OPENED_JS = "() => { window.__pageOpened = true; }"  # the link's chain is done (the browser tests wait on it)
COPY_JS = """(link) => { if (link && navigator.clipboard) navigator.clipboard.writeText(link).catch(() => {}); }"""
TYPICAL = {  # tab → (its button's words, the built-in corpus, the Across texts analysis run over it)
    # every head: the one patching site that takes IOI pairs of different token lengths
    "patching": (f"How typical is this? Patch every head, in this direction, over {across.DEFAULT_N} IOI pairs "
                 "(Across texts tab)", "IOI pairs", "patch"),
    "heads": (f"How typical is this? The induction score over {across.DEFAULT_N} induction texts made as the probe "
              "is (Across texts tab)", "induction texts", "heads"),
}
TAB_IDS = {"Generate": "generate", "Attention": "attention", "Positional encoding": "positions", "Masks": "masks",
           "Heads": "heads", "Patching": "patching", "Inside": "inside", "Across texts": "corpus", "Learn": "learn", "Lab": "lab"}


def build_page(services, default_model: str) -> gr.Blocks:
    """The whole page on `services` (ui.services.Services); the default model must be loadable. On a ZeroGPU
    Space the events that run a model are decorated with spaces.GPU; elsewhere nothing changes."""
    demo = checked_inputs(layout(services, default_model), services.settings.text_cap_bytes)
    decorated = spaces.on_gpu(demo, MODEL_GROUPS)
    if decorated:
        log.info("ZeroGPU: %d events run on the GPU", len(decorated))
    return demo


def layout(services, default_model: str) -> gr.Blocks:
    """The picker, the card and the tabs. A page opened with query parameters (ui/links.py) starts on that model,
    tab, layer and head."""
    initial = services.models.get(default_model)
    # uploaded files are deleted an hour after upload: a public Space must not collect users' texts
    with gr.Blocks(title=TITLE, analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(
            f"# {TITLE}\nA small Transformer written from scratch in PyTorch, loaded with real weights: "
            "look at its attention head by head, its positional encodings, what its masks do, and what each head "
            "does and whether it matters."
        )
        share = {}
        picker = model_picker.build(services.models, default_model, beside=lambda: share.update(share_controls()),
                                    private=services.lab.private_choices)
        current_tab = gr.State("attention")
        linked = gr.State(False)  # the page opens on a link's Attention view, not yet drawn
        query = gr.Textbox(visible=False)  # the page's query string, read by the tabs' openings
        with gr.Tabs(selected=OPENS_ON) as tabs:
            built, typical = {}, {}
            for label, name, module in (("Generate", "generate", generate), ("Attention", "attention", attention),
                                        ("Positional encoding", "positions", positions), ("Masks", "masks", masks),
                                        ("Heads", "heads", heads), ("Patching", "patching", patching),
                                        ("Inside", "inside", inside)):
                with gr.Tab(label, id=name) as tab_block:
                    built[name] = module.build(services, picker, initial)
                    if name in TYPICAL:
                        typical[name] = gr.Button(TYPICAL[name][0], size="sm", elem_id=f"{name}-typical")
                wire_opening(tab_block.select, name, built[name], query)
            with gr.Tab("Across texts", id="corpus"):
                across_tab = across.build(services, picker, initial)
            course = learn_course.build(services, picker)  # its own gr.Tab: the course through the theory
            lab_tab = lab.build(services, picker, initial)  # its own gr.Tab: train a Transformer from scratch
        for name, tab in built.items():
            wire_switch(picker, current_tab, linked, name, tab)
        wire_send(built["generate"], built["attention"], tabs, current_tab)
        for name, button in typical.items():
            wire_typical(button, name, built[name], across_tab, tabs, current_tab)
        for run, button in (built["patching"].over_corpus or {}).items():
            wire_over_corpus(button, run, built["patching"], across_tab, tabs, current_tab)
        wire_open_head(services, picker, built["patching"], built["attention"], tabs, current_tab)
        tabs.select(remember_tab, None, current_tab, api_visibility="private", queue=False)
        controls = {name: tab for name, tab in built.items() if tab.text is not None}
        deep_links(demo, services, default_model, picker, tabs, current_tab, linked, controls)
        learn_course.api_endpoint(services, picker)  # hidden parts only the `lesson` endpoint reads
        learn_course.wire_opening(demo, course, picker)
        learn_course.wire_switch(course, picker, current_tab)
        picker.after.wire(picker.loaded.success, **ON_FIRST)  # every tab's follow-up of a model change, one event
        # a lesson opens any of these; Generate and the Lab take no link's fields, only a lesson's
        learn_course.wire_try(course, tabs, current_tab, {**controls, "generate": built["generate"], "lab": lab_tab})
        wire_share_link(share, picker, current_tab, controls, course.choose)
        demo.load(None, js=build_lookup())  # the Theory panel; glossary terms on hover, eq. N.M linked to it
    return demo


def share_controls() -> dict:
    with gr.Row():
        button = gr.Button("Copy a link to this view", size="sm", elem_id="copy-link", scale=0, min_width=160)
        link = gr.Textbox(label="Link (model, tab, layer, head, and the text when short)", interactive=False,
                          buttons=["copy"], elem_id="share-link", scale=3)
    note = gr.Markdown(elem_id="share-note")
    return dict(button=button, link=link, note=note)


def remember_tab(evt: gr.SelectData):
    return TAB_IDS.get(str(evt.value), "attention")


def wire_send(generate_tab: Tab, attention_tab: Tab, tabs, current_tab) -> None:
    """Generate's button sends prompt + continuation to the Attention tab, and shows it there."""

    def send_to_attention(text: str):
        if not text:
            raise gr.Error("Generate something first; then it can be sent to the Attention tab.")
        return text, gr.Tabs(selected="attention"), "attention"

    generate_tab.send.click(send_to_attention, generate_tab.sent, [attention_tab.text, tabs, current_tab],
                            api_visibility="private").then(**attention_tab.run_event)


def wire_over_corpus(button, run: str, tab: Tab, across_tab, tabs, current_tab) -> None:
    """A button inside a tab that runs an Across texts analysis over the built-in IOI pairs in the tab's direction
    (the Patching tab's shortcuts), there, on the model chosen; Stop there ends it."""
    _, mode = tab.typical

    def open_across(direction):
        return (gr.Tabs(selected="corpus"), "corpus", "IOI pairs", across.DEFAULT_N,
                direction if direction in ("denoise", "noise") else "denoise")

    event = button.click(open_across, mode, [tabs, current_tab, across_tab.corpus, across_tab.n,
                                             across_tab.shortcut_mode], api_visibility="private", queue=False).then(
        **across_tab.show_map).then(**across_tab.runs[run], api_visibility="private")
    across_tab.stop.click(None, None, None, cancels=[event], api_visibility="private")


def typical_settings(name: str, *fields) -> list:
    """The Across texts fields a tab's "how typical is this?" run sets besides corpus and n, from the tab's own
    `typical` fields: the induction score for the Heads tab; every head (z) in the Patching tab's direction."""
    if name == "heads":
        return ["induction"]
    _, mode = fields
    return ["z", mode if mode in ("denoise", "noise") else "denoise"]


def wire_typical(button, name: str, tab: Tab, across_tab, tabs, current_tab) -> None:
    """The button under a tab that runs its analysis over the matching built-in corpus in the Across texts tab
    (IOI pairs for the IOI preset's patching, induction texts for the induction score), on the model chosen;
    Stop there ends it. The Patching tab's shows only while its preset is the IOI pair: the other presets have
    no built-in corpus of their kind."""
    _, corpus, run = TYPICAL[name]
    settings = [across_tab.kind] if run == "heads" else [across_tab.site, across_tab.mode]
    fields = tab.typical or []

    def open_across(*values):
        return gr.Tabs(selected="corpus"), "corpus", corpus, across.DEFAULT_N, *typical_settings(name, *values)

    event = button.click(open_across, fields, [tabs, current_tab, across_tab.corpus, across_tab.n, *settings],
                         api_visibility="private", queue=False).then(**across_tab.show_map).then(
                             **across_tab.runs[run], api_visibility="private")
    across_tab.stop.click(None, None, None, cancels=[event], api_visibility="private")
    if name == "patching":
        preset = fields[0]
        preset.change(lambda chosen: gr.Button(visible=chosen == IOI_PRESET), preset, button,
                      api_visibility="private", queue=False)


def wire_open_head(services, picker, source: Tab, attention_tab: Tab, tabs, current_tab) -> None:
    """A click on a head in `source` (its `picked` value "layer.head") opens that head, on the same text, in the
    Attention tab."""

    @user_errors
    def open_head(model_name, text, picked):
        layer, head = checked_pick(services.models.get(model_name), picked)
        return text, layer, str(head), gr.Tabs(selected="attention"), "attention"

    source.picked.click(open_head, [picker.model, source.text, source.picked],
                        [attention_tab.text, attention_tab.layer, attention_tab.head, tabs, current_tab],
                        api_visibility="private").then(**attention_tab.run_event)


def wire_opening(trigger, name: str, tab: Tab, query) -> None:
    """When the tab opens: its hidden figures shown, then its first screen (events.opening) filled; not when a
    link opens the page: on the tab the link opens, deep_links sets the values and the view, and a tab selected only
    as the page mounts (the first tab, before the link moves to its own) is computed when its user opens it."""
    if tab.opening is None:
        return
    first, outputs = tab.opening["fn"], tab.opening["outputs"]

    def unless_linked(search, was_shown, *args):
        never_shown = was_shown is False  # a model change sets "": the tab then computes the new model's
        linked = links.linked_tab(dict(parse_qsl(str(search or "").lstrip("?"))), links.TABS) if never_shown else None
        if linked == name or (linked is not None and name == OPENS_ON):
            return [gr.skip()] * len(outputs)
        return first(was_shown, *args)

    n_inputs = len(tab.opening["inputs"])
    unless_linked.__signature__ = events.signature(["search", "was_shown"]
                                                   + [f"input_{i}" for i in range(n_inputs - 1)])
    unless_linked.__name__ = unless_linked.__qualname__ = f"open_{name}"
    opening = {**tab.opening, "fn": unless_linked, "inputs": [query, *tab.opening["inputs"]],
               "js": FIRST_OPENING_JS.replace("TAB", name)}
    if tab.reveal:
        def show():
            shown = [gr.update(visible=True) for _ in tab.reveal]
            return shown if len(shown) > 1 else shown[0]

        trigger(show, None, tab.reveal, queue=False, api_visibility="private").then(**opening)
    else:
        trigger(**opening)


def cleared(component, line: str = ""):
    """What a component that showed another model's result shows after a model change: nothing, hidden where it
    was hidden until a result; a note says `line` (which button to press)."""
    if isinstance(component, gr.State):
        return None
    if isinstance(component, (gr.Markdown, gr.HTML)):
        return line
    if isinstance(component, gr.Radio):
        return gr.update(value=None, choices=[])
    return gr.update(value=None, visible=component.visible)


def wire_switch(picker, current_tab, linked, name: str, tab: Tab) -> None:
    """After a model change (once the tab's fields follow the new model): the tab on screen shows its first screen
    again, computed for the new model; every other result of the tab, and all of a tab not on screen, is cleared,
    its notes saying which button to press (a tab not on screen computes its first screen when it opens). A tab
    whose first screen is already the new model's (a link's model, shown as the page opened) is left as it is, and
    so is the Attention view a link asks for while it is being drawn."""
    if not tab.follows:
        return
    opening, results, press = tab.opening, tab.results or [], tab.press or {}
    first_inputs = opening["inputs"] if opening else []  # [shown, model, the tab's inputs]
    first_outputs = opening["outputs"] if opening else []  # [shown, the first screen's outputs]

    def line(component, model_name, why: str) -> str:
        button = press.get(component)
        if button is None:
            return ""
        own = (tab.cannot_press or {}).get(component)
        why = why or (own(model_name) if own is not None else "")   # this button cannot run on the new model
        return why or f"Now on {message(model_name)}: press **{button.value}** to compute this for it."

    def clear(components, model_name, why: str = "") -> list:
        return [gr.skip() if component in first_inputs else cleared(component, line(component, model_name, why))
                for component in components]

    def switch(model_name, on_screen, linking, *rest):
        *values, progress = rest
        why_not = tab.cannot(model_name) if tab.cannot else ""   # no "press Generate" for an encoder
        if opening and (values[0] == model_name or (linking and name == "attention")):
            return [gr.skip()] * (len(first_outputs) + len(results))
        if opening and on_screen == name:
            try:
                shown, *first = opening["fn"](False, *values[1:], progress)
            except gr.Error as exc:  # the first screen cannot be computed: cleared, and its notes say why
                return ["", *clear(first_outputs[1:], model_name, exc.message), *clear(results, model_name)]
            first = [gr.update(value=value, visible=True) if isinstance(component, gr.Plot) and value is not None
                     else value for component, value in zip(first_outputs[1:], first)]
            return [shown, *first, *clear(results, model_name, why_not)]
        # "" (not False): shown for no model since the change, so the tab computes its first screen when it opens
        return ["", *clear(first_outputs[1:], model_name, why_not),
                *clear(results, model_name, why_not)][0 if opening else 1:]

    switch.__signature__ = events.signature(["model_name", "on_screen", "linking"]
                                            + [f"input_{i}" for i in range(len(first_inputs))])
    switch.__name__ = switch.__qualname__ = f"switch_{name}"
    picker.after.add(user_errors(switch), [picker.model, current_tab, linked, *first_inputs],
                     [*first_outputs, *results])


def linked_fields(tab: Tab) -> list:
    """The components of a tab that a link sets, in links' order; a placeholder where the tab has none."""
    fields = (tab.text, tab.layer, tab.head, tab.corrupted, tab.token)
    return [field if field is not None else gr.State(None) for field in fields]


def deep_links(demo, services, default_model, picker, tabs, current_tab, linked, controls: dict[str, Tab]) -> None:
    """Read the link a page was opened with: model, tab, layer, head, text; then show the Attention tab's view
    when the link asked for it."""
    models, attention_event = services.models, controls["attention"].run_event

    def shape(name: str) -> tuple[int, int]:
        cfg = models.get(name).config
        return cfg.n_layers, cfg.n_heads

    link_outputs = [picker.model, tabs, current_tab]
    for tab in controls.values():
        link_outputs += linked_fields(tab)
    attention_shown = controls["attention"].opening["inputs"][0]  # the model its first screen was computed for

    @user_errors
    def open_link(request: gr.Request):
        """The page as the link asks; the picker's choices as the store has them now (new models included)."""
        params = dict(request.query_params) if request is not None else {}
        link = links.parse(params, models.names_ready(), shape, default_model)
        for text in link.messages:
            gr.Warning(message(text))
        tab = link.tab or "attention"
        chosen = tab if tab in controls else "attention"
        # the tab is the page's only when the link names one: a page opened on no tab keeps the one its user chose
        # while this ran (tabs.select has already set it), so a link made later names the tab on screen
        values = [gr.Dropdown(choices=models.choices(), value=link.model) if link.model else picker.choices(),
                  gr.Tabs(selected=tab) if link.tab else gr.skip(), tab if link.tab else gr.skip()]
        for name in controls:
            here = name == chosen
            values.append(link.text if here and link.text else gr.skip())
            values.append(link.layer if here and link.layer is not None else gr.skip())
            if not here or link.head is None or (link.head == "mean" and name != "attention"):
                values.append(gr.skip())
            else:
                values.append("mean of heads" if link.head == "mean" else link.head if name != "attention"
                              else str(link.head))
            values.append(link.corrupted if here and link.corrupted else gr.skip())
            values.append(link.token if here and link.token is not None else gr.skip())
        return *values, link.given and tab == "attention"  # a link to another tab draws nothing here

    @user_errors
    def show_linked(flag, model_name, *args):
        """The Attention view the link asks for; then the tab counts as shown for this model."""
        if not flag:
            return (gr.skip(),) * (len(attention_event["outputs"]) + 2)
        return *attention_event["fn"](model_name, *args), model_name, False

    opening = {name: tab for name, tab in controls.items() if tab.opening is not None}
    revealed = [figure for tab in opening.values() for figure in tab.reveal or []]

    def reveal(tab_name):
        return [gr.Plot(visible=True) if tab_name == name else gr.skip()
                for name, tab in opening.items() for _ in tab.reveal or []]

    first_inputs, first_outputs = [], []
    for tab in opening.values():
        first_inputs += tab.opening["inputs"]
        first_outputs += tab.opening["outputs"]

    def open_first(tab_name, flag, *rest):
        """The first screen of the tab the page opens on (not when the link asked for the Attention view: that
        ran above; nor when the tab's own opening, as the page mounted it, has already shown it for this model)."""
        *values, progress = rest
        out, at = [], 0
        for name, tab in opening.items():
            width, outs = len(tab.opening["inputs"]), len(tab.opening["outputs"])
            shown, model_name = values[at:at + 2]  # every opening's inputs start [shown, model]
            if name == tab_name and not (flag and name == "attention") and not (shown and shown == model_name):
                out += list(tab.opening["fn"](*values[at:at + width], progress))
            else:
                out += [gr.skip()] * outs
            at += width
        return out

    open_first.__signature__ = events.signature(["tab_name", "flag"] + [f"input_{i}" for i in range(len(first_inputs))])
    demo.load(None, js=SVG_BUTTON_JS)
    # the link read here (its request cannot travel to a backend's replica), then one event (ui.tabs.events.Steps):
    # the figures of the tab it opens shown, the Attention view it asks for drawn, or else the first screen of the
    # tab the page opens on
    opened = Steps("open_page")
    opened.add(reveal, [current_tab], revealed)
    opened.add(show_linked, [linked, *attention_event["inputs"]],
               [*attention_event["outputs"], attention_shown, linked])
    opened.add(user_errors(open_first), [current_tab, linked, *first_inputs], first_outputs)
    link_read = demo.load(open_link, None, [*link_outputs, linked], api_visibility="private")
    opened.wire(link_read.then, **ON_FIRST).then(None, js=OPENED_JS)
    demo.load(picker.load_card, picker.model, picker.card, api_visibility="private")


def wire_share_link(share: dict, picker, current_tab, controls: dict[str, Tab], lesson) -> None:
    """The button that writes a link to this view (and copies it); on the Learn tab, to the lesson shown."""

    @user_errors
    def share_link(model_name, tab, lesson_name, *values):
        *tab_values, page_url = values
        if tab == "learn":
            return links.make(page_url, model_name, tab, None, None, None, lesson=lesson_name)
        by_tab = dict(zip(controls, zip(*[iter(tab_values)] * 5)))
        text, layer, head, corrupted, token = by_tab.get(tab, by_tab["attention"])
        return links.make(page_url, model_name, tab, layer, head, text, corrupted, token)

    inputs = [picker.model, current_tab, lesson]
    for tab in controls.values():
        inputs += linked_fields(tab)
    page_url = gr.Textbox(visible=False)
    share["button"].click(share_link, [*inputs, page_url], [share["link"], share["note"]], js=LINK_JS,
                          api_visibility="private", queue=False).then(None, share["link"], None, js=COPY_JS)
