"""Masks tab: what the causal mask, the padding mask and the 1/√d_k factor each change, measured on the
loaded model and the user's text."""

from __future__ import annotations

import gradio as gr

from ui.plots.attention import STAGE_TITLES, STAGES
from ui.services.approx import BUDGET_LIMITS, FITS, LAYERS_ALL, MAX_APPROX_TOKENS, METHODS, NAMES
from ui.services.masks import MAX_STAGE_WINDOW, MAX_WINDOW_TOKENS
from ui.tabs.events import ON_ANALYSIS, handler, opening
from ui.tabs.widgets import Tab, export_row, layer_head, read_example, run_checked, text_with_upload
from ui.views import approx as approx_views
from ui.views.masks import export_data, mask_view, window_view

LEAD = """**What each safeguard of eq. 2.1 changes**: the scores QKᵀ/√d_k, the mask M and the softmax step by step,
then the causal mask, the padding mask and the 1/√d_k factor switched off on the loaded model."""

HOW_TO_READ = """Each square is one window of your text: a row is a query token, a column a key token it may look at.
Red and blue are scores above and below 0, grey is masked (−∞, never looked at), and the softmax turns each row
into weights that sum to 1."""

INTRO = """Eq. 2.1 step by step for a window of tokens: scores QKᵀ/√d_k, then the mask M added (0 where attention is
allowed, −∞ where it is not, drawn grey), then the row-wise softmax. Below, the model is run on your text with each
safeguard switched off, to measure what it protects against. The window and the two texts of the padding demo
are under "Padding texts and window", beside the button."""

STAGE_MIN_WIDTH = 260  # three stages side by side in the figures' column of a wide screen, one a row on a phone


def stage_rows() -> list[gr.Plot]:
    """The six stages of eq. 2.1, three a row (causal mask on, then off), in rows whose figures wrap one under the
    other on a narrow screen. elem_ids mask-stage-{on,off}-{scores,masked,softmax}; all inside #mask-stages."""
    figures = []
    with gr.Column(elem_id="mask-stages"):
        for mask in ("on", "off"):
            with gr.Row(equal_height=False):
                for stage in STAGES:
                    figures.append(gr.Plot(label=f"causal mask {mask}: {STAGE_TITLES[stage]}", show_label=False,
                                           elem_id=f"mask-stage-{mask}-{stage}", elem_classes=["mask-stage"],
                                           min_width=STAGE_MIN_WIDTH, visible=False))
    return figures


WINDOW_INTRO = """The model run twice on your text (up to its first {n} tokens): as loaded, and with every layer's mask
narrowed to a window of w keys (eq. 6.5), the first g tokens kept global (local + global; g = 0 is a plain window).
On a decoder the window is causal: each query reads its last w keys and the first g. On an encoder (MiniLM) it is
symmetric, as in Longformer: each query reads the keys fewer than w places away on either side, and the g global
tokens read every key and are read by every query. Shown: the mask, the chosen layer and head's weights in both
runs and their difference, what the window changed in the output (a decoder's next-token KL at each position; an
encoder's relative change of each position's final hidden state, and the cosine between the mean-pooled sentence
embeddings of the two runs), and the attention cost counted. A setting the demo cannot run is said in the note
under the button, and the figures stay empty."""


def window_section() -> tuple[tuple, list[gr.Plot]]:
    """The sliding-window demo: its fields, button and outputs (note, mask, weights, output change, cost, words), the
    figures hidden until a result. elem_ids window-*."""
    gr.Markdown("### Sliding window and local + global attention")
    gr.Markdown(WINDOW_INTRO.format(n=MAX_WINDOW_TOKENS), elem_classes=["how-to-read"])
    with gr.Row():
        size = gr.Number(value=4, label=f"Window w (1–{MAX_WINDOW_TOKENS} keys)", precision=0, min_width=120,
                         elem_id="window-size")
        global_tokens = gr.Number(value=0, label="Global tokens g (first keys every query sees)", precision=0,
                                  min_width=120, elem_id="window-global")
        button = gr.Button("Run with the window", elem_id="window-run", min_width=120)
    note = gr.Markdown(elem_id="window-note")
    figures = [gr.Plot(label=label, elem_id=f"window-{key}", min_width=320, visible=False)
               for key, label in (("mask", "Window mask"), ("weights", "One head's weights, full vs window"),
                                  ("kl", "What the window changed: next-token KL or hidden-state change"),
                                  ("cost", "Attention cost"))]
    words = gr.Markdown(elem_id="window-words")
    return (button, size, global_tokens, [note, *figures, words]), figures


APPROX_INTRO = """Attention reads every earlier key for every query, n² scores. Each method here replaces eq. 2.1 on
the chosen layers, as one more switch of the same attention function: **top-k** keeps each query's k highest-scoring
keys; **BigBird** reads blocks (its own and its neighbours, the first global blocks, a few random ones);
**Performer** (FAVOR+) replaces exp(q·k) with random features, linear in n; **Linformer** projects keys and values
along the sequence to rank rows (bidirectional models only, such as MiniLM); **low-rank KV** keeps r numbers per
token in the cache instead of the keys and values. The model reads the text (every token, at most {n}) with exact
attention and with the approximation: each head's error is measured beside exact attention on the very queries,
keys and values it saw (grey cells: heads left exact), and the model's change is its perplexity (a decoder) or its
sentence embedding's cosine (an encoder), with the KV cache's bytes per token. The cost button draws the published
bench run (time against length, where each approximation becomes faster than exact attention) and times the
kernels here, live, at short lengths."""
APPROX_DEFAULTS = {"k": 32, "block": 16, "global_blocks": 1, "random_blocks": 1, "features": 64, "rank": 32, "seed": 0}
APPROX_LABELS = {"k": "k, keys each query keeps", "block": "Block, tokens", "global_blocks": "Global blocks",
                 "random_blocks": "Random blocks", "features": "Random features", "rank": "Rank", "seed": "Seed"}


def approx_fields() -> tuple[dict, gr.Radio]:
    """The budget's fields, each shown for the methods that take it (elem_ids approx-<name>), and Linformer's fit."""
    fields = {}
    with gr.Row():
        for name, value in APPROX_DEFAULTS.items():
            low, high, _ = BUDGET_LIMITS[name]
            fields[name] = gr.Number(value=value, label=f"{APPROX_LABELS[name]} ({low}–{high:,})", precision=0,
                                     min_width=110, elem_id=f"approx-{name.replace('_', '-')}",
                                     visible=name in METHODS["topk"])
        fit = gr.Radio(list(FITS), value="random", label="Linformer's projection (fitted: to this text)",
                       elem_id="approx-fit", visible=False, min_width=160)
    return fields, fit


def shown(*components):
    """The event that shows components hidden until a result."""
    def show():
        updates = [gr.update(visible=True) for _ in components]
        return updates if len(updates) > 1 else updates[0]
    return dict(fn=show, inputs=None, outputs=list(components), queue=False, api_visibility="private")


def approx_section(services, picker) -> dict:
    """Approximate attention: the text, method, budget and layers, the run (two error maps, the change, the words)
    and the cost (the published run's figure, the live timing's words). elem_ids approx-*."""
    gr.Markdown("### Approximate attention: sparse, linear, low-rank")
    gr.Markdown(APPROX_INTRO.format(n=f"{MAX_APPROX_TOKENS:,}"), elem_classes=["how-to-read"])
    text = gr.Textbox(value=read_example("approx.txt"), lines=3, max_lines=10, elem_id="approx-text",
                      label=f"Text for the approximation (every token read, at most {MAX_APPROX_TOKENS:,})")
    with gr.Row():
        method = gr.Dropdown(choices=[(NAMES[m], m) for m in METHODS], value="topk", label="Method", min_width=160,
                             elem_id="approx-method")
        layers = gr.Textbox(value=LAYERS_ALL, label="Layers: all, one (3) or a list (0, 2, 5)", min_width=160,
                            elem_id="approx-layers")
    fields, fit = approx_fields()
    button = gr.Button("Run the approximation", elem_id="approx-run")
    note = gr.Markdown(elem_id="approx-note")
    with gr.Row():
        maps = [gr.Plot(label=label, elem_id=f"approx-{key}", min_width=320, visible=False, show_label=False)
                for key, label in (("tv", "Each head's weights: total variation"),
                                   ("z", "Each head's output: relative error"))]
    change = gr.Plot(label="The model's change and the cache", elem_id="approx-change", visible=False,
                     show_label=False)
    words = gr.Markdown(elem_id="approx-words")
    gr.Markdown("#### What the methods cost in time")
    cost_button = gr.Button("Cost: the published run, and a live timing here", elem_id="approx-cost-run")
    cost_figure = gr.Plot(label="One attention layer's time against length", elem_id="approx-cost", visible=False,
                          show_label=False)
    cost_words = gr.Markdown(elem_id="approx-cost-words")

    def budget_shown(chosen):
        """Each budget field shown where the chosen method takes it."""
        return [gr.update(visible=name in METHODS.get(chosen, {})) for name in [*fields, "fit"]]

    method.change(budget_shown, method, [*fields.values(), fit], queue=False, api_visibility="private")
    budget = [fields[name] for name in ("k", "block", "global_blocks", "random_blocks", "features", "rank")]
    run = dict(fn=handler(approx_views.approx_view, services, "approximation_page"), **ON_ANALYSIS,
               inputs=[picker.model, text, method, *budget, fit, fields["seed"], layers],
               outputs=[note, *maps, change, words])
    button.click(**shown(*maps, change)).then(**run, api_visibility="private")
    cost = dict(fn=handler(approx_views.cost_view, services, "attention_cost_page"), inputs=[picker.model],
                outputs=[cost_figure, cost_words], **ON_ANALYSIS)
    cost_button.click(**shown(cost_figure)).then(**cost, api_visibility="private")
    approx_endpoints(services)
    return dict(results=[note, *maps, change, words, cost_figure, cost_words],
                press={note: button, cost_words: cost_button},
                settings={"approx_text": text, "approx_method": method, **fields},
                parts={"approx-change": ({**run, "api_visibility": "private"}, [*maps, change])})


def approx_endpoints(services) -> None:
    """`approximation` and `attention_cost`, API only: their answers are JSON objects, no figure."""
    run = handler(approx_views.approximation_data, services, "approximation", progress=False)
    timing = handler(approx_views.attention_cost_data, services, "attention_cost", progress=False)

    def approximation(model_name: str, text_value: str, method: str = "topk", budget: dict | None = None,
                      layers: str | int | list | None = LAYERS_ALL) -> dict:
        return run(model_name, text_value, method, budget, layers)

    def attention_cost(model_name: str) -> dict:
        return timing(model_name)

    for fn in (approximation, attention_cost):
        gr.api(fn, api_name=fn.__name__, concurrency_id=ON_ANALYSIS["concurrency_id"],
               concurrency_limit=ON_ANALYSIS["concurrency_limit"])


def build(services, picker, initial) -> Tab:
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            text, _ = text_with_upload("Text", read_example("masks.txt"), "mask", services.settings.text_cap_bytes,
                                       lines=4)
            fields = layer_head(services.models, picker, initial, "mask")
            layer, head = fields.layer, fields.head
            button = gr.Button("Run the mask demo", variant="primary", elem_id="mask-run")
            note = gr.Markdown(label="note", elem_id="mask-note")
            with gr.Accordion("Padding texts and window", open=False, elem_id="mask-options"):
                with gr.Row():
                    start = gr.Number(value=0, label="Window start", precision=0, min_width=120)
                    size = gr.Slider(2, MAX_STAGE_WINDOW, value=12, step=1,
                                     label=f"Window size (2–{MAX_STAGE_WINDOW})", min_width=120)
                text_a = gr.Textbox(value=read_example("padding_long.txt"), label="Padding demo: a longer text",
                                    lines=2)
                text_b = gr.Textbox(
                    value=read_example("padding_short.txt"), label="…and a shorter one (it gets padded)", lines=2
                )
            export_button, export_file, export_note, _ = export_row("mask", "Export every matrix (CSV in a .zip)")
        with gr.Column(scale=3, min_width=340):
            gr.Markdown("### Eq. 2.1 stage by stage: scores, + mask M, softmax")
            gr.Markdown(HOW_TO_READ, elem_classes=["how-to-read"])
            stages = stage_rows()
            gr.Markdown("### Causal mask: next-token prediction with and without it")
            with gr.Row():
                causal_fig = gr.Plot(label="Causal mask effect", elem_id="mask-causal", min_width=320, visible=False)
                causal_text = gr.Markdown(label="causal mask note")
            gr.Markdown("### Padding mask: a batch of two texts of different lengths")
            with gr.Row():
                padding_fig = gr.Plot(label="Padding mask effect", elem_id="mask-padding", min_width=320,
                                      visible=False)
                padding_text = gr.Markdown(label="padding mask note")
            gr.Markdown("### Scaling by 1/√d_k: attention entropy")
            with gr.Row():
                entropy_fig = gr.Plot(label="Entropy with and without scaling", elem_id="mask-entropy", min_width=320,
                                      visible=False)
                entropy_text = gr.Markdown(label="scaling note")
            window_fields, window_figures = window_section()
            approx = approx_section(services, picker)
    with gr.Accordion("How to read this tab", open=False):
        gr.Markdown(INTRO)

    figures = [*stages, causal_fig, padding_fig, entropy_fig]
    inputs = [picker.model, text, layer, head, start, size, text_a, text_b]
    outputs = [note, *stages, causal_fig, causal_text, padding_fig, padding_text, entropy_fig, entropy_text]
    run = dict(fn=handler(mask_view, services, "run"), inputs=inputs, outputs=outputs, **ON_ANALYSIS)
    # a wrong layer or head is a note under them, and the figures keep the last result
    run_checked(button.click, services.models, picker.model, fields, run, reveal=figures, api_name="mask_demo")
    export = dict(fn=handler(export_data, services, "export_masks"), inputs=inputs, outputs=[export_file, export_note],
                  **ON_ANALYSIS)
    run_checked(export_button.click, services.models, picker.model, fields, export, api_name="export_masks")
    window_button, window_size, global_size, window_outputs = window_fields
    window = dict(fn=handler(window_view, services, "window_mask"), outputs=window_outputs, **ON_ANALYSIS,
                  inputs=[picker.model, text, layer, head, window_size, global_size])
    run_checked(window_button.click, services.models, picker.model, fields, window, reveal=window_figures,
                api_name="window_mask")
    return Tab(text=text, layer=layer, head=head, run_event={**run, "api_visibility": "private"},
               opening=opening(services, "masks", run), reveal=figures,
               follows=True, results=[export_file, export_note, *approx["results"]],
               press={note: button, **approx["press"]}, settings=approx["settings"], parts=approx["parts"])
