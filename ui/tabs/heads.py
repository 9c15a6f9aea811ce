"""Heads tab: what each head does (scores per layer × head, the induction probe), whether the output depends on
it (ablation, the sweep), which inputs one prediction depends on (attribution against attention), what each
layer would predict (the logit lens), how surprised the model is by each token, and attention sinks (each head's
attention on the first token, and the text read through a window of keys with or without them)."""

from __future__ import annotations

import gradio as gr

from ui.services.corpus.composition import DEFAULT_TEXTS, MAX_TEXTS as MAX_COMPOSITION_TEXTS
from ui.services.heads import (COMPLETENESS_STEPS, HEADS_KEPT, MAX_HEADS_TOKENS, MAX_IG_STEPS, MAX_SWEEP_TOKENS,
                               SWEEP_BATCH, lm_head_reason, next_token_reason, scored_shape)
from ui.services.kept import keeping
from ui.services.sinks import EPSILON, MAX_SINKS, MAX_STREAMING_TOKENS, POSITION_WORDS
from ui.tabs.events import ON_ANALYSIS, ON_HEAVY, handler, opening, user_errors
from ui.tabs.widgets import Tab, click_bridge, export_row, layer_head, read_example, run_checked, upload
from ui.views import heads as views
from ui.views import sinks as sink_views
from ui.views.corpus.composition import composition_opening, composition_view

CACHE_TTL_S = 1800  # a session's kept results are dropped after half an hour

LEAD = """**What each head does, and whether the output depends on it**: scores of every head's attention map
(eqs. 2.1 and 3.1 in the repository's docs/theory.md), ablation, attribution, the logit lens and surprisal."""

INTRO = f"""Heads specialise. Each score below is one number per layer × head, measured on your text: where the
head's attention goes. Choose a tile (click it, or type its layer and head) to see that head's map. Then ask
whether the output **depends** on a head (ablation), which inputs one prediction is **sensitive** to
(attribution), what each layer **would predict** (the logit lens) and how **surprised** the model is by each
token. The tab reads the first {MAX_HEADS_TOKENS} tokens of the text; the sweep the first
{MAX_SWEEP_TOKENS}."""
HOW_TO_READ = """**How to read it:** each tile is one head, layers across and heads down; its colour is the chosen
score on your text, and a ring marks a head that passes the score's naming threshold. Click a tile to open that
head's attention map below it (a row per query token, a column per key)."""
ATTRIBUTION_HELP = f"""Each box takes one token as it appears in running text (a word's token usually starts
with its space: `' Mary'`). With a **foil**, every view that uses gradients explains logit(target) − logit(foil):
why this token rather than that one. Integrated gradients walk from the **baseline** to the text (all zeros is a poor
start where nothing else enters the stream, as in Llama-style models: the final norm makes a near-zero stream
full-sized, so the path jumps at its start); the note measures their completeness error (Σ attributions against
f(text) − f(baseline)) at {', '.join(map(str, COMPLETENESS_STEPS))} steps and at yours."""
SURPRISAL_CSS = """
.surprisal { white-space: pre-wrap; line-height: 1.9; }
.surprisal .tok { border-radius: 3px; padding: 1px 0; cursor: help; }
.surprisal-legend { font-size: 0.85em; opacity: 0.7; margin-bottom: 0.4em; }
"""
# a click on a tile of the score map (x = layer, y = head) reads "layer.head"
TILE_READ = 'return point.data.type === "heatmap" ? `${point.x}.${point.y}` : null;'


def shown(components: list) -> dict:
    """The arguments of the quick event that shows `components`, hidden until their section has a result; a run
    chains its own event after it, so its progress shows in their boxes."""
    def show():
        updates = [gr.update(visible=True) for _ in components]
        return updates if len(updates) > 1 else updates[0]

    return dict(fn=show, inputs=None, outputs=components, api_visibility="private", queue=False)


def kept_cache(view, services):
    """The view with the session's HeadsCache in the server-wide KeptStore: the State holds its KeptRef, and a
    cache the budget dropped is recomputed."""
    return keeping(view, services.kept, HEADS_KEPT)


def build(services, picker, initial) -> Tab:
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    cache = gr.State(None, time_to_live=CACHE_TTL_S)
    atlas = atlas_section(services, picker, initial, cache)
    heads_box, ablation = ablation_section(services, picker, atlas["text"], atlas["score"], cache)
    atlas["add"].click(user_errors(views.add_head), [heads_box, atlas["layer"], atlas["head"]], heads_box,
                       api_visibility="private", queue=False)
    # each section's results and the buttons that fill its notes, cleared on a model change
    sections = [ablation, attribution_section(services, picker, initial, atlas["text"], cache),
                lens_section(services, picker, atlas["text"], cache),
                surprisal_section(services, picker, atlas["text"], cache),
                sinks_section(services, picker, atlas["text"]),
                composition_section(services, picker)]
    # the atlas's last output is the session's HeadsCache, kept in the KeptStore (the State holds its KeptRef);
    # the views never change a passed-in one
    press, cannot, parts = {atlas["note"]: atlas["run"]}, {}, {}
    for section in sections:
        press.update(section["press"])
        cannot.update(section.get("cannot", {}))
        parts.update(section.get("parts", {}))
    return Tab(text=atlas["text"], layer=atlas["layer"], head=atlas["head"],
               run_event={**atlas["event"], "api_visibility": "private"}, reveal=atlas["figures"],
               settings={"score": atlas["score"]},
               opening=opening(services, "heads", atlas["event"], fresh=(5,)), follows=True,
               results=[c for section in sections for c in section["results"]],
               press=press, cannot_press=cannot, parts=parts)


def unless(services, reason, what: str):
    """A model's name → why `what` cannot run on it (reason(model, what)), or "": a cleared note's line."""
    return lambda name: reason(services.models.get(name), what) or ""


def atlas_section(services, picker, initial, cache) -> dict:
    """The scores of every head, the chosen score's map and one head's map; the export of every score. Returns
    its inputs, its run event and the figures that event fills (hidden until it has)."""
    model = picker.model
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            text = gr.Textbox(label="Text", value=read_example("attention.txt"), lines=3, max_lines=6,
                              elem_id="heads-text")
            score = gr.Dropdown(choices=views.score_choices(initial), value="previous_token", label="Score",
                                elem_id="heads-score")
            run = gr.Button("Score every head", variant="primary", elem_id="heads-run")
            note = gr.Markdown(label="note", elem_id="heads-note")
            fields = layer_head(services.models, picker, initial, "heads", shape=scored_shape)
            layer, head = fields.layer, fields.head
            with gr.Row():
                open_button = gr.Button("Open this head", elem_id="heads-open", min_width=120)
                add_button = gr.Button("Add it to the ablation list", elem_id="heads-add", min_width=120)
            capabilities = gr.Markdown(views.model_note(initial), elem_id="heads-model-note")
            upload(text, "heads", services.settings.text_cap_bytes)
            export_button, export_file, export_note, _ = export_row("heads", "Export every head's scores (CSV)")
        with gr.Column(scale=3, min_width=340):
            gr.Markdown(HOW_TO_READ, elem_classes=["how-to-read"])
            score_map = gr.Plot(label="Score per layer × head (click a tile)", elem_id="heads-map", visible=False)
            head_fig = gr.Plot(label="The chosen head on your text", elem_id="heads-head-view", visible=False)
    thresholds = gr.Markdown(label="named heads", elem_id="heads-named")
    with gr.Accordion("The top five heads per score", open=False, elem_id="heads-top-box"):
        top = gr.Dataframe(headers=["score", "rank", "layer.head", "value", "named"], label="Top heads per score",
                           interactive=False, elem_id="heads-top")
    with gr.Accordion("How to read this tab", open=False):
        gr.Markdown(INTRO)
    bridge = click_bridge("heads-tile-bridge", ["heads-map"], TILE_READ)

    figures = [score_map, head_fig]
    atlas = dict(fn=handler(kept_cache(views.atlas_view, services), services, "head_atlas"),
                 inputs=[model, text, score, layer, head, cache],
                 outputs=[note, score_map, top, thresholds, head_fig, cache], **ON_ANALYSIS)
    # a wrong layer or head is a note under them, and the figures keep the last result
    run_checked(run.click, services.models, model, fields, atlas, reveal=figures, api_name="head_atlas")
    run_checked(score.input, services.models, model, fields, atlas, reveal=figures, api_visibility="private")
    show_head = dict(fn=handler(views.open_head, services, "show_head", progress=False),
                     inputs=[model, text, layer, head], outputs=head_fig, **ON_ANALYSIS)
    run_checked(open_button.click, services.models, model, fields, show_head, reveal=[head_fig],
                api_visibility="private")
    bridge.click(handler(views.pick_tile, services, "pick_tile", progress=False), [model, text, bridge],
                 [layer, head, head_fig], api_visibility="private", **ON_ANALYSIS)
    export_button.click(handler(kept_cache(views.export_data, services), services, "export_heads"),
                        [model, text, cache], [export_file, export_note, cache], api_name="export_heads", **ON_ANALYSIS)

    @user_errors
    def scores_for(name):
        loaded = services.models.get(name)
        return gr.Dropdown(choices=views.score_choices(loaded), value="previous_token"), views.model_note(loaded)

    picker.after.add(scores_for, [model], [score, capabilities])
    return dict(text=text, layer=layer, head=head, score=score, add=add_button, event=atlas, figures=figures,
                note=note, run=run)


def ablation_section(services, picker, text, score, cache) -> gr.Textbox:
    """Heads removed by hand or the top 5 by a score, and the sweep of every head alone."""
    model = picker.model
    gr.Markdown(
        "### Ablation: does the output depend on these heads?\nRemove heads (their output before W^O set to zero, "
        "or to its mean over the text) and measure the loss at every token: of the next token for a decoder, of "
        "the token itself for an encoder with a masked-LM head."
    )
    with gr.Row():
        heads_box = gr.Textbox(label="Heads as layer.head, comma-separated", placeholder="e.g. 3.2, 5.0",
                               elem_id="heads-ablate-list")
        kind = gr.Radio(["zero", "mean"], value="zero", label="Ablation", elem_id="heads-ablation")
    with gr.Row():
        top5 = gr.Button("Top 5 by the chosen score", elem_id="heads-top5")
        ablate_button = gr.Button("Ablate", variant="primary", elem_id="heads-ablate")
        sweep_button = gr.Button("Sweep: ablate every head alone", elem_id="heads-sweep-run")
    ablation_note = gr.Markdown(label="ablation note", elem_id="heads-ablation-note")
    with gr.Row():
        loss_fig = gr.Plot(label="Loss change per token", elem_id="heads-ablation-loss", visible=False)
        changed = gr.Dataframe(
            headers=["position", "token", "clean prediction", "ablated prediction", "answer in the text"],
            label="Changed predictions", interactive=False, elem_id="heads-ablation-changed", visible=False,
        )
    gr.Markdown(
        f"The sweep removes each head alone, {SWEEP_BATCH} heads per forward pass, on the first "
        f"{MAX_SWEEP_TOKENS} tokens of the text, and draws the mean loss increase beside the chosen "
        "score's map."
    )
    sweep_note = gr.Markdown(label="sweep note", elem_id="heads-sweep-note")
    sweep_fig = gr.Plot(label="Loss increase beside the score", elem_id="heads-sweep-map", visible=False)

    ablate_button.click(**shown([loss_fig, changed])).then(
        handler(views.ablation_view, services, "ablate_heads"), [model, text, heads_box, kind],
        [ablation_note, loss_fig, changed], api_name="ablate_heads", **ON_ANALYSIS)
    top5.click(handler(kept_cache(views.top_heads_text, services), services, "pick_top", progress=False),
               [model, text, score, cache], [heads_box, cache], api_visibility="private", **ON_ANALYSIS)
    sweep_button.click(**shown([sweep_fig])).then(
        handler(kept_cache(views.sweep_view, services), services, "ablation_sweep", heavy="An ablation sweep"),
        [model, text, kind, score, cache], [sweep_note, sweep_fig, cache], api_name="ablation_sweep", **ON_HEAVY)
    return heads_box, dict(results=[ablation_note, loss_fig, changed, sweep_note, sweep_fig],
                           press={ablation_note: ablate_button, sweep_note: sweep_button},
                           cannot={ablation_note: unless(services, lm_head_reason, "Ablation"),
                                   sweep_note: unless(services, lm_head_reason, "The sweep")})


def attribution_section(services, picker, initial, text, cache) -> dict:
    """Five answers to which inputs one prediction depends on, side by side."""
    gr.Markdown(
        "### Attribution against attention, for one prediction\nFive answers to *which inputs does this prediction "
        "depend on?*: the head's attention row, the mean of its layer's heads, attention rollout through every "
        "layer, gradient × input, and integrated gradients. " + views.NOT_EXPLANATION
    )
    with gr.Row():
        position = gr.Number(value=-1, label="Position (−1 = the last token)", precision=0,
                             elem_id="heads-attr-position")
        fields = layer_head(services.models, picker, initial, "heads-attr", keep=False, row=False)
        steps = gr.Number(value=32, label=f"Integrated-gradient steps (1–{MAX_IG_STEPS})", precision=0,
                          elem_id="heads-attr-steps")
    fields.note.render()
    with gr.Row():
        target = gr.Textbox("", label="Target token", placeholder="empty: the model's top token; e.g. ' Mary'",
                            elem_id="heads-attr-target")
        foil = gr.Textbox("", label="Foil token", placeholder="empty: no foil; e.g. ' John'", elem_id="heads-attr-foil")
        baseline = gr.Radio(views.BASELINE_CHOICES, value="pad", label="Integrated-gradients baseline",
                            elem_id="heads-attr-baseline")
        button = gr.Button("Attribute", variant="primary", elem_id="heads-attr-run")
    with gr.Accordion("What the boxes mean", open=False):
        gr.Markdown(ATTRIBUTION_HELP)
    note = gr.Markdown(label="attribution note", elem_id="heads-attr-note")
    figure = gr.Plot(label="Five views of one prediction", elem_id="heads-attr-chart", visible=False)
    correlations = gr.Dataframe(headers=["", *views.ATTRIBUTION_VIEWS], label="Spearman rank correlations",
                                interactive=False, elem_id="heads-attr-corr", visible=False)
    event = dict(fn=handler(kept_cache(views.attribution_view, services), services, "attribute",
                            heavy="Integrated gradients"),
                 inputs=[picker.model, text, position, fields.layer, fields.head, steps, target, foil, baseline, cache],
                 outputs=[note, figure, correlations, cache], **ON_HEAVY)
    run_checked(button.click, services.models, picker.model, fields, event, reveal=[figure, correlations],
                api_name="attribute")
    return dict(results=[note, figure, correlations], press={note: button},
                cannot={note: unless(services, lm_head_reason, "Attribution")})


def lens_section(services, picker, text, cache) -> dict:
    gr.Markdown("### Logit lens: what each layer would predict")
    button = gr.Button("Read every layer", elem_id="heads-lens-run")
    note = gr.Markdown(label="lens note", elem_id="heads-lens-note")
    figure = gr.Plot(label="Logit lens", elem_id="heads-lens", visible=False)
    button.click(**shown([figure])).then(
        handler(kept_cache(views.lens_view, services), services, "logit_lens"), [picker.model, text, cache],
        [note, figure, cache], api_name="logit_lens", **ON_ANALYSIS)
    return dict(results=[note, figure], press={note: button},
                cannot={note: unless(services, lm_head_reason, "The logit lens")})


def surprisal_section(services, picker, text, cache) -> dict:
    gr.Markdown("### Surprisal: how unexpected each token is")
    button = gr.Button("Shade the text by loss", elem_id="heads-surprisal-run")
    stats = gr.Markdown(label="surprisal stats", elem_id="heads-surprisal-stats")
    page = gr.HTML(label="shaded text", elem_id="heads-surprisal", css_template=SURPRISAL_CSS)
    button.click(handler(kept_cache(views.surprisal_view, services), services, "surprisal"),
                 [picker.model, text, cache], [stats, page, cache], api_name="surprisal", **ON_ANALYSIS)
    return dict(results=[stats, page], press={stats: button},
                cannot={stats: unless(services, next_token_reason, "Surprisal")})


SINKS_INTRO = f"""Many heads put most of their attention on the text's first token, whatever it is: an *attention
sink*, where a head parks the attention it has no use for. The map shows each head's attention on the first token,
averaged over the text's queries; a ring marks a head above ε = {EPSILON:g} (Gu et al.'s sink heads)."""
WINDOW_INTRO = f"""The text read as StreamingLLM reads a long one: each query sees only the last `window` keys, plus the
first `sinks` tokens when asked. On the trained models StreamingLLM measured, the loss without sinks jumps where the
window starts hiding the first token, and with them it stays near full attention. The reading takes the whole text,
up to {MAX_STREAMING_TOKENS:,} tokens (upload a long one)."""
POSITION_CHOICES = [(f"{name}: {words}", name) for name, words in POSITION_WORDS.items()]


def sinks_section(services, picker, text) -> dict:
    """The sink map (`sink_scores`) and the text read through a window of keys (`streaming_perplexity`, a heavy
    job: positions="cache" reads one decode step per token). Returns its results and its notes' buttons."""
    gr.Markdown("### Attention sinks: how much each head puts on the first token")
    gr.Markdown(SINKS_INTRO)
    button = gr.Button("Map the sinks", elem_id="heads-sinks-run")
    note = gr.Markdown(label="sinks note", elem_id="heads-sinks-note")
    figure = gr.Plot(label="Mean attention on the first token per layer × head", elem_id="heads-sinks-map",
                     visible=False)
    sink_map = dict(fn=handler(sink_views.sinks_view, services, "sink_scores"), inputs=[picker.model, text],
                    outputs=[note, figure], **ON_ANALYSIS)
    button.click(**shown([figure])).then(**sink_map, api_name="sink_scores")
    with gr.Accordion("Compare the installed models on this text", open=False, elem_id="heads-sink-compare-box"):
        compare = gr.Button("Compare the installed models", elem_id="heads-sink-compare-run")
        compare_note = gr.Markdown(label="comparison note", elem_id="heads-sink-compare-note")
        depth = gr.Plot(label="Mean attention on the first token by depth, per model",
                        elem_id="heads-sink-compare", visible=False)
    compare.click(**shown([depth])).then(
        handler(sink_views.comparison_view, services, "sink_comparison", heavy="A sink comparison"),
        [picker.model, text], [compare_note, depth], api_name="sink_comparison", **ON_HEAVY)
    with gr.Accordion("Read the text through a window of keys, with and without sinks", open=False,
                      elem_id="heads-window-box"):
        gr.Markdown(WINDOW_INTRO)
        with gr.Row():
            window = gr.Number(value=16, label=f"Window: keys each query reads (1–{MAX_STREAMING_TOKENS:,})",
                               precision=0, elem_id="heads-window-size")
            sinks = gr.Number(value=4, label=f"Sinks: first tokens kept (0–{MAX_SINKS})", precision=0,
                              elem_id="heads-window-sinks")
            positions = gr.Radio(POSITION_CHOICES, value="text", label="Positions",
                                 elem_id="heads-window-positions")
            run = gr.Button("Read through the window", elem_id="heads-window-run")
            stop = gr.Button("Stop", elem_id="heads-window-stop", variant="stop", size="sm", min_width=80)
        window_note = gr.Markdown(label="window note", elem_id="heads-window-note")
        curve = gr.Plot(label="Next-token loss per position", elem_id="heads-window-loss", visible=False)
    reading = run.click(**shown([curve])).then(
        handler(sink_views.streaming_view, services, "streaming_perplexity", heavy="A streaming perplexity"),
        [picker.model, text, window, sinks, positions], [window_note, curve], api_name="streaming_perplexity",
        **ON_HEAVY)
    # Stop closes the view's generator: the reading stops at its next token (ui.services.jobs.stream_job)
    stop.click(None, None, None, cancels=[reading], api_visibility="private")
    return dict(results=[note, figure, compare_note, depth, window_note, curve],
                press={note: button, compare_note: compare, window_note: run},
                parts={"heads-sinks-map": ({**sink_map, "api_visibility": "private"}, [figure])})


COMPOSITION_INTRO = """Why does a head attend where it does? Its score of a query and a key splits exactly into the
earlier components that wrote them: embeddings, each earlier head, each MLP. This runs the split over the induction
texts on the head's most attended pairs and shows each component's share, with its interval, beside what the
weights alone allow (Elhage et al.'s composition scores). It opens on the model's strongest induction head (the
atlas's induction score), whose keys should come from a previous-token head: see whether they do."""


def composition_section(services, picker) -> dict:
    """What feeds a head's keys or queries over the induction texts (`composition_over`), on opening the model's
    strongest induction head. Returns its results and its note's button."""
    # folded, as the tab's other long sections: the atlas's first screen stays short
    with gr.Accordion("What feeds a head: its keys and queries, traced to earlier heads", open=False,
                      elem_id="heads-composition-box") as box:
        gr.Markdown(COMPOSITION_INTRO)
        with gr.Row():
            # its own head, set on opening to the model's strongest induction head (the atlas's stays as chosen)
            layer = gr.Number(1, label="Layer", precision=0, minimum=0, elem_id="heads-composition-layer")
            head = gr.Number(0, label="Head", precision=0, minimum=0, elem_id="heads-composition-head")
            side = gr.Radio([("its keys", "key"), ("its queries", "query")], value="key", label="Trace",
                            elem_id="heads-composition-side")
            n = gr.Number(DEFAULT_TEXTS, label=f"Induction texts (1–{MAX_COMPOSITION_TEXTS})", precision=0,
                          elem_id="heads-composition-n")
            button = gr.Button("What feeds it?", elem_id="heads-composition-run")
        note = gr.Markdown(elem_id="heads-composition-note")
        figure = gr.Plot(label="Each component's share, and what the weights allow", show_label=False,
                         elem_id="heads-composition", visible=False)
    box.expand(handler(composition_opening, services, "composition_opening", progress=False), picker.model,
               [layer, head], api_visibility="private")
    button.click(**shown([figure])).then(
        handler(composition_view, services, "composition_over", heavy="A composition over the induction texts"),
        [picker.model, layer, head, side, n], [note, figure], api_name="composition_over", **ON_HEAVY)
    return dict(results=[note, figure], press={note: button})
