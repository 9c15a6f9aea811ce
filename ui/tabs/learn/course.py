"""Learn tab: a course through the theory, one lesson at a time on the loaded model. Each lesson asks its question
first, beside the set-up of its measurement (axes that nothing measured fills); Reveal shows the measured answer
beside the reader's guess, the measured figure with the guess marked on it, and its line. Back and Next walk the
lessons in order, a link opens one (?tab=learn&lesson=sqrt-dk), the browser remembers where the reader was and
what was revealed, and "try it" opens the full tab in the lesson's state.

build() opens its own gr.Tab, so the page adds the tab with one call inside its gr.Tabs.
"""

from __future__ import annotations

from types import SimpleNamespace
import gradio as gr

from ui import links
from ui.services.learn import course as syllabus
from ui.tabs import events
from ui.tabs.events import ON_ANALYSIS, progress_callback, user_errors
from ui.tabs.widgets import RUNS_DONE
from ui.views.learn import course as views

LEAD = """**A course through the theory.** {n} short lessons, in order, each computed live on the model chosen
above. Answer each question before you reveal the answer: a guess made and then checked is remembered. Your place
and the lessons you revealed are kept in this browser."""
SAVED_KEY = "attention-explorer-course"  # the browser's localStorage key (BrowserState) for the reader's progress


def short_title(lesson) -> str:
    """A lesson's title up to its colon ("Cost" of "Cost: the quadratic term, …"): the picker's name for it, which
    a phone's width shows whole (the full title heads the lesson under the picker)."""
    return lesson.title.split(":")[0]


def lesson_choices(revealed=()) -> list[tuple[str, str]]:
    return [(f"{i}. {short_title(lesson)}{' ✓' if lesson.name in revealed else ''}", lesson.name)
            for i, lesson in enumerate(syllabus.lessons(), start=1)]


def saved_state(saved) -> dict:
    """The browser's progress as a dict {lesson, revealed}, whatever the browser held (a stale or edited entry
    becomes the default)."""
    names = syllabus.names()
    saved = saved if isinstance(saved, dict) else {}
    lesson = saved.get("lesson") if saved.get("lesson") in names else names[0]
    revealed = [name for name in saved.get("revealed", []) if name in names] if isinstance(
        saved.get("revealed"), list) else []
    return {"lesson": lesson, "revealed": revealed}


def resumed(saved_value, request: gr.Request) -> str:
    """The lesson a page opens on: the one its link names, else where this browser left off."""
    params = dict(request.query_params) if request is not None else {}
    name = saved_state(saved_value)["lesson"]
    if params.get("lesson"):
        try:
            name = syllabus.find(params["lesson"]).name
        except ValueError:
            pass  # the link's reader (ui.links.parse) says so in words
    return name


def build(services, picker) -> SimpleNamespace:
    """The tab; returns what the page wires: the lesson shown, its try-it state and button, and the load event."""
    first = syllabus.names()[0]
    with gr.Tab("Learn", id="learn") as tab:
        gr.Markdown(LEAD.format(n=len(syllabus.lessons())), elem_classes=["tab-lead"])
        with gr.Row(equal_height=False):
            choose = gr.Dropdown(lesson_choices(), value=first, label="Lesson", elem_id="learn-choose", scale=3,
                                 min_width=220)
            back = gr.Button("← Back", elem_id="learn-back", scale=0, min_width=90)
            forward = gr.Button("Next →", elem_id="learn-next", scale=0, min_width=90)
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=300, elem_id="learn-lesson"):
                place = gr.Markdown(elem_id="learn-place")
                text = gr.Markdown(elem_id="learn-text", latex_delimiters=[])
                question = gr.Markdown(elem_id="learn-question")
                with gr.Group(elem_id="learn-guess"):
                    guess_number = gr.Textbox(label="Your guess (a number; optional)", elem_id="learn-guess-number",
                                              max_lines=1, max_length=40)
                    guess_choice = gr.Radio([], label="Your guess (optional)", elem_id="learn-guess-choice",
                                            visible=False)
                reveal = gr.Button("Reveal the answer", variant="primary", elem_id="learn-reveal")
                answer = gr.Markdown(elem_id="learn-answer")
            with gr.Column(scale=3, min_width=300):
                # hidden until the lesson is computed: no figure box is shown empty; its title names it (the label's
                # badge floats over the plot, and on a phone it wraps and covers the title)
                figure = gr.Plot(label="The lesson's figure, computed on the model", show_label=False,
                                 elem_id="learn-figure", visible=False)
                alt = gr.Markdown(elem_id="learn-alt")
                try_button = gr.Button("Try it", elem_id="learn-try", size="sm")
                try_note = gr.Markdown(elem_id="learn-try-note")
        # inside the tab: a component made in gr.Tabs beside the tabs counts as one of its children, and the tabs
        # after it (the Lab) then register at a second place when first shown: a second "Lab" button
        saved = gr.BrowserState({"lesson": first, "revealed": []}, storage_key=SAVED_KEY)
        shown = gr.State(None)  # (model, lesson) on screen: the tab recomputes when it opens on anything else
        link = gr.State({})     # the state "try it" opens (views.try_state)
    outputs = [choose, place, text, question, guess_number, guess_choice, answer, figure, alt, try_button, try_note,
               link, shown, saved]

    @user_errors
    def show(model_name, name, saved_value, progress=gr.Progress()):
        page = views.lesson_page(services, model_name, name, progress_callback(progress))
        state = saved_state(saved_value)
        state["lesson"] = page.name
        return (gr.Dropdown(choices=lesson_choices(state["revealed"]), value=page.name), page.place, page.text,
                page.question, gr.Textbox(value="", visible=not page.choices),
                gr.Radio(choices=list(page.choices), value=None, visible=bool(page.choices)), "",
                gr.Plot(value=page.figure, visible=page.figure is not None),
                "", gr.Button(page.try_label), page.try_note, views.try_state(page.link), (model_name, page.name),
                state)

    def step(by: int):
        def moved(model_name, name, saved_value, progress=gr.Progress()):
            return show(model_name, views.neighbour(name, by), saved_value, progress)
        moved.__name__ = moved.__qualname__ = "learn_next" if by > 0 else "learn_back"
        return moved

    @user_errors
    def opened(model_name, name, shown_value, saved_value, progress=gr.Progress()):
        if shown_value is not None and tuple(shown_value) == (model_name, name):
            return [gr.skip()] * len(outputs)
        return show(model_name, name, saved_value, progress)

    @user_errors
    def revealed(model_name, name, number, choice, saved_value, progress=gr.Progress()):
        lesson = syllabus.find(name)
        guess = choice if lesson.question.choices else number
        words, whole, line = views.revealed(services, model_name, name, guess, progress_callback(progress))
        state = saved_state(saved_value)
        if lesson.name not in state["revealed"]:
            state["revealed"].append(lesson.name)
        return (words, gr.Plot(value=whole, visible=True), line,
                gr.Dropdown(choices=lesson_choices(state["revealed"])), state)

    inputs = [picker.model, choose, saved]
    choose.input(show, inputs, outputs, api_visibility="private", **ON_ANALYSIS)
    back.click(step(-1), inputs, outputs, api_visibility="private", **ON_ANALYSIS)
    forward.click(step(+1), inputs, outputs, api_visibility="private", **ON_ANALYSIS)

    def selected(model_name, name, shown_value, saved_value, request: gr.Request, progress=gr.Progress()):
        # The browser's copy (gr.BrowserState) is read by a component whose code loads on its own, and on a slow
        # machine that comes after the page's load event has taken the default lesson: so the tab, opened for the
        # first time on this page, reads the copy again, which has arrived by the time anyone clicks.
        if shown_value is None:
            name = resumed(saved_value, request)
        return opened(model_name, name, shown_value, saved_value, progress)

    tab.select(selected, [picker.model, choose, shown, saved], outputs, api_visibility="private", **ON_ANALYSIS)
    # Reveal: the answer, and the measured figure in place of the set-up, with its line
    reveal_outputs = [answer, figure, alt, choose, saved]
    reveal.click(revealed, [picker.model, choose, guess_number, guess_choice, saved], reveal_outputs,
                 api_visibility="private", **ON_ANALYSIS)
    guess_number.submit(revealed, [picker.model, choose, guess_number, guess_choice, saved],
                        reveal_outputs, api_visibility="private", **ON_ANALYSIS)
    return SimpleNamespace(tab=tab, choose=choose, show=show, inputs=inputs, outputs=outputs, opened=opened,
                           shown=shown, saved=saved, link=link, try_button=try_button)


def api_endpoint(services, picker) -> None:
    """`lesson(model_name, lesson)`: the lesson's text and question, its figure, and its answer (hidden parts of
    the page that only the API reads). The model is the picker's own value, checked against its choices as every
    endpoint's is, then by the model store (ModelStore.key)."""
    with gr.Column(visible=False, elem_id="learn-api"):
        lesson = gr.Textbox(elem_id="learn-api-lesson")
        text, answer = gr.Markdown(elem_id="learn-api-text"), gr.Markdown(elem_id="learn-api-answer")
        figure = gr.Plot(elem_id="learn-api-figure")
        trigger = gr.Button(elem_id="learn-api-run")

    @user_errors
    def lesson_api(model_name: str, lesson: str, progress=gr.Progress()):
        return views.api_lesson(services, model_name, lesson, progress_callback(progress))

    trigger.click(lesson_api, [picker.model, lesson], [text, figure, answer], api_name="lesson", **ON_ANALYSIS)


def wire_opening(demo, course, picker) -> None:
    """When the page opens: the lesson a link names, else where this browser left off; shown at once when the
    page opens on the Learn tab."""

    restore = user_errors(resumed)

    def first_screen(model_name, name, shown_value, saved_value, request: gr.Request, progress=gr.Progress()):
        params = dict(request.query_params) if request is not None else {}
        if links.linked_tab(params, links.TABS) != "learn":
            return [gr.skip()] * len(course.outputs)
        return course.opened(model_name, name, shown_value, saved_value, progress)

    demo.load(restore, course.saved, course.choose, api_visibility="private", queue=False).then(
        first_screen, [picker.model, course.choose, course.shown, course.saved], course.outputs,
        api_visibility="private", **ON_ANALYSIS)


def wire_switch(course, picker, current_tab) -> None:
    """After a model change: the lesson on screen is computed for the new model; a lesson not on screen is
    computed when the tab opens (its `shown` no longer matches)."""

    def switched(model_name, tab, name, shown_value, saved_value, progress=gr.Progress()):
        if tab != "learn":
            return [gr.skip()] * (len(course.outputs) - 2) + [None, gr.skip()]
        return course.opened(model_name, name, shown_value, saved_value, progress)

    picker.after.add(switched, [picker.model, current_tab, course.choose, course.shown, course.saved],
                     course.outputs)


def wire_try(course, tabs, current_tab, targets: dict) -> None:
    """"Try it": the lesson's tab opens with its text, layer, head and settings set, and its result computed there
    (the tab's run and what follows it, or its first screen computed afresh on those fields). targets: the tabs a
    lesson may open (ui.tabs.widgets.Tab, by tab id), each with the fields a link sets (`try_fields`); a link
    with compute: False (a model that cannot run the tab, as its lesson's note says) only opens the tab. A link that
    names one of the tab's `parts` ("show": its figure's elem_id) computes that figure too, after the tab's run."""
    fields, runs, oks = [], {}, {}
    for name, tab in targets.items():
        fields += [field for _, field in try_fields(tab)]
        runs[name] = tab.run_event or tab.opening
        if runs[name] is not None:
            oks[name] = gr.State(False)
    firsts = {name: tab.opening["inputs"][0] for name, tab in targets.items()
              if tab.run_event is None and tab.opening is not None}  # its "shown for" State: reset, it recomputes
    hidden = [(name, figure) for name, tab in targets.items() for figure in tab.reveal or []]
    # the figure a link names ("show") beyond the tab's run: its event runs after the run, its boxes are shown
    parts = {(name, elem_id): gr.State(False) for name, tab in targets.items() for elem_id in tab.parts or {}}
    boxes = [(name, elem_id, box) for name, tab in targets.items()
             for elem_id, (_, shown_boxes) in (tab.parts or {}).items() for box in shown_boxes]

    def open_tab(state):
        state = state if isinstance(state, dict) else {}
        target = state.get("tab", "attention")
        compute = state.get("compute", True) is not False
        values = [gr.Tabs(selected=target), target]
        for name, tab in targets.items():
            here = name == target
            for key, _ in try_fields(tab):
                value = state.get(key)
                if not here or value is None:
                    values.append(gr.skip())
                else:   # the Attention tab's head is a dropdown of strings ("mean of heads", "0", "1", …)
                    values.append(str(value) if key == "head" and name == "attention" else value)
        values += [name == target and compute for name in oks]
        values += [False if name == target else gr.skip() for name in firsts]
        shown = [gr.update(visible=True) if name == target and compute else gr.skip() for name, _ in hidden]
        named = [(name, elem_id) == (target, state.get("show")) and compute for name, elem_id in parts]
        opened = [(gr.update(open=True) if isinstance(box, gr.Accordion) else gr.update(visible=True))
                  if (name, elem_id) == (target, state.get("show")) and compute else gr.skip()
                  for name, elem_id, box in boxes]
        return [*values, *shown, *named, *opened]

    event = course.try_button.click(open_tab, course.link, [tabs, current_tab, *fields, *oks.values(),
                                                            *firsts.values(), *(figure for _, figure in hidden),
                                                            *parts.values(), *(box for _, _, box in boxes)],
                                    api_visibility="private", queue=False)
    # the target's run and what follows it, as ONE event: only the target's steps pass their gate, and a chain of
    # a dozen events (most of them skipped) cost the browser seconds each on a page that has used a few tabs
    landing = events.Steps("try_landing")
    for name, ok in oks.items():
        for step in [runs[name], *(targets[name].run_after or [])]:
            step = events.gated(step, ok)
            landing.add(step["fn"], events.as_list(step["inputs"]), events.as_list(step["outputs"]))
    for (name, elem_id), ok in parts.items():   # the named figure, computed on what the tab's run left there
        step = events.gated(targets[name].parts[elem_id][0], ok)
        landing.add(step["fn"], events.as_list(step["inputs"]), events.as_list(step["outputs"]))
    event = landing.wire(event.then, **ON_ANALYSIS)
    for name in oks:
        if targets[name].stop is not None:   # the tab's Stop ends this run too, as it ends the tab's own
            targets[name].stop.click(None, None, None, cancels=[event], api_visibility="private")
    # the page counts the landings that came back (data-runs-learn-try on <body>), as run_checked counts a tab's
    # runs: a test reads the target tab once its landing has run, not what an earlier landing left there
    event.then(None, None, None, js=RUNS_DONE.replace("NOTE", "learn-try"), api_visibility="private")


def try_fields(tab) -> list[tuple[str, object]]:
    """(the link's key, the component it sets) for each field of `tab` a lesson's link may set."""
    pairs = [("text", tab.text), ("layer", tab.layer), ("head", tab.head), ("corrupted", tab.corrupted),
             *(tab.settings or {}).items()]
    return [(key, field) for key, field in pairs if field is not None]
