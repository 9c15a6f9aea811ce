"""Positional encoding tab: the sinusoids of eq. 4.1, the loaded model's own learned positions, and RoPE
measured on the model's real query/key projections."""

from __future__ import annotations

import numpy as np
import gradio as gr

from core.inspect import learned_positions, rope_frequencies
from ui import downloads, export, permutation, plots, service
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

LEAD = """**How a Transformer knows where each token is**: eq. 4.1's sinusoids added to the embeddings (eq. 4.2),
learned positions, rotary positions, and what a model sees of order with its positions switched off."""

INTRO = """Attention with no positions and no mask treats the text as a set: shuffling the tokens only shuffles the
outputs, so an **encoder** needs positions to know the order. A **causal decoder** is different: its mask lets each
token read only the tokens before it, so it sees order through the mask even without positions (the check below
measures both on your text). The original Transformer **adds** fixed sinusoids (eq. 4.1: PE(pos, 2i) = sin(pos / 10000^(2i/d)),
PE(pos, 2i+1) = cos(pos / 10000^(2i/d))); GPT-2 and BERT **learn** one vector per position; Llama-style models
**rotate** queries and keys (RoPE) so that a query·key score depends on how far apart the tokens are."""

MAX_LEARNED_CELLS = 200_000  # learned-position heatmap: positions × d cells sent to the browser


def sinusoid_figures(n: int, d: int, p: int, k: int, data: dict | None = None):
    """Figures and the rotation check for the sinusoidal encoding with n positions and d dimensions; `data`, when
    given, receives the matrices behind them (for the export)."""
    pe = service.sinusoidal(n, d)  # [n, d]
    heat = plots.matrix_heatmap(
        pe, f"Sinusoidal encoding, eq. 4.1 (n = {n}, d = {d})", "dimension", "position", value_name="PE"
    )
    offsets = np.arange(0, n - p)
    dots = {f"PE({p})·PE({p}+k)": (pe[p] * pe[p + offsets]).sum(-1)}
    if p != 0:
        dots["PE(0)·PE(k)"] = (pe[0] * pe[offsets]).sum(-1)
    dot_fig = plots.line_figure(
        offsets,
        dots,
        "Dot product against offset k: it depends on k only, not on where you start",
        "offset k",
        "dot product",
        reference={"d/2 (k = 0)": d / 2},
    )
    sim = pe @ pe.T / (d / 2)  # |PE(p)|² = d/2, so this is the cosine
    sim_fig = plots.matrix_heatmap(
        sim,
        "Cosine similarity PE(p)·PE(q) / (d/2): near positions look alike",
        "position q",
        "position p",
        value_name="cosine",
    )
    check = service.pe_shift_check(pe, d, k)
    if data is not None:
        data["sinusoidal_pe"] = (pe, [str(i) for i in range(n)], [str(j) for j in range(d)], "position \\ dimension")
        data["sinusoidal_similarity"] = (sim, [str(i) for i in range(n)], [str(i) for i in range(n)], "p \\ q")
        data["sinusoidal_dot_vs_offset"] = (np.stack(list(dots.values()), 1), [str(o) for o in offsets], list(dots),
                                            "offset k")
    text = (
        f"**PE(p + {k}) is a rotation of PE(p)**, checked on all {check['pairs']} positions p: each "
        f"(sin, cos) pair i turns by "
        f"the angle k·ω_i with ω_i = 1/10000^(2i/d).  \n"
        f"max |PE(p+k) − R_k·PE(p)| = {check['analytic_max_error']:.1e} (R_k built from the formula; "
        f"max |R_k·R_kᵀ − I| = {check['rotation_orthogonality']:.1e}, so R_k is a rotation).  \n"
        f"Fitting one matrix by least squares to all pairs (PE(p), PE(p+k)), without the formula, leaves a residual of "
        f"{check['fit_max_error']:.1e}: one linear map serves every position."
    )
    return heat, dot_fig, sim_fig, text


def learned_figures(model, n: int, data: dict | None = None):
    table = learned_positions(model)
    if table is None:
        reason = (
            f"{model.config.family} adds the fixed sinusoids shown above: it has no learned position table."
            if model.config.positional == "sinusoidal"
            else f"{model.config.family} uses {model.config.positional} positions: it has no learned position table."
        )
        return plots.empty_figure(reason), plots.empty_figure(reason)
    table = service.to_numpy(table)
    rows = min(table.shape[0], max(2, n), max(2, MAX_LEARNED_CELLS // table.shape[1]))
    shown = table[:rows]
    if data is not None:
        data["learned_positions"] = (shown, [str(i) for i in range(rows)], [str(j) for j in range(shown.shape[1])],
                                     "position \\ dimension")
        data["learned_similarity"] = (service.cosine_similarity(shown), [str(i) for i in range(rows)],
                                      [str(i) for i in range(rows)], "p \\ q")
    heat = plots.matrix_heatmap(
        shown,
        f"This model's learned position embeddings (first {rows} of {table.shape[0]}; colours clipped at the 99th "
        "percentile)",
        "dimension",
        "position",
        value_name="value",
        clip_quantile=0.99,
    )
    sim = plots.matrix_heatmap(
        service.cosine_similarity(shown),
        "Cosine similarity of the learned positions",
        "position q",
        "position p",
        value_name="cosine",
    )
    return heat, sim


def rope_figures(model, text: str, layer: int, head: int, n: int, data: dict | None = None):
    cfg = model.config
    inv_freq = rope_frequencies(model)
    if inv_freq is None:
        reason = f"{cfg.family} uses {cfg.positional} positions, not RoPE."
        return plots.empty_figure(reason), plots.empty_figure(reason), ""
    freqs = inv_freq.double().cpu().numpy()  # θ_i, [head_dim/2]
    positions = np.arange(n)
    angles = np.mod(freqs[:, None] * positions[None, :], 2 * np.pi)  # [pairs, n]
    angle_fig = plots.matrix_heatmap(
        angles,
        f"RoPE rotation angle m·θ_i mod 2π (θ_i = {cfg.rope_theta:g}^(−2i/d_k), d_k = {cfg.head_dim})",
        "position m",
        "frequency pair i",
        colorscale="Twilight",
        symmetric=False,
        value_name="angle (rad)",
    )
    tokens = service.encode(model, text, max_tokens=256)
    if len(tokens.ids) < 2:
        raise service.UserError("The RoPE text needs at least 2 tokens.")
    query_pos, key_pos = len(tokens.ids) - 1, 0
    distances = np.arange(0, n)
    offsets = [0, 100, 1000]
    curves = service.rope_scores(model, tokens.ids, layer, head, query_pos, key_pos, distances, offsets)
    series = {f"key at position {m}, query at {m}+Δ": curves[m] for m in offsets}
    if data is not None:
        data["rope_angles"] = (angles, [str(i) for i in range(len(freqs))], [str(m) for m in positions],
                               "frequency pair \\ position")
        data[f"rope_scores_L{layer}_H{head}"] = (np.stack(list(series.values()), 1), [str(x) for x in distances],
                                                 list(series), "distance")
    score_fig = plots.line_figure(
        distances,
        series,
        f"Score q·k/√d_k vs distance Δ (layer {layer}, head {head}; q of "
        f"'{tokens.labels[query_pos]}', k of '{tokens.labels[key_pos]}')",
        "relative distance Δ (tokens)",
        "score",
    )
    spread = max(float(np.abs(curves[m] - curves[0]).max()) for m in offsets)
    text_out = (
        f"The three curves put the same query and key at different absolute positions; they differ by at most "
        f"{spread:.1e}, so with RoPE the score depends only on the distance Δ."
    )
    return angle_fig, score_fig, text_out


def positional_view(store: service.ModelStore, name, n, d, p, k, layer, head, text, progress=None,
                    data: dict | None = None):
    """All figures of the tab; the body of the `positional_encoding` endpoint. `data`, when given, receives every
    matrix behind them: name → (matrix, row labels, column labels, corner)."""
    n = service.check_range("Positions n", n, 2, service.MAX_PE_POSITIONS)
    d = service.check_range("Dimensions d", d, 2, service.MAX_PE_DIM)
    if d % 2:
        raise service.UserError(f"Dimensions d must be even (sin and cos come in pairs), got {d}.")
    p = service.check_range("Start position p", p, 0, n - 2)
    k = service.check_range("Offset k", k, 1, n - 1)
    heat, dot_fig, sim_fig, check_text = sinusoid_figures(n, d, p, k, data)
    model = store.get(name, progress)
    cfg = model.config
    layer = service.check_range("Layer", layer, 0, cfg.n_layers - 1)
    head = parse_head(head, cfg.n_heads, allow_mean=False)
    learned_heat, learned_sim = learned_figures(model, n, data)
    angle_fig, score_fig, rope_text = rope_figures(model, text, layer, head, n, data)
    return heat, dot_fig, sim_fig, check_text, learned_heat, learned_sim, angle_fig, score_fig, rope_text


def permutation_view(store: service.ModelStore, name, text, progress=None) -> str:
    """The permutation check on the text, positions off; the body of the `permutation_check` endpoint."""
    model = store.get(name, progress)
    tokens = service.encode(model, text, permutation.MAX_TOKENS)
    return permutation.permutation_check(model, tokens.ids).sentence()


def export_data(store: service.ModelStore, name, n, d, p, k, layer, head, text, progress=None) -> tuple[str, str]:
    """Every matrix of the tab as CSV in one .zip; the body of the `export_positions` endpoint."""
    data: dict = {}
    positional_view(store, name, n, d, p, k, layer, head, text, progress, data)
    files = {f"{key}.csv": export.matrix_csv(matrix, rows, cols, corner, [f"{name}: {key.replace('_', ' ')}"])
             for key, (matrix, rows, cols, corner) in data.items()}
    readme = (f"Positional encodings for {name}, n = {index_of(n)}, d = {index_of(d)}:\n"
              "sinusoidal_pe: eq. 4.1, PE(position, dimension)\n"
              "sinusoidal_similarity: PE(p)·PE(q) / (d/2)\n"
              f"sinusoidal_dot_vs_offset: PE(p)·PE(p+k) against k (p = {index_of(p)})\n"
              "learned_positions, learned_similarity: the model's own position table (GPT-2, BERT), when it has one\n"
              "rope_angles: m·θ_i mod 2π; rope_scores_*: q·k/√d_k against distance at three offsets (RoPE models)\n"
              "Nothing is pooled.\n")
    path = export.write(export.zip_of(files, readme), export.filename(name, "positions") + ".zip")
    return str(path), f"{len(files)} matrices as CSV: {', '.join(sorted(files))}."


def build(store: service.ModelStore, picker: Picker, initial) -> TabControls:
    model = picker.model
    gr.Markdown(LEAD, elem_classes=["tab-lead"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300, elem_classes=["tab-controls"]):
            with gr.Row():
                n = gr.Slider(2, service.MAX_PE_POSITIONS, value=128, step=1, label="Positions n", min_width=140)
                d = gr.Slider(2, service.MAX_PE_DIM, value=64, step=2, label="Dimensions d", min_width=140)
            with gr.Row():
                p = gr.Number(value=0, label="Start position p (dot product)", precision=0, min_width=120)
                k = gr.Number(value=5, label="Offset k (rotation check)", precision=0, min_width=120)
            with gr.Row():
                layer = gr.Number(value=0, label=f"Layer (RoPE scores; 0–{initial.config.n_layers - 1})", precision=0,
                                  elem_id="pe-layer", min_width=120)
                head = gr.Number(value=0, label=f"Head (RoPE scores; 0–{initial.config.n_heads - 1})", precision=0,
                                 elem_id="pe-head", min_width=120)
            text, _ = text_with_upload(
                "Text: its first and last tokens (of its first 256) give the RoPE query/key pair; the permutation "
                "check shuffles it",
                read_example("attention.txt"),
                "pe",
                lines=2,
            )
            button = gr.Button("Show positional encodings", variant="primary", elem_id="pe-run")
            with gr.Accordion("Download the data", open=False, elem_id="pe-export-box"):
                export_button = gr.Button("Export every matrix (CSV in a .zip)", size="sm", elem_id="pe-export")
                export_file = downloads.file_box("pe-export-file")
                export_note = gr.Markdown(elem_id="pe-export-note")
        with gr.Column(scale=3, min_width=340):
            gr.Markdown("### Sinusoidal (eq. 4.1)")
            with gr.Row():
                heat = gr.Plot(label="PE heatmap", elem_id="pe-heatmap", min_width=320)
                sim = gr.Plot(label="Similarity", elem_id="pe-similarity", min_width=320)
            dots = gr.Plot(label="Dot product vs offset", elem_id="pe-dots")
            check = gr.Markdown(label="rotation check", elem_id="pe-check")
            gr.Markdown("### The loaded model's learned positions (GPT-2, BERT)")
            with gr.Row():
                learned_heat = gr.Plot(label="Learned positions", elem_id="pe-learned", min_width=320)
                learned_sim = gr.Plot(label="Learned similarity", elem_id="pe-learned-sim", min_width=320)
            gr.Markdown("### Rotary positions (Llama-style models)")
            with gr.Row():
                angles = gr.Plot(label="Rotation angles", elem_id="pe-rope-angles", min_width=320)
                scores = gr.Plot(label="Score vs distance", elem_id="pe-rope-scores", min_width=320)
            rope_text = gr.Markdown(label="RoPE note", elem_id="pe-rope-note")
            gr.Markdown("### Order without positions: shuffle the tokens")
            perm_text = gr.Markdown(label="permutation check", elem_id="pe-permutation")
    with gr.Accordion("How to read this tab", open=False):
        gr.Markdown(INTRO)

    @user_errors
    def run(
        model_name,
        n_positions,
        d_model,
        start_position,
        offset,
        layer_index,
        head_index,
        text_value,
        progress=gr.Progress(),
    ):
        outputs = positional_view(
            store,
            model_name,
            n_positions,
            d_model,
            start_position,
            offset,
            layer_index,
            head_index,
            text_value,
            progress_callback(progress),
        )
        views = ("pe", "pe-dots", "pe-similarity", None, "learned-positions", "learned-similarity", "rope-angles",
                 "rope-scores")
        return tuple(
            downloads.plot(value, export.filename(model_name, view, index_of(layer_index), index_of(head_index))
                           if view and view.startswith("rope-scores") else export.filename(model_name, view))
            if view else value
            for value, view in zip(outputs, views + (None,))
        )

    inputs = [model, n, d, p, k, layer, head, text]
    button.click(
        run,
        inputs,
        [heat, dots, sim, check, learned_heat, learned_sim, angles, scores, rope_text],
        api_name="positional_encoding",
        concurrency_id=ANALYSIS,
        concurrency_limit=ANALYSIS_LIMIT,
    ).success(
        user_errors(lambda model_name, text_value: permutation_view(store, model_name, text_value)),
        [model, text],
        perm_text,
        api_name="permutation_check",
        concurrency_id=ANALYSIS,
        concurrency_limit=ANALYSIS_LIMIT,
    )

    @user_errors
    def export_positions(model_name, n_positions, d_model, start_position, offset, layer_index, head_index,
                         text_value, progress=gr.Progress()):
        return export_data(store, model_name, n_positions, d_model, start_position, offset, layer_index, head_index,
                           text_value, progress_callback(progress))

    export_button.click(export_positions, inputs, [export_file, export_note], api_name="export_positions",
                        concurrency_id=ANALYSIS, concurrency_limit=ANALYSIS_LIMIT)

    @user_errors
    def limits(name, layer_index, head_index):
        cfg = store.get(name).config
        return (
            gr.Number(value=kept_index(layer_index, cfg.n_layers), label=f"Layer (RoPE scores; 0–{cfg.n_layers - 1})"),
            gr.Number(value=kept_index(head_index, cfg.n_heads), label=f"Head (RoPE scores; 0–{cfg.n_heads - 1})"),
        )

    picker.loaded.success(limits, [model, layer, head], [layer, head], api_visibility="private")
    return TabControls(text, layer, head)
