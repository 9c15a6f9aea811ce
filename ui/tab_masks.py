"""Masks tab: what the causal mask, the padding mask and the 1/√d_k factor each change, measured on the
loaded model and the user's text."""

from __future__ import annotations

import gradio as gr
import numpy as np

from ui import downloads, export, plots, service
from ui.common import (
    ANALYSIS,
    ANALYSIS_LIMIT,
    index_of,
    kept_index,
    parse_head,
    progress_callback,
    read_example,
    text_with_upload,
    user_errors,
)
from ui.links import TabControls
from ui.model_picker import Picker

LEAD = """**What each safeguard of eq. 2.1 changes**: the scores QKᵀ/√d_k, the mask M and the softmax step by step,
then the causal mask, the padding mask and the 1/√d_k factor switched off on the loaded model."""

INTRO = """Eq. 2.1 step by step for a window of tokens: scores QKᵀ/√d_k, then the mask M added (0 where attention is
allowed, −∞ where it is not, drawn grey), then the row-wise softmax. Below, the model is run on your text with each
safeguard switched off, to measure what it protects against."""


def stages_figure(model, tokens: service.Encoded, layer: int, head: int, start: int, size: int,
                  data: dict | None = None):
    n = len(tokens.ids)
    start = service.check_range("Window start", start, 0, n - 1)
    size = service.check_range("Window size", size, 2, service.MAX_STAGE_WINDOW)
    stop = min(n, start + size)
    q, k = service.qk_for_head(model, tokens.ids, layer, head)
    stages = service.mask_stages(q[start:stop], k[start:stop], model.config.head_dim)
    labels = tokens.labels[start:stop]
    if data is not None:
        for mask, matrices in stages.items():
            for stage, matrix in zip(("scores", "masked", "softmax"), matrices):
                data[f"stage_{stage}_{mask.replace(' ', '_')}"] = (matrix, labels, labels, "query \\ key")
    return plots.stages_figure(
        stages,
        labels,
        labels,
        f"Layer {layer}, head {head}, tokens {start}–{stop - 1} (softmax over the keys inside the window)",
    )


def causal_section(model, ids: list[int], data: dict | None = None):
    effect = service.causal_effect(model, ids)
    if effect is None:
        reason = (
            f"{model.config.family}: this checkpoint has no language-model head, so there is "
            f"no next-token loss to measure."
        )
        return plots.empty_figure(reason), reason
    (loss_on, loss_off), (acc_on, acc_off) = effect["loss"], effect["accuracy"]
    if data is not None:
        data["causal_mask_effect"] = (np.array([[loss_on, loss_off], [acc_on, acc_off]]),
                                      ["next-token loss (nats)", "next-token accuracy"],
                                      ["causal mask on", "causal mask off"], "")
    fig = plots.bar_figure(
        ["next-token loss (nats)", "next-token accuracy"],
        {"causal mask on": [loss_on, acc_on], "causal mask off": [loss_off, acc_off]},
        f"Predicting each next token of your text ({effect['predictions']} predictions)",
        "value",
    )
    if not model.config.causal:
        text = "This model is an encoder: it never used a causal mask, so switching it off changes nothing."
    else:
        text = (
            f"With the mask, loss {loss_on:.3f} and accuracy {acc_on:.1%}. Without it every position can also see the "
            f"token it has to predict: loss {loss_off:.3f}, accuracy {acc_off:.1%}. A model trained without the mask "
            "would learn to copy the answer and then fail when generating, where the future is not there to see."
        )
    return fig, text


def padding_section(model, text_a: str, text_b: str, data: dict | None = None):
    ids_a = service.encode(model, text_a, 256).ids
    ids_b = service.encode(model, text_b, 256).ids
    result = service.padding_effect(model, ids_a, ids_b)
    layers = [str(i) for i in range(len(result["results"]["padding mask on"]["pad_mass"]))]
    if data is not None:
        names = list(result["results"])
        data["padding_mass_per_layer"] = (np.stack([result["results"][n]["pad_mass"] for n in names], 1), layers,
                                          names, "layer")
    fig = plots.bar_figure(
        layers,
        {name: r["pad_mass"] for name, r in result["results"].items()},
        f"Weight the short text puts on its {result['n_pad']} pad tokens ({result['side']} padding)",
        "mean weight on pad keys",
        x_title="layer",
    )
    on, off = result["results"]["padding mask on"], result["results"]["padding mask off"]
    text = (
        f"The shorter text ({result['n_real']} tokens) was padded with {result['n_pad']} pad tokens "
        f"on the {result['side']}. "
        f"Compared with running it alone, its real tokens' final outputs move by at most {on['max_change']:.1e} "
        f"(relative) with the padding mask, and by up to {off['max_change']:.3f} (mean "
        f"{off['mean_change']:.3f}) without it: "
        "the filler leaks into the results."
    )
    return fig, text


def entropy_section(model, ids: list[int], layer: int, head: int, data: dict | None = None):
    result = service.scaling_entropy(model, ids, layer, head)
    curves = result["curves"]
    n_layers = len(next(iter(curves.values()))["per_layer"])
    if data is not None:
        data["entropy_per_layer"] = (np.stack([np.array(c["per_layer"]) for c in curves.values()], 1),
                                     [str(i) for i in range(n_layers)], list(curves), "layer")
    fig = plots.line_figure(
        np.arange(n_layers),
        {name: np.array(c["per_layer"]) for name, c in curves.items()},
        "Mean attention entropy per layer: lower means sharper, more one-hot rows",
        "layer",
        "entropy (nats)",
        reference={"uniform attention": result["uniform"]},
    )
    scaled, raw = curves["scaled by 1/√d_k"], curves["not scaled"]
    text = (
        f"Without the 1/√d_k factor the scores are √{result['head_dim']} ≈ "
        f"{np.sqrt(result['head_dim']):.1f} times larger, "
        f"so the softmax saturates. Layer {layer}, head {head}: entropy {scaled['head']:.3f} → {raw['head']:.3f} nats, "
        f"mean largest weight per row {scaled['head_max_weight']:.3f} → {raw['head_max_weight']:.3f}."
    )
    return fig, text


def mask_view(store: service.ModelStore, name, text, layer, head, start, size, text_a, text_b, progress=None,
              data: dict | None = None):
    """Every figure of the tab; the body of the `mask_demo` endpoint. `data`, when given, receives every matrix behind
    them: name → (matrix, row labels, column labels, corner)."""
    model = store.get(name, progress)
    cfg = model.config
    if cfg.is_encoder_decoder:
        raise service.UserError(
            f"The mask demo reads decoder-only and encoder-only models; {name} is an encoder-decoder. "
            "Pick smollm2-135m-instruct or minilm-l6."
        )
    layer = service.check_range("Layer", layer, 0, cfg.n_layers - 1)
    head = parse_head(head, cfg.n_heads, allow_mean=False)
    tokens = service.encode(model, text, service.MAX_MASK_TOKENS)
    if len(tokens.ids) < 2:
        raise service.UserError("The mask demo needs at least 2 tokens of text.")
    stages = stages_figure(model, tokens, layer, head, start, size, data)
    causal_fig, causal_text = causal_section(model, tokens.ids, data)
    padding_fig, padding_text = padding_section(model, text_a, text_b, data)
    entropy_fig, entropy_text = entropy_section(model, tokens.ids, layer, head, data)
    note = f"⚠️ {tokens.note}" if tokens.note else f"{len(tokens.ids)} tokens."
    return note, stages, causal_fig, causal_text, padding_fig, padding_text, entropy_fig, entropy_text


def export_data(store: service.ModelStore, name, text, layer, head, start, size, text_a, text_b,
                progress=None) -> tuple[str, str]:
    """Every matrix of the tab as CSV in one .zip; the body of the `export_masks` endpoint."""
    data: dict = {}
    mask_view(store, name, text, layer, head, start, size, text_a, text_b, progress, data)
    files = {f"{key}.csv": export.matrix_csv(matrix, rows, cols, corner, [f"{name}: {key.replace('_', ' ')}"])
             for key, (matrix, rows, cols, corner) in data.items()}
    readme = (f"The mask demo on {name}, layer {index_of(layer)}, head {index_of(head)}:\n"
              "stage_{scores,masked,softmax}_causal_mask_{on,off}: eq. 2.1 for the window (masked cells empty: −inf)\n"
              "causal_mask_effect: next-token loss and accuracy with and without the causal mask (decoders)\n"
              "padding_mass_per_layer: weight the shorter text puts on its pad tokens, per layer\n"
              "entropy_per_layer: mean attention entropy with and without 1/sqrt(d_k)\n"
              f"The text is read up to its first {service.MAX_MASK_TOKENS} tokens; nothing is pooled.\n")
    path = export.write(export.zip_of(files, readme), export.filename(name, "masks", index_of(layer), index_of(head)) + ".zip")
    return str(path), f"{len(files)} matrices as CSV: {', '.join(sorted(files))}."


def build(store: service.ModelStore, picker: Picker, initial) -> TabControls:
    model = picker.model
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            text, _ = text_with_upload("Text", read_example("masks.txt"), "mask", lines=4)
            with gr.Row():
                layer = gr.Number(value=0, label=f"Layer (0–{initial.config.n_layers - 1})", precision=0,
                                  elem_id="mask-layer", min_width=120)
                head = gr.Number(value=0, label=f"Head (0–{initial.config.n_heads - 1})", precision=0,
                                 elem_id="mask-head", min_width=120)
            with gr.Row():
                start = gr.Number(value=0, label="Window start", precision=0, min_width=120)
                size = gr.Slider(2, service.MAX_STAGE_WINDOW, value=12, step=1, label="Window size", min_width=120)
            text_a = gr.Textbox(value=read_example("padding_long.txt"), label="Padding demo: a longer text", lines=2)
            text_b = gr.Textbox(
                value=read_example("padding_short.txt"), label="…and a shorter one (it gets padded)", lines=2
            )
            button = gr.Button("Run the mask demo", variant="primary", elem_id="mask-run")
            note = gr.Markdown(label="note", elem_id="mask-note")
            with gr.Accordion("Download the data", open=False, elem_id="mask-export-box"):
                export_button = gr.Button("Export every matrix (CSV in a .zip)", size="sm", elem_id="mask-export")
                export_file = downloads.file_box("mask-export-file")
                export_note = gr.Markdown(elem_id="mask-export-note")
        with gr.Column(scale=3, min_width=340):
            stages = gr.Plot(label="Stages of eq. 2.1", elem_id="mask-stages")
            gr.Markdown("### Causal mask: next-token prediction with and without it")
            with gr.Row():
                causal_fig = gr.Plot(label="Causal mask effect", elem_id="mask-causal", min_width=320)
                causal_text = gr.Markdown(label="causal mask note")
            gr.Markdown("### Padding mask: a batch of two texts of different lengths")
            with gr.Row():
                padding_fig = gr.Plot(label="Padding mask effect", elem_id="mask-padding", min_width=320)
                padding_text = gr.Markdown(label="padding mask note")
            gr.Markdown("### Scaling by 1/√d_k: attention entropy")
            with gr.Row():
                entropy_fig = gr.Plot(label="Entropy with and without scaling", elem_id="mask-entropy", min_width=320)
                entropy_text = gr.Markdown(label="scaling note")
    with gr.Accordion("How to read this tab", open=False):
        gr.Markdown(INTRO)

    @user_errors
    def run(
        model_name,
        text_value,
        layer_index,
        head_index,
        window_start,
        window_size,
        longer_text,
        shorter_text,
        progress=gr.Progress(),
    ):
        outputs = mask_view(
            store,
            model_name,
            text_value,
            layer_index,
            head_index,
            window_start,
            window_size,
            longer_text,
            shorter_text,
            progress_callback(progress),
        )
        layer_i, head_i = index_of(layer_index), index_of(head_index)
        views = {1: ("stages", layer_i, head_i), 2: ("causal-mask", None, None), 4: ("padding-mask", None, None),
                 6: ("entropy", None, None)}
        return tuple(downloads.plot(v, export.filename(model_name, *views[i])) if i in views else v
                     for i, v in enumerate(outputs))

    inputs = [model, text, layer, head, start, size, text_a, text_b]
    button.click(
        run,
        inputs,
        [note, stages, causal_fig, causal_text, padding_fig, padding_text, entropy_fig, entropy_text],
        api_name="mask_demo",
        concurrency_id=ANALYSIS,
        concurrency_limit=ANALYSIS_LIMIT,
    )

    @user_errors
    def export_masks(model_name, text_value, layer_index, head_index, window_start, window_size, longer_text,
                     shorter_text, progress=gr.Progress()):
        return export_data(store, model_name, text_value, layer_index, head_index, window_start, window_size,
                           longer_text, shorter_text, progress_callback(progress))

    export_button.click(export_masks, inputs, [export_file, export_note], api_name="export_masks",
                        concurrency_id=ANALYSIS, concurrency_limit=ANALYSIS_LIMIT)

    @user_errors
    def limits(name, layer_index, head_index):
        cfg = store.get(name).config
        return gr.Number(value=kept_index(layer_index, cfg.n_layers), label=f"Layer (0–{cfg.n_layers - 1})"), gr.Number(
            value=kept_index(head_index, cfg.n_heads), label=f"Head (0–{cfg.n_heads - 1})"
        )

    picker.loaded.success(limits, [model, layer, head], [layer, head], api_visibility="private")
    return TabControls(text, layer, head)
