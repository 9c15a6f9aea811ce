"""Patching tab: which component, at which position, carries the answer. A clean and a corrupted prompt, the
answer and the foil, then a patching sweep, direct logit attribution and the information-flow graph; a click on
a head in any of them opens it in the Attention tab (the page wires that: Tab.picked)."""

from __future__ import annotations

import gradio as gr

from ui.services.corpus.over import DEFAULT_N
from ui.services.patching import DEFAULT_THRESHOLD, PRESETS
from ui.tabs.events import ON_ANALYSIS, ON_HEAVY, handler, opening, user_errors
from ui.tabs.widgets import Tab, click_bridge, layer_head
from ui.views import patching as views

LEAD = """**What carries the answer**: run a prompt and a corrupted copy of it, then move one activation at a time
from one run into the other and see how much of the answer comes back."""

HOW_TO_READ = (views.how_to_read("denoise") + "  \n" + views.how_to_read("noise")
               + " Red is 1, white 0, blue below 0 in both.")

INTRO = """The metric is logit(answer) − logit(foil) at the last position: positive when the model prefers the
answer. *Denoise* writes clean activations into the corrupted run (what is enough to restore the answer?);
*noise* writes corrupted ones into the clean run (what is needed to keep it?). The score is the same fraction
in both, (patched − corrupted) / (clean − corrupted), so it reads the other way round: denoising, 1 is the answer
brought back and 0 nothing changed; noising, 1 is nothing changed and near 0 an activation the answer needs.
The sweep never runs one whole pass per patch: cells that are the same in both runs are skipped, and the rest run
in batches that resume at the patched layer and the first changed token. Direct logit attribution splits the
logit difference into one exact part per head and per MLP; it needs no corrupted prompt (without one, the foil
is the clean run's second most likely token). The flow graph (Ferrando and Voita, 2024) weighs each part of
each residual sum by its proximity to the sum; an attention edge between two tokens adds its heads' parts
(heads summed, then thresholded) and is kept when that sum reaches the threshold, walking down from the
prediction. """ + views.LIMITS

SITE_CHOICES = [("residual stream (layer × position)", "resid_pre"), ("attention output (layer × position)",
                                                                     "attn_out"),
                ("MLP output (layer × position)", "mlp_out"), ("each head (layer × head)", "z"),
                ("one layer's heads (head × position)", "z_by_position")]
# a click on a point that names a head (a "layer.head" among its customdata) reads it
HEAD_READ = ("return point.customdata === undefined ? null : "
             "[].concat(point.customdata).map(String).find((v) => /^\\d+\\.\\d+$/.test(v)) || null;")



def build(services, picker, initial) -> Tab:
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    first = next(iter(PRESETS))
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            preset = gr.Dropdown(choices=[*PRESETS, "your own"], value=first, label="Prompt pair",
                                 elem_id="patch-preset")
            clean = gr.Textbox(label="Clean prompt", value=PRESETS[first][0], lines=2, elem_id="patch-clean")
            corrupted = gr.Textbox(label="Corrupted prompt (the same token count; attribution may leave it empty)",
                                   value=PRESETS[first][1], lines=2, elem_id="patch-corrupted")
            site = gr.Dropdown(choices=SITE_CHOICES, value="resid_pre", label="What to patch", elem_id="patch-site")
            run = gr.Button("Patch", variant="primary", elem_id="patch-run")
            with gr.Accordion("Answer, foil and direction", open=False, elem_id="patch-more"):
                with gr.Row():
                    answer = gr.Textbox(label="Answer token (empty: the clean run's top)", elem_id="patch-answer",
                                        min_width=120)
                    foil = gr.Textbox(label="Foil token (empty: the corrupted run's top; without a corrupted prompt, "
                                            "the clean run's second)", elem_id="patch-foil", min_width=120)
                with gr.Row():
                    mode = gr.Radio(["denoise", "noise"], value="denoise", label="Direction", elem_id="patch-mode",
                                    min_width=160)
                    fields = layer_head(services.models, picker, initial, "patch", note="for one layer's heads; ",
                                        row=False, head=False)
                fields.note.render()
                layer = fields.layer
        with gr.Column(scale=3, min_width=340):
            gr.Markdown(HOW_TO_READ, elem_classes=["how-to-read"])
            note = gr.Markdown(elem_id="patch-note")
            sweep_fig = gr.Plot(label="The sweep: one patched run per cell", elem_id="patch-map", visible=False)
            sweep_file = gr.File(label="The sweep's data (CSV)", interactive=False, elem_id="patch-file", height=80,
                                 visible=False)
    with gr.Accordion("How to read this tab", open=False):
        gr.Markdown(INTRO)
    attribution = attribution_section(services, picker, clean, corrupted, answer, foil)
    flow = flow_section(services, picker, clean)
    shortcut = shortcuts_section(services, picker, clean, corrupted, answer, foil, mode)
    picked = click_bridge("patch-head-bridge", ["patch-map", "patch-dla"], HEAD_READ)

    sweep = dict(fn=handler(views.patch_view, services, "patch_sweep", heavy="A patching sweep"),
                 inputs=[picker.model, clean, corrupted, answer, foil, site, mode, layer],
                 outputs=[note, sweep_fig, sweep_file], **ON_HEAVY)
    run.click(lambda: (gr.Plot(visible=True), gr.File(visible=True)), None, [sweep_fig, sweep_file],
              api_visibility="private", queue=False).then(**sweep, api_name="patch_sweep")

    @user_errors
    def fill(name):
        if name not in PRESETS:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return *PRESETS[name], "", ""

    preset.input(fill, preset, [clean, corrupted, answer, foil], api_visibility="private", queue=False)

    # the tab opens on the first preset's map, computed once per model for every visitor (no session's heavy job);
    # the CSV expires, so each page gets its own with its first Patch
    first_sweep = dict(sweep, fn=handler(views.patch_view, services, "first_patching"))
    return Tab(text=clean, layer=layer, corrupted=corrupted, picked=picked, reveal=[sweep_fig],
               opening=opening(services, "patching", first_sweep, fresh=(2,)), follows=True,
               results=[*attribution["results"], *flow["results"], *shortcut["results"]],
               press={note: run, **attribution["press"], **flow["press"], **shortcut["press"]},
               typical=[preset, mode], over_corpus=shortcut["over_corpus"], settings={"site": site})


def attribution_section(services, picker, clean, corrupted, answer, foil) -> dict:
    """Returns its results and its note's button, for a model change (Tab.results, Tab.press)."""
    gr.Markdown("### Direct logit attribution: what each head writes into the answer")
    button = gr.Button("Attribute the logit difference", elem_id="patch-dla-run")
    note = gr.Markdown(elem_id="patch-dla-note")
    figure = gr.Plot(label="Each head's and each MLP's direct part", elem_id="patch-dla", visible=False)
    file = gr.File(label="The parts (CSV)", interactive=False, elem_id="patch-dla-file", height=80, visible=False)
    button.click(lambda: (gr.Plot(visible=True), gr.File(visible=True)), None, [figure, file],
                 api_visibility="private", queue=False).then(
        handler(views.attribution_view, services, "logit_attribution"),
        [picker.model, clean, corrupted, answer, foil], [note, figure, file], api_name="logit_attribution",
        **ON_ANALYSIS)
    return dict(results=[note, figure, file], press={note: button})


def flow_section(services, picker, clean) -> dict:
    """Returns its results and its note's button, for a model change (Tab.results, Tab.press)."""
    gr.Markdown("### The information-flow graph of the clean prompt's prediction")
    with gr.Row():
        threshold = gr.Slider(0.0, 0.5, value=DEFAULT_THRESHOLD, step=0.01, label="Threshold: keep edges of at least "
                              "this importance (0–0.5)", elem_id="patch-flow-threshold", scale=3)
        button = gr.Button("Draw the graph", elem_id="patch-flow-run", scale=1)
    note = gr.Markdown(elem_id="patch-flow-note")
    figure = gr.Plot(label="Tokens across, layers up; width ∝ importance", elem_id="patch-flow", visible=False)
    file = gr.File(label="The kept edges (CSV)", interactive=False, elem_id="patch-flow-file", height=80,
                   visible=False)
    cache = gr.State(None, time_to_live=1800)   # a FlowCache: the ticket of the graph kept in services.kept
    event = dict(fn=handler(views.flow_view, services, "flow_graph"), inputs=[picker.model, clean, threshold, cache],
                 outputs=[note, figure, file, cache], **ON_ANALYSIS)
    button.click(lambda: (gr.Plot(visible=True), gr.File(visible=True)), None, [figure, file],
                 api_visibility="private", queue=False).then(**event, api_name="flow_graph")
    threshold.release(**event, api_visibility="private")
    edge = edge_box(services, picker, clean, threshold, cache)
    return dict(results=[note, figure, file, cache, *edge["results"]], press={note: button, **edge["press"]})


EDGE_READ = ("return point.customdata === undefined ? null : "
             "[].concat(point.customdata).map(String).find((v) => /^edge \\d+\\.\\d+\\.\\d+$/.test(v)) || null;")


def edge_box(services, picker, clean, threshold, cache) -> dict:
    """Why an attention edge of the flow graph is there (`edge_attribution`): a click on an edge's midpoint (or
    its layer, target and source typed) traces each of its heads' query and key to earlier components."""
    with gr.Accordion("Why this edge? Its heads' query and key, traced to earlier components", open=False,
                      elem_id="patch-edge-box") as box:
        gr.Markdown("Click an attention edge's midpoint in the graph (or type its layer and tokens) to split each of "
                    "its heads' scores into the earlier components that wrote the query and the key.",
                    elem_classes=["field-note"])
        with gr.Row():
            layer = gr.Number(0, label="Layer", precision=0, elem_id="patch-edge-layer", min_width=80)
            target = gr.Number(0, label="Target (later token)", precision=0, elem_id="patch-edge-target",
                               min_width=80)
            source = gr.Number(0, label="Source (token read)", precision=0, elem_id="patch-edge-source",
                               min_width=80)
            run = gr.Button("Why this edge?", elem_id="patch-edge-run", min_width=120)
        note = gr.Markdown(elem_id="patch-edge-note")
        figure = gr.Plot(label="Each head's relative score, by the components of its query and its key",
                         show_label=False, elem_id="patch-edge", visible=False)
    event = dict(fn=handler(views.edge_view, services, "edge_attribution"),
                 inputs=[picker.model, clean, threshold, layer, target, source, cache],
                 outputs=[note, figure, cache], **ON_ANALYSIS)
    run.click(lambda: gr.Plot(visible=True), None, figure, api_visibility="private", queue=False).then(
        **event, api_name="edge_attribution")
    clicked = click_bridge("patch-edge-bridge", ["patch-flow"], EDGE_READ)

    @user_errors
    def chosen(value: str):
        numbers = str(value).removeprefix("edge ").split(".")
        return (*(int(n) for n in numbers), gr.Accordion(open=True), gr.Plot(visible=True))

    clicked.click(chosen, clicked, [layer, target, source, box, figure], api_visibility="private",
                  queue=False).then(**event, api_visibility="private")
    return dict(results=[note, figure], press={note: run})


SHORTCUTS_INTRO = """Exact patching runs the model once per cell; researchers often use cheaper estimates instead.
This compares them with the exact sweep on the pair above, in the direction chosen above: **AtP** (the activation
difference times the metric's gradient, one forward and one backward pass), **AtP\\*** (AtP with the attention
recomputed where a patch reaches a later layer's queries and keys; not the paper's second fix, for effects that
cancel), **EAP-IG** (the gradient averaged along the line between the two prompts) and, for heads, the **flow
graph** (a proximity, not a cause). Each point is a cell, exact effect across, estimate up; a perfect estimate
lies on the dotted diagonal. It runs the exact sweep and every method, each timed: the slowest button of this tab.
""" + views.WARNING

OVER_PAIRS_WORDS = (f"Over {DEFAULT_N} IOI pairs: every shortcut on every head and on the residual stream, in this "
                    "direction, with intervals (Across texts tab)")
SHORTCUT_SITE_CHOICES = [("each head (layer × head)", "z"), ("residual stream (layer × position)", "resid_pre")]
METHOD_CHOICES = [("AtP", "atp"), ("AtP*", "atp*"), ("EAP-IG", "ig"), ("flow graph (heads only)", "flow")]


def shortcuts_section(services, picker, clean, corrupted, answer, foil, mode) -> dict:
    """How good are the shortcuts: the scatter of exact against each method (`shortcut_report`) and one method's
    map (`approximate_sweep`). Returns its results and its notes' buttons (Tab.results, Tab.press)."""
    gr.Markdown("### How good are the shortcuts?")
    gr.Markdown(SHORTCUTS_INTRO)
    with gr.Row():
        site = gr.Dropdown(choices=SHORTCUT_SITE_CHOICES, value="z", label="Where to compare",
                           elem_id="patch-shortcut-site", scale=2)
        button = gr.Button("Compare with exact patching", elem_id="patch-shortcut-run", scale=1)
    # the same comparison over the built-in IOI pairs, in the Across texts tab (ui/page.py wires it)
    over_pairs = gr.Button(OVER_PAIRS_WORDS, size="sm", elem_id="patch-shortcut-typical")
    note = gr.Markdown(elem_id="patch-shortcut-note")
    # no label badge: it would sit over the figure's own title, which says the same and more
    figure = gr.Plot(label="Exact effect against each shortcut's estimate, one point per cell", show_label=False,
                     elem_id="patch-shortcut", visible=False)
    button.click(lambda: gr.Plot(visible=True), None, figure, api_visibility="private", queue=False).then(
        handler(views.shortcuts_view, services, "shortcut_report", heavy="A shortcut comparison"),
        [picker.model, clean, corrupted, answer, foil, site, mode], [note, figure], api_name="shortcut_report",
        **ON_HEAVY)
    with gr.Accordion("One shortcut's whole map", open=False, elem_id="patch-estimate-more"):
        with gr.Row():
            method = gr.Dropdown(choices=METHOD_CHOICES, value="atp", label="Shortcut", elem_id="patch-estimate-method",
                                 scale=2)
            one = gr.Button("Map it", elem_id="patch-estimate-run", scale=1)
        one_note = gr.Markdown(elem_id="patch-estimate-note")
        one_figure = gr.Plot(label="The shortcut's estimate of every cell", elem_id="patch-estimate", visible=False)
        one_file = gr.File(label="The estimate (CSV)", interactive=False, elem_id="patch-estimate-file", height=80,
                           visible=False)
    one.click(lambda: (gr.Plot(visible=True), gr.File(visible=True)), None, [one_figure, one_file],
              api_visibility="private", queue=False).then(
        handler(views.estimate_view, services, "approximate_sweep"),
        [picker.model, clean, corrupted, answer, foil, site, mode, method], [one_note, one_figure, one_file],
        api_name="approximate_sweep", **ON_ANALYSIS)
    return dict(results=[note, figure, one_note, one_figure, one_file], press={note: button, one_note: one},
                over_corpus={"shortcuts": over_pairs})
