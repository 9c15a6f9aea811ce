"""What the tabs share: the text box with its upload, the layer and head inputs that follow the chosen model
(checked before a run, with a note under them), the export row, the file box, and the one return type of every
tab's build."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from ui.services.checks import MEAN_OF_HEADS, UserError, check_range, index_of, kept_index
from ui.services.text import UPLOAD_SUFFIXES, read_upload
from ui.tabs.events import gated, message, user_errors

EXAMPLES = Path(__file__).resolve().parents[2] / "assets" / "examples"
# Runs once when a page opens (demo.load js=). Gradio's plot component draws with Plotly.react(gd, data, layout,
# config), passing the `config` of the figure JSON (export.figure_json puts toImageButtonOptions there); this hook
# adds a second modebar button that downloads the same figure, at the same size and name, as SVG. Plotly's bundle is
# loaded lazily, when the first plot is drawn, so the hook waits for window.Plotly to be set.
SVG_BUTTON_JS = """
() => {
  const hook = (Plotly) => {
    if (!Plotly || Plotly.__svgButton) return;
    Plotly.__svgButton = true;
    const react = Plotly.react;
    Plotly.react = function (gd, data, layout, config) {
      const options = config && config.toImageButtonOptions;
      if (options) {
        const svg = {
          name: "downloadSvg",
          title: "Download plot as SVG",
          icon: {width: 1000, height: 1000, path: "M100 100h800v800h-800z M250 650l150-200 120 150 80-100 150 150z"},
          click: (g) => Plotly.downloadImage(g, Object.assign({}, options, {format: "svg", scale: 1})),
        };
        config = Object.assign({}, config, {modeBarButtonsToAdd: [...(config.modeBarButtonsToAdd || []), svg]});
      }
      return react.call(this, gd, data, layout, config);
    };
  };
  if (window.Plotly) { hook(window.Plotly); return; }
  let current;
  Object.defineProperty(window, "Plotly", {
    configurable: true,
    get: () => current,
    set: (value) => { current = value; hook(value); },
  });
}
"""


# Runs when a click bridge loads: a click on a point of one of its plots reads a value from the point (READ, a JS
# function body of `point` returning a string or null) into the bridge and fires the bridge's click event.
PLOT_CLICK_JS = """
const read = (point) => { READ };
const onClick = (event) => {
  const point = event.points && event.points[0];
  const value = point ? read(point) : null;
  if (value === null || value === undefined) return;
  props.value = value;
  trigger("click");
};
const attach = () => {
  for (const id of PLOTS) {
    const plot = document.querySelector(`#${id} .js-plotly-plot`);
    if (plot && plot._ev && !plot._ev.listeners("plotly_click").includes(onClick)) plot.on("plotly_click", onClick);
  }
};
new MutationObserver(attach).observe(document.body, { childList: true, subtree: true });
attach();
"""


def click_bridge(elem_id: str, plots: list[str], read: str) -> gr.HTML:
    """A hidden component that a click on a point of the plots (their elem_ids) fills and clicks: its .click event
    receives what `read` (JS, a body of `point`) returned, e.g. "layer.head"."""
    js = PLOT_CLICK_JS.replace("READ", read).replace("PLOTS", json.dumps(plots))
    return gr.HTML("", html_template="<span hidden>${value}</span>", js_on_load=js, elem_id=elem_id)


@dataclass
class Tab:
    """What a tab's build hands the page: the inputs a deep link sets (text, layer, head, a second prompt, a token),
    and for the tabs that have them, the event to run the tab again from elsewhere, the event that shows its first
    screen when it opens (events.opening) with the figures it reveals first, the button and state that send text
    to it, and the component whose click names a head to open ("layer.head")."""

    text: gr.Textbox | None = None
    layer: gr.Number | None = None
    head: gr.Number | gr.Dropdown | None = None
    corrupted: gr.Textbox | None = None
    token: gr.Number | None = None
    run_event: dict | None = None  # click-event arguments (fn, inputs, outputs, …)
    opening: dict | None = None  # the same for the first screen (events.opening)
    reveal: list | None = None  # the figures hidden until a result: shown when the first screen comes
    send: gr.Button | None = None
    sent: gr.State | None = None
    picked: gr.HTML | None = None
    # a model change: once the fields follow the new model's ranges, the page computes the first screen again where
    # the tab is on screen, and clears `results` (what else shows a model's result) everywhere, each note in `press`
    # saying which button fills it
    follows: bool = False
    results: list | None = None
    press: dict | None = None  # note → its button
    # why the tab's buttons cannot run on a model (its name), or "": the cleared notes say that, not "press …"
    cannot: Callable[[str], str] | None = None
    # the same for one note's button where the tab's others can run (the Heads tab's ablation on an encoder
    # without an LM head): note → why its button cannot run on a model (its name), or ""
    cannot_press: dict | None = None
    # the fields a "how typical is this?" run reads (ui/page.py TYPICAL): the Patching tab's preset and direction
    typical: list | None = None
    # buttons inside the tab that run an Across texts analysis over a built-in corpus (ui/page.py OVER_CORPUS):
    # analysis → its button (the Patching tab's shortcuts over the IOI pairs)
    over_corpus: dict | None = None
    # what a lesson's "Try it" may set beyond text, layer, head and corrupted prompt (its link's key → the field:
    # Generate's length and temperature, the Heads tab's score, the Lab's run), and the events that follow the
    # tab's run there (Generate's trace and token strip after its stream)
    settings: dict | None = None
    run_after: list | None = None
    # the tab's figures beyond its run's that a lesson's "Try it" computes where its link names one ("show"): the
    # figure's elem_id → (the event that computes it, the components it shows: an accordion is opened)
    parts: dict | None = None
    stop: gr.Button | None = None  # cancels the tab's run when a lesson's "Try it" started it (a stream)


def read_example(name: str) -> str:
    """One of the example texts in assets/examples/, shown in the text boxes when the page opens."""
    return (EXAMPLES / name).read_text(encoding="utf-8").strip()


def text_with_upload(label: str, value: str, prefix: str, cap: int, lines: int = 6, api_name: str | None = None,
                     max_lines: int = 14):
    """A text box (elem_id prefix-text) with a .txt/.md upload (prefix-upload) that fills it, both held to `cap`
    bytes. Returns (textbox, file)."""
    text = gr.Textbox(label=label, value=value, lines=lines, max_lines=max_lines, elem_id=f"{prefix}-text")
    return text, upload(text, prefix, cap, api_name)


def upload(text: gr.Textbox, prefix: str, cap: int, api_name: str | None = None) -> gr.File:
    """A .txt/.md upload (elem_id prefix-upload) that fills `text`, held to `cap` bytes."""
    file = gr.File(
        label=f"…or upload a .txt / .md file (at most {cap / 1e6:g} MB, UTF-8)",
        file_types=list(UPLOAD_SUFFIXES),
        type="filepath",
        height=130,
        elem_id=f"{prefix}-upload",
        elem_classes=["upload"],
    )

    @user_errors
    def load_upload(path: str | None) -> str:
        """The uploaded file's text, for the text box next to it."""
        return read_upload(path, cap)

    file.upload(load_upload, inputs=file, outputs=text, api_name=api_name,
                api_visibility="public" if api_name else "private", concurrency_limit=4)
    # the box empties as the file is read (the reading above took its path when the upload fired), taken or
    # refused: the text box holds what was taken, and a refused file must not look loaded
    file.upload(lambda: None, None, file, api_visibility="private", queue=False)
    return file


def file_box(elem_id: str, label: str = "Data behind the figures") -> gr.File:
    """Where a tab's data download appears: a link the browser saves."""
    return gr.File(label=label, interactive=False, elem_id=elem_id, height=80)


def export_row(prefix: str, label: str, before: Callable[[], object] | None = None):
    """The closed "Download the data" section: what `before` lays out (a choice), the button, the file, the note.
    Returns (button, file, note, whatever `before` returned)."""
    with gr.Accordion("Download the data", open=False, elem_id=f"{prefix}-export-box"):
        chosen = before() if before is not None else None
        button = gr.Button(label, size="sm", elem_id=f"{prefix}-export")
        file = file_box(f"{prefix}-export-file")
        note = gr.Markdown(elem_id=f"{prefix}-export-note")
    return button, file, note, chosen


def head_choices(n_heads: int) -> list[str]:
    return ["mean of heads"] + [str(h) for h in range(n_heads)]


def checked_pick(model, picked) -> tuple[int, int]:
    """A clicked head ("layer.head", from a click bridge) as (layer, head), checked against the model."""
    parts = str(picked if picked is not None else "").split(".")
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        raise UserError(f"A head is picked as 'layer.head' (for example 3.2), not {str(picked)[:40]!r}.")
    layer, head = (int(part) for part in parts)
    cfg = model.config
    if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
        raise UserError(f"There is no head {picked} in this model.")
    return layer, head


def out_of_range(name: str, value, size: int, also: str = "") -> str:
    """'' when value is an index of `size` things, else one sentence that says so and gives the model's range
    ("Layer 99 is out of range: this model has layers 0–29."). also: what else the field takes (", or the mean")."""
    try:
        check_range(name, value, 0, size - 1)
    except UserError as exc:
        index = index_of(value)
        if index is None or abs(index) >= 10**6:  # not a whole number, or one no one means: the check's words
            return str(exc)
        return f"{name} {index} is out of range: this model has {name.lower()}s 0–{size - 1}{also}."
    return ""


@dataclass
class Fields:
    """A layer input and a head input that follow the chosen model (layer_head), the note under them that says
    what is wrong with them, and the State that says whether they passed their last check (run_checked)."""

    layer: gr.Number
    head: gr.Number | gr.Dropdown | None
    note: gr.Markdown
    ok: gr.State
    shape: Callable  # model → (layers, heads)
    mean: bool = False  # the head may be "mean of heads"

    def problem(self, model, layer, head=None) -> str:
        """'' when the layer and the head are the model's, else what is wrong, in one or two sentences."""
        n_layers, n_heads = self.shape(model)
        problems = [out_of_range("Layer", layer, n_layers)]
        if self.head is not None and not (self.mean and head in MEAN_OF_HEADS):
            problems.append(out_of_range("Head", head, n_heads, ", or the mean" if self.mean else ""))
        return " ".join(p for p in problems if p)


def head_label(note: str, n_heads: int, mean: bool) -> str:
    return f"Head ({note}0–{n_heads - 1}{', or the mean' if mean else ''})"


def layer_head(models, picker, initial, prefix: str, shape: Callable = None, note: str = "", mean: bool = False,
               keep: bool = True, row: bool = True, head: bool = True) -> Fields:
    """A layer input and a head input whose ranges follow the chosen model (elem_ids prefix-layer, prefix-head),
    and the note under them (prefix-field-note) where run_checked says what is wrong with them.

    shape(model) → (layers, heads): the main stack's by default. note goes before the range in both labels
    ("RoPE scores; "). mean: the head is a dropdown that offers the mean of the layer's heads. keep: a new model
    keeps the layer and head where it has them (else both go back to 0). row: the two in a row of their own, the
    note under it; else laid out where the caller is, the note left for the caller to render (fields.note.render()).
    head: False for a layer alone."""
    shape = shape or (lambda model: (model.config.n_layers, model.config.n_heads))
    n_layers, n_heads = shape(initial)

    def layout():
        layer = gr.Number(value=0, label=f"Layer ({note}0–{n_layers - 1})", precision=0, elem_id=f"{prefix}-layer",
                          min_width=120)
        if not head:
            return layer, None
        if mean:  # wide enough for "mean of heads" in full
            return layer, gr.Dropdown(choices=head_choices(n_heads), value="mean of heads",
                                      label=head_label(note, n_heads, mean), allow_custom_value=True,
                                      elem_id=f"{prefix}-head", min_width=170)
        return layer, gr.Number(value=0, label=head_label(note, n_heads, mean), precision=0,
                                elem_id=f"{prefix}-head", min_width=120)

    if row:
        with gr.Row():
            layer, head_box = layout()
    else:
        layer, head_box = layout()
    field_note = gr.Markdown(elem_id=f"{prefix}-field-note", elem_classes=["field-note"], render=row)
    fields = Fields(layer, head_box, field_note, gr.State(True), shape, mean)

    @user_errors
    def limits(name, layer_index, head_index=None):
        """New ranges for the chosen model; the layer and head stay where they are when the model has them; the
        note about the last model's fields goes."""
        layers, heads = shape(models.get(name))
        layer_value = kept_index(layer_index, layers) if keep else 0
        new_layer = gr.Number(value=layer_value, label=f"Layer ({note}0–{layers - 1})")
        if head_box is None:
            return new_layer, ""
        if mean:
            kept_head = head_index if head_index in head_choices(heads) else "mean of heads"
            return new_layer, gr.Dropdown(choices=head_choices(heads), value=kept_head,
                                          label=head_label(note, heads, mean)), ""
        head_value = kept_index(head_index, heads) if keep else 0
        return new_layer, gr.Number(value=head_value, label=head_label(note, heads, mean)), ""

    boxes = [layer] if head_box is None else [layer, head_box]
    picker.after.add(limits, [picker.model, *boxes], [*boxes, field_note])
    return fields


RUNS_DONE = """() => { const a = 'data-runs-NOTE', b = document.body;
  b.setAttribute(a, String(Number(b.getAttribute(a) || 0) + 1)); }"""


def run_checked(trigger: Callable, models, model, fields: Fields, event: dict, reveal: list = (), **options):
    """trigger(...) (a button's .click, a step's .then) checks the layer and head first, at once, against the model:
    a wrong one is a message in the note under them and every figure keeps what it shows; right ones clear the note,
    show `reveal` (components hidden until a result) and run `event` with `options` (its api_name). The event's
    own checks stay as they were: an API call, which has no page to check it, gets its error. Returns the run's
    dependency, to chain on."""
    boxes = [fields.layer] if fields.head is None else [fields.layer, fields.head]

    def check_fields(name, layer, head=None):
        try:
            problem = fields.problem(models.get(name), layer, head)
        except UserError:  # no model to check against: the run says why
            problem = ""
        shown = [gr.skip() if problem else gr.update(visible=True) for _ in reveal]
        return message(problem), not problem, *shown

    run = trigger(user_errors(check_fields), [model, *boxes], [fields.note, fields.ok, *reveal],
                  api_visibility="private", queue=False).then(**gated(event, fields.ok), **options)
    # the page counts the runs that came back (data-runs-<note id> on <body>): a test that checks that nothing
    # changed waits for it, not for a fixed time
    run.then(None, None, None, js=RUNS_DONE.replace("NOTE", fields.note.elem_id or ""), api_visibility="private")
    return run
