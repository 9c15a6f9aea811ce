"""Positional encoding tab: the sinusoids of eq. 4.1, the loaded model's own learned positions, and RoPE
measured on the model's real query/key projections."""

from __future__ import annotations

import numpy as np
import gradio as gr

from core.inspect import learned_positions, rope_frequencies
from ui import plots, service
from ui.common import (
    ANALYSIS,
    ANALYSIS_LIMIT,
    parse_head,
    progress_callback,
    read_example,
    text_with_upload,
    user_errors,
)
from ui.model_picker import Picker

INTRO = """Attention alone ignores order (permuting the tokens permutes the output), so position has to be put in.
The original Transformer **adds** fixed sinusoids (eq. 4.1: PE(pos, 2i) = sin(pos / 10000^(2i/d)),
PE(pos, 2i+1) = cos(pos / 10000^(2i/d))); GPT-2 and BERT **learn** one vector per position; Llama-style models
**rotate** queries and keys (RoPE) so that a query·key score depends on how far apart the tokens are."""

MAX_LEARNED_CELLS = 200_000  # learned-position heatmap: positions × d cells sent to the browser


def sinusoid_figures(n: int, d: int, p: int, k: int):
    """Figures and the rotation check for the sinusoidal encoding with n positions and d dimensions."""
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


def learned_figures(model, n: int):
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


def rope_figures(model, text: str, layer: int, head: int, n: int):
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


def positional_view(store: service.ModelStore, name, n, d, p, k, layer, head, text, progress=None):
    """All figures of the tab; the body of the `positional_encoding` endpoint."""
    n = service.check_range("Positions n", n, 2, service.MAX_PE_POSITIONS)
    d = service.check_range("Dimensions d", d, 2, service.MAX_PE_DIM)
    if d % 2:
        raise service.UserError(f"Dimensions d must be even (sin and cos come in pairs), got {d}.")
    p = service.check_range("Start position p", p, 0, n - 2)
    k = service.check_range("Offset k", k, 1, n - 1)
    heat, dot_fig, sim_fig, check_text = sinusoid_figures(n, d, p, k)
    model = store.get(name, progress)
    cfg = model.config
    layer = service.check_range("Layer", layer, 0, cfg.n_layers - 1)
    head = parse_head(head, cfg.n_heads, allow_mean=False)
    learned_heat, learned_sim = learned_figures(model, n)
    angle_fig, score_fig, rope_text = rope_figures(model, text, layer, head, n)
    return heat, dot_fig, sim_fig, check_text, learned_heat, learned_sim, angle_fig, score_fig, rope_text


def build(store: service.ModelStore, picker: Picker, initial) -> None:
    model = picker.model
    gr.Markdown(INTRO)
    with gr.Row():
        n = gr.Slider(2, service.MAX_PE_POSITIONS, value=128, step=1, label="Positions n")
        d = gr.Slider(2, service.MAX_PE_DIM, value=64, step=2, label="Dimensions d")
        p = gr.Number(value=0, label="Start position p (dot product)", precision=0)
        k = gr.Number(value=5, label="Offset k (rotation check)", precision=0)
    with gr.Row():
        layer = gr.Number(value=0, label=f"Layer (RoPE scores; 0–{initial.config.n_layers - 1})", precision=0)
        head = gr.Number(value=0, label=f"Head (RoPE scores; 0–{initial.config.n_heads - 1})", precision=0)
        with gr.Column(scale=2):
            text, _ = text_with_upload(
                "Text whose first and last tokens (of its first 256) give the query/key pair",
                read_example("attention.txt"),
                "pe",
                lines=2,
            )
    button = gr.Button("Show positional encodings", variant="primary", elem_id="pe-run")
    gr.Markdown("### Sinusoidal (eq. 4.1)")
    with gr.Row():
        heat = gr.Plot(label="PE heatmap", elem_id="pe-heatmap")
        sim = gr.Plot(label="Similarity", elem_id="pe-similarity")
    dots = gr.Plot(label="Dot product vs offset", elem_id="pe-dots")
    check = gr.Markdown(label="rotation check", elem_id="pe-check")
    gr.Markdown("### The loaded model's learned positions (GPT-2, BERT)")
    with gr.Row():
        learned_heat = gr.Plot(label="Learned positions", elem_id="pe-learned")
        learned_sim = gr.Plot(label="Learned similarity", elem_id="pe-learned-sim")
    gr.Markdown("### Rotary positions (Llama-style models)")
    with gr.Row():
        angles = gr.Plot(label="Rotation angles", elem_id="pe-rope-angles")
        scores = gr.Plot(label="Score vs distance", elem_id="pe-rope-scores")
    rope_text = gr.Markdown(label="RoPE note", elem_id="pe-rope-note")

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
        return positional_view(
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

    button.click(
        run,
        [model, n, d, p, k, layer, head, text],
        [heat, dots, sim, check, learned_heat, learned_sim, angles, scores, rope_text],
        api_name="positional_encoding",
        concurrency_id=ANALYSIS,
        concurrency_limit=ANALYSIS_LIMIT,
    )

    @user_errors
    def limits(name):
        cfg = store.get(name).config
        return (
            gr.Number(value=0, label=f"Layer (RoPE scores; 0–{cfg.n_layers - 1})"),
            gr.Number(value=0, label=f"Head (RoPE scores; 0–{cfg.n_heads - 1})"),
        )

    picker.loaded.success(limits, model, [layer, head], api_visibility="private")
