"""Attention tab: every layer × head at a glance (model view), one head large (head view), and a
full-resolution window into any part of a long input."""

from __future__ import annotations

import gradio as gr

from ui.services.attention import MAX_WINDOW
from ui.tabs.events import ON_ANALYSIS, handler
from ui.tabs.widgets import Tab, export_row, layer_head, read_example, text_with_upload
from ui.views.attention import EXPORTS, attention_view, export_data

CAPTURE_TTL_S = 1800  # a session's kept capture is dropped after half an hour

LEAD = """**Where each token looks**: the attention weights softmax(QKᵀ/√d_k + M) of eq. 2.1, for every head of eq.
3.1's multi-head attention."""

INTRO = """Each heatmap row is one **query** token and shows how its attention weights (softmax of eq. 2.1,
summing to 1) are spread over the **key** tokens. Decoders show a lower triangle: the causal mask hides later
tokens. Encoders (e.g. minilm-l6) attend in both directions. A strong weight says where a head looked, not why
the model decided anything: attention is not an explanation."""


def build(services, picker, initial) -> Tab:
    """initial: the model the page opens on, for the layer and head ranges."""
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            text, _ = text_with_upload("Text", read_example("attention.txt"), "attn", services.settings.text_cap_bytes,
                                       api_name="load_text")
            layer, head = layer_head(services.models, picker, initial, "attn", mean=True)
            hide_special = gr.Checkbox(value=False, label="Hide special tokens (BOS, [CLS], [SEP], chat markers)")
            with gr.Row():
                q_start = gr.Number(value=0, label="Window: first query", precision=0, min_width=120)
                k_start = gr.Number(value=0, label="Window: first key", precision=0, min_width=120)
            window = gr.Slider(2, MAX_WINDOW, value=64, step=1, label="Window size (tokens per side)")
            button = gr.Button("Show attention", variant="primary", elem_id="attn-run")
            note = gr.Markdown(label="note", elem_id="attn-note")
            export_button, export_file, export_note, what = export_row(
                "attn", "Export", lambda: gr.Radio(list(EXPORTS), value="head CSV", label="What",
                                                   elem_id="attn-export-what"))
        with gr.Column(scale=3, min_width=340):
            model_fig = gr.Plot(
                label="Model view: every layer and head (each tile scaled to its own peak, colour ∝ √weight)",
                elem_id="attn-model-view",
            )
            with gr.Row():
                head_fig = gr.Plot(label="Head view", elem_id="attn-head-view", min_width=320)
                window_fig = gr.Plot(label="Window", elem_id="attn-window", min_width=320)
    with gr.Accordion("How to read this tab", open=False):
        gr.Markdown(INTRO)

    # per session: the last capture, so a new window or layer on the same text skips the all-layer pass
    last_capture = gr.State(None, time_to_live=CAPTURE_TTL_S)
    settings = [picker.model, text, layer, head, hide_special, q_start, k_start, window]
    event = dict(fn=handler(attention_view, services, "run"), inputs=[*settings, last_capture],
                 outputs=[note, model_fig, head_fig, window_fig, last_capture], **ON_ANALYSIS)
    button.click(**event, api_name="attention")
    export_button.click(handler(export_data, services, "export_attention"), [*settings, what, last_capture],
                        [export_file, export_note], api_name="export_attention", **ON_ANALYSIS)
    return Tab(text=text, layer=layer, head=head, run_event={**event, "api_visibility": "private"})
