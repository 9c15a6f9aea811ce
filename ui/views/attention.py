"""The Attention tab's views: the model view, the head view and the window as figures with a note, and the files
behind them; the bodies of the `attention` and `export_attention` endpoints."""

from __future__ import annotations

import numpy as np

from ui.plots.attention import LABEL_EVERY_TOKEN_UP_TO, attention_heatmap, model_view, pooled_heatmap, two_column_view
from ui.services import Services
from ui.services.attention import (EXPORTS, FULL_VIEW_TOKENS, HEAD_OVERVIEW_SIZE, CaptureCache, all_maps,
                                   capture_attention, check_export, checked_settings, clearest_head, pool_attention,
                                   pool_edges, text_positions, window_positions)
from ui.services.text import Encoded, encode
from ui.views import export
from ui.views.export import named

COLUMN_TOKENS = 40  # the two-column view draws at most this many tokens: more lines would be a blur
def head_figure(tokens: Encoded, matrix: np.ndarray, title: str, hide_special: bool = False):
    """One head's map [n, n] over the whole text: cell by cell with token labels up to FULL_VIEW_TOKENS, else
    pooled to HEAD_OVERVIEW_SIZE blocks per side (rows still sum to 1)."""
    n = len(tokens.ids)
    if n <= FULL_VIEW_TOKENS:
        pos = text_positions(tokens, hide_special)
        labels = [tokens.labels[p] for p in pos]
        return attention_heatmap(matrix[np.ix_(pos, pos)], labels, labels, title)
    edges = pool_edges(n, HEAD_OVERVIEW_SIZE)
    pooled = pool_attention(matrix, edges, edges)
    return pooled_heatmap(
        pooled, edges, edges, f"{title}: {n:,} tokens pooled to {len(edges) - 1}×{len(edges) - 1}"
    )
def columns_figure(tokens: Encoded, matrix: np.ndarray, positions: np.ndarray, title: str):
    """The two-column view of the window's first COLUMN_TOKENS queries, attending among themselves."""
    shown = positions[:COLUMN_TOKENS]
    cut = "" if len(shown) == len(positions) else f" (the window's first {COLUMN_TOKENS})"
    return two_column_view(matrix[np.ix_(shown, shown)], [tokens.labels[p] for p in shown],
                           f"{title}: tokens {shown[0]}–{shown[-1]}{cut}; hover a token to see only its lines")


def checked_view(services: Services, model_name, text_value, layer_index, head_index, window_query_start,
                 window_key_start, window_size, progress=None):
    """The model and the tab's settings checked against it and the text: (model, tokens, layer, head, first query,
    first key, window)."""
    model = services.models.get(model_name, progress)
    return model, *checked_settings(model, text_value, layer_index, head_index, window_query_start, window_key_start,
                                    window_size, services.settings.max_attention_tokens)


def attention_view(
    services: Services,
    model_name,
    text_value,
    layer_index,
    head_index,
    hide_special_tokens,
    window_query_start,
    window_key_start,
    window_size,
    previous: CaptureCache | None = None,
    progress=None,
):
    """Figures of the model view, the head view and the window, a note, and the capture to keep for the next
    call of this session; the body of the `attention` endpoint."""
    name, hide_special = model_name, bool(hide_special_tokens)
    model, tokens, layer, head, q_start, k_start, window = checked_view(
        services, name, text_value, layer_index, head_index, window_query_start, window_key_start, window_size, progress)
    cfg, n = model.config, len(tokens.ids)

    result = capture_attention(model, name, tokens, layer, head, services.kept, previous)
    head_name = "mean of heads" if head is None else f"head {head}"
    side = result.overview.shape[-1]
    if cfg.is_encoder_decoder:
        direction = "the encoder's self-attention (bidirectional)"
    else:
        direction = "bidirectional (encoder)" if not cfg.causal else "causal (decoder)"
        sliding = [i for i in range(cfg.n_layers) if cfg.layer_type(i) == "sliding"]
        if sliding and cfg.sliding_window is not None:  # a window of keys is part of those layers' mask
            where = "every layer" if len(sliding) == cfg.n_layers else f"layers {', '.join(map(str, sliding))}"
            direction += f", a sliding window of {cfg.sliding_window} keys on {where}"
    model_fig = model_view(
        result.overview,
        f"{cfg.n_layers} layers × {cfg.n_heads} heads, {direction}"
        + ("" if side == n else f", tiles pooled to {side}×{side}"),
    )
    matrix = result.head_matrix
    head_fig = head_figure(tokens, matrix, f"Layer {layer}, {head_name}", hide_special)
    q_pos, k_pos = window_positions(tokens, q_start, k_start, window, hide_special)
    window_fig = attention_heatmap(
        matrix[np.ix_(q_pos, k_pos)],
        [tokens.labels[p] for p in q_pos],
        [tokens.labels[p] for p in k_pos],
        f"Queries {q_pos[0]}–{q_pos[-1]} × keys {k_pos[0]}–{k_pos[-1]}, full resolution",
        height=560,
    )
    columns_fig = columns_figure(tokens, matrix, q_pos, f"Layer {layer}, {head_name}")
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
    if LABEL_EVERY_TOKEN_UP_TO < n <= FULL_VIEW_TOKENS:
        notes.append(f"Head view: one cell per token pair, but above {LABEL_EVERY_TOKEN_UP_TO} tokens only some are "
                     "labelled; the window below names every token of the part it shows.")
    if n > FULL_VIEW_TOKENS:
        notes.append(
            "Head view: each cell is the mean, over a block of queries, of the weight they put on a block of keys, "
            "so rows still sum to 1. The window below shows single tokens exactly; move it to see any part."
        )
    if hide_special and any(tokens.special):
        notes.append("Special tokens are hidden in the head view and window (their weights are not renormalised).")
    names = figure_names(name, layer, head)
    figures = [named(fig, image) for fig, image in zip((model_fig, head_fig, window_fig, columns_fig), names)]
    return "  \n".join(notes), *figures, result.capture


def first_view(services: Services, model_name, text_value, layer_index, head_index, hide_special_tokens,
               window_query_start, window_key_start, window_size, previous: CaptureCache | None = None,
               progress=None):
    """What the tab opens on: not the layer and head it was built with but the head with the clearest pattern on
    this text, the one that puts the most weight on each query's previous token (the Heads tab's score), with a
    note that says why. Returns that layer and head for the inputs, then the tab's own view of them."""
    model = services.models.get(model_name, progress)
    tokens = encode(model, text_value, services.settings.max_attention_tokens)
    layer, head, score = clearest_head(model, tokens)
    note, *figures, kept = attention_view(services, model_name, text_value, layer, str(head), hide_special_tokens,
                                          window_query_start, window_key_start, window_size, progress=progress)
    cfg = model.config
    why = (f"Opened on **L{layer} H{head}**: of the model's {cfg.n_layers * cfg.n_heads} heads, it puts the most "
           f"weight on the token just before each query on this text ({score:.2f} of each row on average; the "
           "Heads tab calls it the previous-token score). Choose any layer and head to compare.")
    return layer, str(head), why + "  \n" + note, *figures, kept


def export_data(services: Services, model_name, text_value, layer_index, head_index, hide_special_tokens,
                window_query_start, window_key_start, window_size, export_kind,
                previous: CaptureCache | None = None, progress=None):
    """The file behind the tab: the chosen head (or mean) over the whole text or the window as CSV, or every layer ×
    head as float16 .npz; the body of the `export_attention` endpoint. Returns (path, note)."""
    name, what, hide_special = model_name, check_export(export_kind), bool(hide_special_tokens)
    model, tokens, layer, head, q_start, k_start, window = checked_view(
        services, name, text_value, layer_index, head_index, window_query_start, window_key_start, window_size, progress)
    cfg, n = model.config, len(tokens.ids)
    if what == "all maps .npz":
        side = min(n, export.npz_side_limit(cfg.n_layers * cfg.n_heads))
        overview = all_maps(model, tokens, side)
        pooled = (f"every map pooled from {n:,} to {side} positions per side (adaptive average pooling: bin_start and "
                  "bin_end give each bin's tokens) to stay under 50 MB" if side < n else "not pooled: one row and "
                  "column per token")
        note = f"{name}: {cfg.n_layers} layers × {cfg.n_heads} heads over {n:,} tokens, {pooled}."
        data = export.attention_npz(overview, tokens.labels, name, note)
        path = export.write(data, export.filename(name, "all-maps") + ".npz")
        return str(path), note
    result = capture_attention(model, name, tokens, layer, head, services.kept, previous)
    head_name = "mean of heads" if head is None else f"head {head}"
    if what == "head CSV":
        q_pos = k_pos = text_positions(tokens, hide_special, "export them")
        what_text, view = f"layer {layer}, {head_name}, the whole text", "head"
    else:
        q_pos, k_pos = window_positions(tokens, q_start, k_start, window, hide_special)
        what_text = f"layer {layer}, {head_name}, queries {q_pos[0]}–{q_pos[-1]} × keys {k_pos[0]}–{k_pos[-1]}"
        view = f"window-q{q_pos[0]}-k{k_pos[0]}"
    matrix = result.head_matrix[np.ix_(q_pos, k_pos)]
    text_csv, pooled = export.attention_csv(matrix, [tokens.labels[p] for p in q_pos],
                                            [tokens.labels[p] for p in k_pos], what_text, name)
    path = export.write(text_csv, export.filename(name, view, layer, head) + ".csv")
    note = f"{name}: {what_text}" + (f"; {pooled}." if pooled else ", one cell per token pair.")
    return str(path), note


def figure_names(name: str, layer, head) -> tuple[str, str, str, str]:
    """Image filenames of the model view, the head view, the window and the two-column view."""
    return (export.filename(name, "model-view"), export.filename(name, "head-view", layer, head),
            export.filename(name, "window", layer, head), export.filename(name, "two-column", layer, head))
