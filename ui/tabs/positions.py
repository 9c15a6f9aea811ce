"""Positional encoding tab: the sinusoids of eq. 4.1, the loaded model's own learned positions, and RoPE
measured on the model's real query/key projections."""

from __future__ import annotations

import gradio as gr

from ui.services.positions import BIAS_KINDS, MAX_BIAS_DISTANCE, MAX_PE_DIM, MAX_PE_POSITIONS, T5_STACKS
from ui.tabs.events import ON_ANALYSIS, gated, handler, opening
from ui.tabs.widgets import Tab, export_row, layer_head, read_example, run_checked, upload
from ui.views.positions import (export_data, first_view, permutation_view, position_bias_view, positional_view,
                                shuffle_view)

LEAD = """**How a Transformer knows where each token is**: sinusoids (eq. 4.1 in the repository's docs/theory.md)
added to the embeddings (eq. 4.2), learned positions, rotary positions, and what a model sees of order with its
positions switched off."""

HOW_TO_READ = """**How to read it:** in the heatmap each row is a position and each column one dimension of its
encoding, from fast waves (left) to slow ones (right); in the similarity map a cell is how alike two positions'
encodings are, so nearby positions are bright and far ones dim."""

INTRO = """Attention with no positions and no mask treats the text as a set: shuffling the tokens only shuffles the
outputs, so an **encoder** needs positions to know the order. A **causal decoder** is different: its mask lets each
token read only the tokens before it, so it sees order through the mask even without positions (the check below
measures both on your text). The original Transformer **adds** fixed sinusoids (eq. 4.1: PE(pos, 2i) = sin(pos /
10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))); GPT-2 and BERT **learn** one vector per position;
Llama-style models **rotate** queries and keys (RoPE) so that a query·key score depends on how far apart the tokens
are."""


def build(services, picker, initial) -> Tab:
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            with gr.Row():
                n = gr.Slider(2, MAX_PE_POSITIONS, value=128, step=1, label=f"Positions n (2–{MAX_PE_POSITIONS})",
                              min_width=140, elem_id="pe-n")
                d = gr.Slider(2, MAX_PE_DIM, value=64, step=2, label=f"Dimensions d (2–{MAX_PE_DIM}, even)",
                              min_width=140, elem_id="pe-d")
            text = gr.Textbox(
                label="Text: its first and last tokens (of its first 256) give the RoPE query/key pair; the "
                      "permutation check shuffles it",
                value=read_example("attention.txt"), lines=2, max_lines=14, elem_id="pe-text")
            button = gr.Button("Show positional encodings", variant="primary", elem_id="pe-run")
            upload(text, "pe", services.settings.text_cap_bytes)
            export_button, export_file, export_note, _ = export_row("pe", "Export every matrix (CSV in a .zip)")
        # each setting sits beside the figure it changes, and each figure has the note that says why it is not drawn
        with gr.Column(scale=3, min_width=340):
            gr.Markdown(HOW_TO_READ, elem_classes=["how-to-read"])
            gr.Markdown("### Sinusoidal (eq. 4.1)")
            with gr.Row():
                heat = gr.Plot(label="PE heatmap", elem_id="pe-heatmap", min_width=320, visible=False)
                sim = gr.Plot(label="Similarity", elem_id="pe-similarity", min_width=320, visible=False)
            sinusoid_note = gr.Markdown(elem_id="pe-sinusoid-note", elem_classes=["field-note"])
            with gr.Row():
                p = gr.Number(value=0, label="Start position p (dot product)", precision=0, min_width=120,
                              elem_id="pe-p")
                k = gr.Number(value=5, label="Offset k (rotation check)", precision=0, min_width=120,
                              elem_id="pe-k")
            dots = gr.Plot(label="Dot product vs offset", elem_id="pe-dots", visible=False)
            dots_note = gr.Markdown(elem_id="pe-dots-note", elem_classes=["field-note"])
            check = gr.Markdown(label="rotation check", elem_id="pe-check")
            gr.Markdown("### The loaded model's learned positions (GPT-2, BERT)")
            with gr.Row():
                learned_heat = gr.Plot(label="Learned positions", elem_id="pe-learned", min_width=320, visible=False)
                learned_sim = gr.Plot(label="Learned similarity", elem_id="pe-learned-sim", min_width=320,
                                      visible=False)
            learned_note = gr.Markdown(elem_id="pe-learned-note", elem_classes=["field-note"])
            gr.Markdown("### Rotary positions (Llama-style models)")
            fields = layer_head(services.models, picker, initial, "pe", note="RoPE scores; ")
            layer, head = fields.layer, fields.head
            with gr.Row():
                angles = gr.Plot(label="Rotation angles", elem_id="pe-rope-angles", min_width=320, visible=False)
                scores = gr.Plot(label="Score vs distance", elem_id="pe-rope-scores", min_width=320, visible=False)
            rope_text = gr.Markdown(label="RoPE note", elem_id="pe-rope-note")
            gr.Markdown("### Position as a bias on the scores, and partial rotary (eqs. 6.2–6.4)")
            with gr.Row():
                kind = gr.Dropdown(list(BIAS_KINDS), value="alibi", label="Kind", min_width=140, elem_id="pb-kind")
                stack = gr.Dropdown(list(T5_STACKS), value="encoder", label="T5 stack", min_width=140,
                                    elem_id="pb-stack")
                distance = gr.Number(value=64, label=f"Max distance (1–{MAX_BIAS_DISTANCE})", precision=0,
                                     min_width=120, elem_id="pb-distance")
            bias_button = gr.Button("Show the bias", elem_id="pb-run")
            with gr.Row():
                bias_first = gr.Plot(label="Slopes, buckets or angles", elem_id="pb-first", min_width=320,
                                     visible=False)
                bias_second = gr.Plot(label="By distance", elem_id="pb-second", min_width=320, visible=False)
            bias_note = gr.Markdown(elem_id="pb-note", elem_classes=["field-note"])
            gr.Markdown("### Order without positions: shuffle the tokens")
            perm_text = gr.Markdown(label="permutation check", elem_id="pe-permutation")
            shuffle_button = gr.Button("Shuffle through the first layer, each switch apart", elem_id="pe-shuffle-run")
            shuffled = gr.Plot(label="The first layer on the shuffled text, each switch apart", show_label=False,
                               elem_id="pe-shuffle", visible=False)
    with gr.Accordion("More on reading this tab", open=False):
        gr.Markdown(INTRO)
    inputs = [picker.model, n, d, p, k, layer, head, text]
    outputs = [heat, dots, sim, check, learned_heat, learned_sim, angles, scores, rope_text, sinusoid_note,
               dots_note, learned_note]
    figures = [heat, dots, sim, learned_heat, learned_sim, angles, scores]
    run = dict(fn=handler(positional_view, services, "run"), inputs=inputs, outputs=outputs, **ON_ANALYSIS)
    permutation = dict(fn=handler(permutation_view, services, "permutation_check", progress=False),
                       inputs=[picker.model, text], outputs=perm_text, **ON_ANALYSIS)
    # a wrong layer or head is a note under them, and the figures keep the last result
    run_checked(button.click, services.models, picker.model, fields, run, reveal=figures,
                api_name="positional_encoding").success(**gated(permutation, fields.ok), api_name="permutation_check")
    export = dict(fn=handler(export_data, services, "export_positions"), inputs=inputs,
                  outputs=[export_file, export_note], **ON_ANALYSIS)
    run_checked(export_button.click, services.models, picker.model, fields, export, api_name="export_positions")
    bias_button.click(lambda: (gr.Plot(visible=True),) * 2, None, [bias_first, bias_second], api_visibility="private",
                      queue=False).then(
        handler(position_bias_view, services, "position_bias"), [picker.model, kind, stack, distance],
        [bias_first, bias_second, bias_note], api_name="position_bias", **ON_ANALYSIS)
    shuffle = dict(fn=handler(shuffle_view, services, "shuffle_check"), inputs=[picker.model, text],
                   outputs=shuffled, **ON_ANALYSIS)
    shuffle_button.click(lambda: gr.Plot(visible=True), None, shuffled, api_visibility="private",
                         queue=False).then(**shuffle, api_visibility="private")
    first = dict(fn=handler(first_view, services, "first_positions"), inputs=inputs, outputs=[*outputs, perm_text])
    return Tab(text=text, layer=layer, head=head, opening=opening(services, "positions", first), reveal=figures,
               follows=True, results=[export_file, export_note],
               press={rope_text: button, perm_text: button},
               parts={"pe-shuffle": ({**shuffle, "api_visibility": "private"}, [shuffled])})
