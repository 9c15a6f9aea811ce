"""Masks tab: what the causal mask, the padding mask and the 1/√d_k factor each change, measured on the
loaded model and the user's text."""

from __future__ import annotations

import gradio as gr

from ui.plots.attention import STAGE_TITLES, STAGES
from ui.services.masks import MAX_STAGE_WINDOW, MAX_WINDOW_TOKENS
from ui.tabs.events import ON_ANALYSIS, handler, opening
from ui.tabs.widgets import Tab, export_row, layer_head, read_example, run_checked, text_with_upload
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
               follows=True, results=[export_file, export_note], press={note: button})
