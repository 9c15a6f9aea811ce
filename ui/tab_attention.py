"""Attention tab: every layer × head at a glance (model view), one head large (head view), and a
full-resolution window into any part of a long input."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import numpy as np

from ui import downloads, export, plots, service
from ui.common import (
    ANALYSIS,
    ANALYSIS_LIMIT,
    index_of,
    kept_index,
    head_figure,
    parse_head,
    progress_callback,
    read_example,
    text_with_upload,
    user_errors,
)
from ui.model_picker import Picker
from ui.service import UserError

CAPTURE_TTL_S = 1800  # a session's kept capture is dropped after half an hour

LEAD = """**Where each token looks**: the attention weights softmax(QKᵀ/√d_k + M) of eq. 2.1, for every head of eq.
3.1's multi-head attention."""

EXPORTS = ("head CSV", "window CSV", "all maps .npz")

INTRO = """Each heatmap row is one **query** token and shows how its attention weights (softmax of eq. 2.1,
summing to 1) are spread over the **key** tokens. Decoders show a lower triangle: the causal mask hides later
tokens. Encoders (e.g. minilm-l6) attend in both directions. A strong weight says where a head looked, not why
the model decided anything: attention is not an explanation."""


def head_choices(n_heads: int) -> list[str]:
    return ["mean of heads"] + [str(h) for h in range(n_heads)]


@dataclass
class AttentionTab:
    text: gr.Textbox
    layer: gr.Number
    head: gr.Dropdown
    run_event: dict  # click-event arguments (fn, inputs, outputs, …) to run the tab again from elsewhere


def window_positions(tokens: service.Encoded, q_start: int, k_start: int, window: int, hide_special: bool):
    """Query and key positions of the window (without special tokens when asked), or a UserError."""
    n = len(tokens.ids)
    q_pos = service.visible_positions(tokens, q_start, min(n, q_start + window), hide_special)
    k_pos = service.visible_positions(tokens, k_start, min(n, k_start + window), hide_special)
    if q_pos.size == 0 or k_pos.size == 0:
        raise UserError("The window holds only special tokens; move it or untick 'hide special tokens'.")
    return q_pos, k_pos


def checked_settings(model, text, layer, head, q_start, k_start, window, max_tokens):
    """The tab's settings checked against the model and the text: (tokens, layer, head, q_start, k_start, window)."""
    cfg = model.config
    tokens = service.encode(model, text, max_tokens)
    n = len(tokens.ids)
    layer = service.check_range("Layer", layer, 0, cfg.n_layers - 1)
    head = parse_head(head, cfg.n_heads)
    window = service.check_range("Window size", window, 2, service.MAX_WINDOW)
    q_start = service.check_range("Window query start", q_start, 0, max(n - 1, 0))
    k_start = service.check_range("Window key start", k_start, 0, max(n - 1, 0))
    return tokens, layer, head, q_start, k_start, window


def attention_view(
    store: service.ModelStore,
    name,
    text,
    layer,
    head,
    hide_special,
    q_start,
    k_start,
    window,
    progress=None,
    previous: service.CaptureCache | None = None,
):
    """Figures of the model view, the head view and the window, a note, and the capture to keep for the next
    call of this session; the body of the `attention` endpoint."""
    model = store.get(name, progress)
    cfg = model.config
    tokens, layer, head, q_start, k_start, window = checked_settings(
        model, text, layer, head, q_start, k_start, window, store.max_attention_tokens)
    n = len(tokens.ids)

    result = service.capture_attention(model, name, tokens, layer, head, previous)
    head_name = "mean of heads" if head is None else f"head {head}"
    side = result.overview.shape[-1]
    if cfg.is_encoder_decoder:
        direction = "the encoder's self-attention (bidirectional)"
    else:
        direction = "bidirectional (encoder)" if not cfg.causal else "causal (decoder)"
    model_fig = plots.model_view(
        result.overview,
        f"{cfg.n_layers} layers × {cfg.n_heads} heads, {direction}"
        + ("" if side == n else f", tiles pooled to {side}×{side}"),
    )
    matrix = result.head_matrix
    head_fig = head_figure(tokens, matrix, f"Layer {layer}, {head_name}", bool(hide_special))
    q_pos, k_pos = window_positions(tokens, q_start, k_start, window, bool(hide_special))
    window_fig = plots.attention_heatmap(
        matrix[np.ix_(q_pos, k_pos)],
        [tokens.labels[p] for p in q_pos],
        [tokens.labels[p] for p in k_pos],
        f"Queries {q_pos[0]}–{q_pos[-1]} × keys {k_pos[0]}–{k_pos[-1]}, full resolution",
        height=560,
    )
    notes = [
        f"**{n:,} tokens**, "
        + (
            f"layer {layer} recomputed in {result.seconds:.2f} s (the other layers were kept from the last run)."
            if result.reused
            else f"captured in {result.seconds:.2f} s."
        )
    ]
    if tokens.note:
        notes.append("⚠️ " + tokens.note)
    if side != n:
        notes.append(f"Model view: each tile averages blocks of about {n / side:.1f} × {n / side:.1f} tokens.")
    if n > service.FULL_VIEW_TOKENS:
        notes.append(
            "Head view: each cell is the mean, over a block of queries, of the weight they put on a block of keys, "
            "so rows still sum to 1. The window below shows single tokens exactly; move it to see any part."
        )
    if hide_special and any(tokens.special):
        notes.append("Special tokens are hidden in the head view and window (their weights are not renormalised).")
    return "  \n".join(notes), model_fig, head_fig, window_fig, result.capture


def export_data(store: service.ModelStore, name, text, layer, head, hide_special, q_start, k_start, window, what,
                previous: service.CaptureCache | None = None, progress=None):
    """The file behind the tab: the chosen head (or mean) over the whole text or the window as CSV, or every layer ×
    head as float16 .npz; the body of the `export_attention` endpoint. Returns (path, note)."""
    if what not in EXPORTS:
        raise UserError(f"Export must be one of {', '.join(repr(e) for e in EXPORTS)}, got {what!r}.")
    model = store.get(name, progress)
    cfg = model.config
    tokens, layer, head, q_start, k_start, window = checked_settings(
        model, text, layer, head, q_start, k_start, window, store.max_attention_tokens)
    n = len(tokens.ids)
    if what == "all maps .npz":
        from core.capture import capture  # noqa: PLC0415

        side = min(n, export.npz_side_limit(cfg.n_layers * cfg.n_heads))
        maps = capture(model, service.as_batch(tokens.ids, model.device), overview_size=side, keep_full_up_to=0)
        pooled = (f"every map pooled from {n:,} to {side} positions per side (adaptive average pooling: bin_start and "
                  "bin_end give each bin's tokens) to stay under 50 MB" if side < n else "not pooled: one row and "
                  "column per token")
        note = f"{name}: {cfg.n_layers} layers × {cfg.n_heads} heads over {n:,} tokens, {pooled}."
        data = export.attention_npz(maps.overview, tokens.labels, name, note)
        path = export.write(data, export.filename(name, "all-maps") + ".npz")
        return str(path), note
    result = service.capture_attention(model, name, tokens, layer, head, previous)
    head_name = "mean of heads" if head is None else f"head {head}"
    if what == "head CSV":
        q_pos = k_pos = service.visible_positions(tokens, 0, n, bool(hide_special))
        if q_pos.size == 0:
            raise UserError("Every token is a special token; untick 'hide special tokens' to export them.")
        what_text, view = f"layer {layer}, {head_name}, the whole text", "head"
    else:
        q_pos, k_pos = window_positions(tokens, q_start, k_start, window, bool(hide_special))
        what_text = f"layer {layer}, {head_name}, queries {q_pos[0]}–{q_pos[-1]} × keys {k_pos[0]}–{k_pos[-1]}"
        view = f"window-q{q_pos[0]}-k{k_pos[0]}"
    matrix = result.head_matrix[np.ix_(q_pos, k_pos)]
    text_csv, pooled = export.attention_csv(matrix, [tokens.labels[p] for p in q_pos],
                                            [tokens.labels[p] for p in k_pos], what_text, name)
    path = export.write(text_csv, export.filename(name, view, layer, head) + ".csv")
    note = f"{name}: {what_text}" + (f"; {pooled}." if pooled else ", one cell per token pair.")
    return str(path), note


def figure_names(name: str, layer, head) -> tuple[str, str, str]:
    """Image filenames of the model view, the head view and the window."""
    return (export.filename(name, "model-view"), export.filename(name, "head-view", layer, head),
            export.filename(name, "window", layer, head))


def build(store: service.ModelStore, picker: Picker, initial) -> AttentionTab:
    """initial: the model the page opens on, for the layer and head ranges."""
    model = picker.model
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            text, _ = text_with_upload("Text", read_example("attention.txt"), "attn", api_name="load_text")
            with gr.Row():
                layer = gr.Number(
                    value=0, label=f"Layer (0–{initial.config.n_layers - 1})", precision=0, elem_id="attn-layer",
                    min_width=120,
                )
                head = gr.Dropdown(
                    choices=head_choices(initial.config.n_heads),
                    value="mean of heads",
                    label="Head",
                    allow_custom_value=True,
                    elem_id="attn-head",
                    min_width=120,
                )
            hide_special = gr.Checkbox(value=False, label="Hide special tokens (BOS, [CLS], [SEP], chat markers)")
            with gr.Row():
                q_start = gr.Number(value=0, label="Window: first query", precision=0, min_width=120)
                k_start = gr.Number(value=0, label="Window: first key", precision=0, min_width=120)
            window = gr.Slider(2, service.MAX_WINDOW, value=64, step=1, label="Window size (tokens per side)")
            button = gr.Button("Show attention", variant="primary", elem_id="attn-run")
            note = gr.Markdown(label="note", elem_id="attn-note")
            with gr.Accordion("Download the data", open=False, elem_id="attn-export-box"):
                what = gr.Radio(list(EXPORTS), value="head CSV", label="What", elem_id="attn-export-what")
                export_button = gr.Button("Export", size="sm", elem_id="attn-export")
                export_file = downloads.file_box("attn-export-file")
                export_note = gr.Markdown(elem_id="attn-export-note")
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

    @user_errors
    def run(
        model_name,
        text_value,
        layer_index,
        head_index,
        hide_special_tokens,
        window_query_start,
        window_key_start,
        window_size,
        previous,
        progress=gr.Progress(),
    ):
        note_text, model_view, head_view, window_view, capture = attention_view(
            store,
            model_name,
            text_value,
            layer_index,
            head_index,
            hide_special_tokens,
            window_query_start,
            window_key_start,
            window_size,
            progress_callback(progress),
            previous,
        )
        layer_i, head_i = index_of(layer_index), parse_head(head_index, store.get(model_name).config.n_heads)
        names = figure_names(model_name, layer_i, head_i)
        figures = [downloads.plot(f, n) for f, n in zip((model_view, head_view, window_view), names)]
        return note_text, *figures, capture

    # per session: the last capture, so a new window or layer on the same text skips the all-layer pass
    last_capture = gr.State(None, time_to_live=CAPTURE_TTL_S)
    event = dict(
        fn=run,
        inputs=[model, text, layer, head, hide_special, q_start, k_start, window, last_capture],
        outputs=[note, model_fig, head_fig, window_fig, last_capture],
        concurrency_id=ANALYSIS,
        concurrency_limit=ANALYSIS_LIMIT,
    )
    button.click(**event, api_name="attention")

    @user_errors
    def export_attention(model_name, text_value, layer_index, head_index, hide_special_tokens, window_query_start,
                         window_key_start, window_size, export_kind, previous, progress=gr.Progress()):
        return export_data(store, model_name, text_value, layer_index, head_index, hide_special_tokens,
                           window_query_start, window_key_start, window_size, export_kind, previous,
                           progress_callback(progress))

    export_button.click(
        export_attention,
        [model, text, layer, head, hide_special, q_start, k_start, window, what, last_capture],
        [export_file, export_note],
        api_name="export_attention",
        concurrency_id=ANALYSIS,
        concurrency_limit=ANALYSIS_LIMIT,
    )

    @user_errors
    def limits(name, layer_index, head_index):
        """New ranges for the chosen model; the layer and head stay where they are when the model has them."""
        cfg = store.get(name).config
        keep_layer = kept_index(layer_index, cfg.n_layers)
        keep_head = head_index if head_index in head_choices(cfg.n_heads) else "mean of heads"
        return gr.Number(value=keep_layer, label=f"Layer (0–{cfg.n_layers - 1})"), gr.Dropdown(
            choices=head_choices(cfg.n_heads), value=keep_head
        )

    picker.loaded.success(limits, [model, layer, head], [layer, head], api_visibility="private")
    return AttentionTab(text=text, layer=layer, head=head, run_event={**event, "api_visibility": "private"})
