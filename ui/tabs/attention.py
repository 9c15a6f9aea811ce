"""Attention tab: every layer × head at a glance (model view), one head large (head view), and a
full-resolution window into any part of a long input."""

from __future__ import annotations

import gradio as gr

from ui.services.attention import MAX_WINDOW
from ui.tabs.events import ON_ANALYSIS, handler, opening, user_errors
from ui.tabs.hover import hover_filter_js
from ui.tabs.widgets import (Tab, checked_pick, click_bridge, export_row, layer_head, read_example, run_checked,
                             upload)
from ui.views.attention import EXPORTS, attention_view, export_data, first_view

CAPTURE_TTL_S = 1800  # a session's kept capture is dropped after half an hour

LEAD = """**Where each token looks**: the attention weights softmax(QKᵀ/√d_k + M) (eq. 2.1 in the repository's
docs/theory.md) of every head of multi-head attention (eq. 3.1)."""

HOW_TO_READ = """**How to read it:** each row is one **query** token and each column a **key** it can look at; a cell's
colour is how much of that row's attention (its weights sum to 1) goes to that key. A decoder's upper right is empty:
its causal mask hides the tokens that come later."""

INTRO = """Encoders (e.g. minilm-l6) attend in both directions, so their maps fill the whole square. The model view
shows every layer (across) and head (down) as one small tile, each scaled to its own peak; click a tile to open that
head above. The window shows any part of a long text token by token. A strong weight says where a head looked, not
why the model decided anything: attention is not an explanation."""

# a click on a model-view tile reads "layer.head" from the tile's invisible marker ("layer 3, head 2")
TILE_READ = 'const m = /layer (\\d+), head (\\d+)/.exec(point.text || ""); return m ? `${m[1]}.${m[2]}` : null;'


def build(services, picker, initial) -> Tab:
    """initial: the model the page opens on, for the layer and head ranges."""
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            text = gr.Textbox(label="Text", value=read_example("attention.txt"), lines=5, max_lines=14,
                              elem_id="attn-text")
            fields = layer_head(services.models, picker, initial, "attn", mean=True)
            layer, head = fields.layer, fields.head
            button = gr.Button("Show attention", variant="primary", elem_id="attn-run")
            note = gr.Markdown(label="note", elem_id="attn-note")
            hide_special = gr.Checkbox(value=False, label="Hide special tokens (BOS, [CLS], [SEP], chat markers)")
            with gr.Accordion("Window into a long text", open=False, elem_id="attn-window-box"):
                with gr.Row():
                    q_start = gr.Number(value=0, label="Window: first query", precision=0, min_width=120)
                    k_start = gr.Number(value=0, label="Window: first key", precision=0, min_width=120)
                window = gr.Slider(2, MAX_WINDOW, value=32, step=1, label=f"Window size (2–{MAX_WINDOW} tokens a side)")
            upload(text, "attn", services.settings.text_cap_bytes, api_name="load_text")
            export_button, export_file, export_note, what = export_row(
                "attn", "Export", lambda: gr.Radio(list(EXPORTS), value="head CSV", label="What",
                                                   elem_id="attn-export-what"))
        with gr.Column(scale=3, min_width=340):
            gr.Markdown(HOW_TO_READ, elem_classes=["how-to-read"])
            head_fig = gr.Plot(label="Head view", elem_id="attn-head-view", visible=False)
            with gr.Row():
                columns_fig = gr.Plot(label="Two columns: a line from each query to each key, as dark as its weight",
                                      elem_id="attn-columns", min_width=320, visible=False)
                window_fig = gr.Plot(label="Window", elem_id="attn-window", min_width=320, visible=False)
            gr.HTML("", html_template="<span hidden></span>", js_on_load=hover_filter_js(["attn-columns"]),
                    elem_id="attn-hover-filter")
            model_fig = gr.Plot(
                label="Model view: every layer and head (each tile scaled to its own peak, colour ∝ √weight); "
                      "click a tile to open it",
                elem_id="attn-model-view", visible=False,
            )
    with gr.Accordion("More on reading this tab", open=False):
        gr.Markdown(INTRO)
    picked = click_bridge("attn-tile-bridge", ["attn-model-view"], TILE_READ)

    # per session: the last capture, so a new window or layer on the same text skips the all-layer pass
    last_capture = gr.State(None, time_to_live=CAPTURE_TTL_S)
    settings = [picker.model, text, layer, head, hide_special, q_start, k_start, window]
    figures = [model_fig, head_fig, window_fig, columns_fig]
    event = dict(fn=handler(attention_view, services, "run"), inputs=[*settings, last_capture],
                 outputs=[note, *figures, last_capture], **ON_ANALYSIS)
    # a wrong layer or head is a note under them, and the figures keep the last result
    run_checked(button.click, services.models, picker.model, fields, event, reveal=figures, api_name="attention")
    export = dict(fn=handler(export_data, services, "export_attention"), inputs=[*settings, what, last_capture],
                  outputs=[export_file, export_note], **ON_ANALYSIS)
    run_checked(export_button.click, services.models, picker.model, fields, export, api_name="export_attention")

    @user_errors
    def open_tile(name, value):
        layer_index, head_index = checked_pick(services.models.get(name), value)
        return layer_index, str(head_index)

    picked.click(open_tile, [picker.model, picked], [layer, head], api_visibility="private",
                 queue=False).then(**event, api_visibility="private")
    first = dict(fn=handler(first_view, services, "first_attention"), inputs=[*settings, last_capture],
                 outputs=[layer, head, note, *figures, last_capture])
    return Tab(text=text, layer=layer, head=head, run_event={**event, "api_visibility": "private"},
               opening=opening(services, "attention", first, fresh=(7,)), reveal=figures,
               follows=True, results=[export_file, export_note], press={note: button})
