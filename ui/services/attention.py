"""The Attention tab's numbers: every layer × head pooled for the model view (core.analysis.capture), one layer at full
resolution, block pooling that keeps rows summing to 1, and the window's positions.

A session keeps its last capture's overview in the server-wide KeptStore under its ticket (CaptureCache, a few
bytes in the session's state), so a new layer or window on the same text skips the all-layer pass.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from core.analysis.capture import AttentionMaps, capture, stack_inputs
from core.analysis.heads import pattern_scores
from ui.services.checks import UserError, check_choice, check_range, parse_head
from ui.services.kept import KeptStore, new_ticket
from ui.services.text import Encoded, as_batch, encode

FULL_VIEW_TOKENS = 256  # up to this many tokens a head is drawn cell by cell, with labels
HEAD_OVERVIEW_SIZE = 256  # longer inputs: the head view is pooled to this many blocks per side
MODEL_VIEW_CELLS = 600_000  # cells in the model-view mosaic (uint8): about 1 MB of JSON
MAX_WINDOW = 256  # the full-resolution window is at most this many tokens per side
EXPORTS = ("head CSV", "window CSV", "all maps .npz")  # the files behind the Attention tab
def pool_edges(n: int, blocks: int) -> np.ndarray:
    """Block boundaries splitting n positions into min(n, blocks) nearly equal blocks."""
    blocks = max(1, min(n, blocks))
    return np.unique(np.linspace(0, n, blocks + 1).round().astype(int))


def pool_attention(probs: np.ndarray, q_edges: np.ndarray, k_edges: np.ndarray) -> np.ndarray:
    """Pool [..., Tq, Tk] attention into blocks: cell (i, j) is the mean over the queries of block i of the
    weight they put on keys of block j. Rows still sum to 1, so a pooled row reads like a real one."""
    summed = np.add.reduceat(probs, k_edges[:-1], axis=-1)  # [..., Tq, Sk]
    summed = np.add.reduceat(summed, q_edges[:-1], axis=-2)  # [..., Sq, Sk]
    counts = np.diff(q_edges).astype(np.float32)
    return summed / counts[:, None]


@dataclass
class AttentionResult:
    tokens: Encoded
    overview: np.ndarray  # [L, H, S, S] block-averaged (S = n when short)
    layer: int
    head: int | None  # None: mean over the layer's heads
    head_matrix: np.ndarray  # [n, n] the chosen head (or mean), full resolution
    seconds: float
    reused: bool  # the all-layer pass was kept from the previous call on the same text
    capture: "CaptureCache"


@dataclass(frozen=True)
class CaptureCache:
    """What a session keeps between calls of the Attention tab: which text its capture was of, and the ticket
    of that capture in the server-wide KeptStore. A few bytes: no arrays, no model."""

    key: tuple  # (model name, token count, hash of the ids)
    ticket: str

    def overview(self, kept: KeptStore) -> np.ndarray | None:
        """The kept overview [L, H, S, S] float32, or None once the budget dropped it."""
        found = kept.get(self.ticket, self.key)
        return None if found is None else found.astype(np.float32)


def model_view_tile(n_tokens: int, n_layers: int, n_heads: int) -> int:
    """Tile side for the model view so the mosaic stays within MODEL_VIEW_CELLS."""
    side = int(math.sqrt(MODEL_VIEW_CELLS / max(1, n_layers * n_heads))) - 1
    return max(4, min(n_tokens, 64, side))


def capture_attention(
    model, model_name: str, tokens: Encoded, layer: int, head: int | None, kept: KeptStore,
    previous: CaptureCache | None = None,
) -> AttentionResult:
    """Every layer × head pooled for the model view (core.analysis.capture), and one layer at full resolution.

    Which view gets which resolution: the model view gets block averages (tile side from model_view_tile);
    the head view and the window get the chosen layer exactly: kept from the same pass on a new text, recomputed
    by a pass up to that layer when only the layer or window changes."""
    cfg = model.config
    n = len(tokens.ids)
    key = (model_name, n, hash(tuple(tokens.ids)))
    ticket = previous.ticket if previous is not None else new_ticket()
    started = time.perf_counter()
    ids = as_batch(tokens.ids, model.device)
    overview = kept.get(ticket, key) if previous is not None else None
    reused = overview is not None
    if reused:  # the chosen layer alone, by a pass up to it
        maps = AttentionMaps(overview.astype(np.float32), n, model, stack_inputs(model, ids))
    else:
        tile = model_view_tile(n, cfg.n_layers, cfg.n_heads)
        # the chosen layer at full resolution in the same pass (a seq2seq model: its encoder's); other layers
        # are recomputed when asked for
        maps = capture(model, ids, overview_size=tile, keep_full_up_to=0, keep_layers={layer})
        overview = maps.overview.astype(np.float16)
        kept.put(ticket, key, overview, overview.nbytes)
    head_matrix = maps.head(layer, head)
    seconds = time.perf_counter() - started
    return AttentionResult(tokens, maps.overview, layer, head, head_matrix, seconds, reused, CaptureCache(key, ticket))


def clearest_head(model, tokens: Encoded) -> tuple[int, int, float]:
    """The head whose pattern is plainest to see on this text: the most weight on each query's previous token
    (core.analysis.heads' previous_token score, one pass that keeps no maps). Returns (layer, head, score)."""
    scores = pattern_scores(model, as_batch(tokens.ids, model.device))["previous_token"]  # [L, H]
    layer, head = divmod(int(scores.argmax()), scores.shape[1])
    return layer, head, float(scores[layer, head])


def visible_positions(tokens: Encoded, start: int, stop: int, hide_special: bool) -> np.ndarray:
    """Positions start..stop-1, without special tokens when asked."""
    positions = np.arange(start, stop)
    if hide_special:
        positions = positions[[not tokens.special[p] for p in positions]]
    return positions
def text_positions(tokens: Encoded, hide_special: bool, what: str = "see them") -> np.ndarray:
    """Every position of the text (without special tokens when asked), or a UserError when none is left."""
    positions = visible_positions(tokens, 0, len(tokens.ids), hide_special)
    if positions.size == 0:
        raise UserError(f"Every token is a special token; untick 'hide special tokens' to {what}.")
    return positions


def check_export(kind) -> str:
    """One of EXPORTS, or a UserError listing them."""
    return check_choice("Export", kind, EXPORTS)


def all_maps(model, tokens: Encoded, side: int) -> np.ndarray:
    """Every layer × head's map over the text, pooled to `side` positions per side: [L, H, side, side]."""
    return capture(model, as_batch(tokens.ids, model.device), overview_size=side, keep_full_up_to=0).overview


def window_positions(tokens: Encoded, q_start: int, k_start: int, window: int, hide_special: bool):
    """Query and key positions of the window (without special tokens when asked), or a UserError."""
    n = len(tokens.ids)
    q_pos = visible_positions(tokens, q_start, min(n, q_start + window), hide_special)
    k_pos = visible_positions(tokens, k_start, min(n, k_start + window), hide_special)
    if q_pos.size == 0 or k_pos.size == 0:
        raise UserError("The window holds only special tokens; move it or untick 'hide special tokens'.")
    return q_pos, k_pos


def checked_settings(model, text, layer, head, q_start, k_start, window, max_tokens):
    """The tab's settings checked against the model and the text: (tokens, layer, head, q_start, k_start, window)."""
    cfg = model.config
    tokens = encode(model, text, max_tokens)
    n = len(tokens.ids)
    layer = check_range("Layer", layer, 0, cfg.n_layers - 1)
    head = parse_head(head, cfg.n_heads)
    window = check_range("Window size", window, 2, MAX_WINDOW)
    q_start = check_range("Window query start", q_start, 0, max(n - 1, 0))
    k_start = check_range("Window key start", k_start, 0, max(n - 1, 0))
    return tokens, layer, head, q_start, k_start, window


def score_formula(cfg) -> str:
    """The scaled scores of eq. 2.1 as this model computes them: "QKᵀ/√d_k", or QKᵀ times its own factor
    (1 for T5, query_pre_attn_scalar^-½ for Gemma 2 and 3; config.score_scale)."""
    if cfg.attn_scale is None and cfg.scale_attention:
        return "QKᵀ/√d_k"
    return "QKᵀ (no 1/√d_k)" if cfg.score_scale == 1.0 else f"QKᵀ × {cfg.score_scale:.4g}"
