"""One generated token, looked at: where it ranked, its attention over the context (and source), per layer and
head; and the whole trace as plain numbers for the API and the download."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ui.services.attention import pool_edges
from ui.services.checks import UserError, check_range
from ui.services.generation import MAX_TRACE_BYTES, GenerationTrace, cap_note
from ui.services.kept import KeptStore
from ui.services.text import token_pieces, token_texts

OVERVIEW_KEYS = 256  # the layers × heads overview of one row pools its keys into at most this many blocks
def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def pick_sentence(model, trace: GenerationTrace, step: int) -> str:
    token = token_texts(model, [trace.tokens[step]])[0]
    rank, p = trace.chosen_rank[step], trace.chosen_prob[step]
    where = "the most likely" if rank == 1 else f"the {ordinal(rank)} most likely"
    return f"The picked token {token!r} was {where}, p = {p:.3g}."


def trace_summary(model, trace: GenerationTrace, kept: KeptStore) -> dict:
    """Per generated token: its text, the model's top-10 next tokens with probabilities, the picked one's rank."""
    steps = []
    for i, token in enumerate(trace.tokens):
        names = token_texts(model, trace.top_ids[i].tolist())
        steps.append({
            "step": i,
            "token": token_texts(model, [token])[0],
            "token_id": token,
            "probability": round(trace.chosen_prob[i], 6),
            "rank": trace.chosen_rank[i],
            "top": [{"token": n, "id": int(t), "p": round(float(p), 6)}
                    for n, t, p in zip(names, trace.top_ids[i], trace.top_probs[i])],
        })
    return {
        "model": trace.model_name,
        "prompt": trace.prompt_text,
        "continuation": trace.new_text,
        "n_tokens": len(trace.tokens),
        "stop_reason": trace.stop_reason,
        "attention_rows_kept": trace.rows_kept(kept),
        "attention_rows_cap_bytes": MAX_TRACE_BYTES,
        "steps": steps,
    }


@dataclass
class StepView:
    step: int
    layer: int
    head: int
    token: str
    sentence: str  # where the picked token ranked
    top_tokens: list[str]
    top_probs: np.ndarray  # [10]
    chosen_in_top: int | None  # its index among the top 10, None when it ranked lower
    keys: list[str]  # unique labels of the context tokens ("12 the")
    rows: np.ndarray | None  # [L, H, Tk] float32, None past the cap
    pieces: list[str]  # the decoder sequence's own text: prompt (or start) + every generated token
    source_keys: list[str] = field(default_factory=list)  # seq2seq
    cross_rows: np.ndarray | None = None  # [L, H, S]
    source_pieces: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def head_row(self) -> np.ndarray | None:
        return None if self.rows is None else self.rows[self.layer, self.head]

    @property
    def mean_row(self) -> np.ndarray | None:
        return None if self.rows is None else self.rows[self.layer].mean(0)

    def numbers(self) -> dict:
        """The rows of the chosen layer as plain lists, for the API."""
        out = {"step": self.step, "token": self.token, "layer": self.layer, "head": self.head,
               "keys": self.keys, "head_row": None, "mean_row": None, "note": self.note}
        if self.rows is not None:
            out["head_row"] = self.head_row.tolist()
            out["mean_row"] = self.mean_row.tolist()
        if self.cross_rows is not None:
            out["source_keys"] = self.source_keys
            out["cross_head_row"] = self.cross_rows[self.layer, self.head].tolist()
            out["cross_mean_row"] = self.cross_rows[self.layer].mean(0).tolist()
        return out


def check_trace(trace: GenerationTrace | None) -> GenerationTrace:
    if trace is None or not trace.tokens:
        raise UserError("Generate something first: the step view reads this session's last generation.")
    return trace


def position_labels(model, ids: list[int], start: int = 0) -> list[str]:
    return [f"{start + i} {t}" for i, t in enumerate(token_texts(model, ids))]


def step_view(model, trace: GenerationTrace | None, step, layer, head, kept: KeptStore) -> StepView:
    """The chosen token's attention over its context (and source), its probabilities, for one layer and head."""
    trace = check_trace(trace)
    step = check_range("Step", step, 0, len(trace.tokens) - 1)
    layer = check_range("Layer", layer, 0, trace.n_layers - 1)
    head = check_range("Head", head, 0, trace.n_heads - 1)
    top = trace.top_ids[step].tolist()
    chosen = trace.tokens[step]
    decoder_ids = trace.prompt_ids + trace.tokens
    rows = trace.rows(kept)[step]
    view = StepView(
        step=step, layer=layer, head=head,
        token=token_texts(model, [chosen])[0],
        sentence=pick_sentence(model, trace, step),
        top_tokens=token_texts(model, top),
        top_probs=trace.top_probs[step].astype(np.float32),
        chosen_in_top=top.index(chosen) if chosen in top else None,
        keys=position_labels(model, trace.context_ids(step)),
        rows=None if rows is None else rows.astype(np.float32),
        pieces=token_pieces(model, decoder_ids),
    )
    if trace.seq2seq:
        view.source_keys = position_labels(model, trace.source_ids)
        view.source_pieces = token_pieces(model, trace.source_ids)
        cross = trace.cross_rows(kept)[step]
        view.cross_rows = None if cross is None else cross.astype(np.float32)
    if rows is None:
        view.note = cap_note(trace, kept)
    return view


def pooled_overview(rows: np.ndarray, keys: list[str]) -> tuple[np.ndarray, list[str]]:
    """[L, H, Tk] → [L·H, Sk] with keys pooled to at most OVERVIEW_KEYS blocks (each a block's summed weight),
    and the keys' labels ("12 the", or "0–15" for a block)."""
    flat = rows.reshape(-1, rows.shape[-1])
    if rows.shape[-1] <= OVERVIEW_KEYS:
        return flat, keys
    edges = pool_edges(rows.shape[-1], OVERVIEW_KEYS)
    pooled = np.add.reduceat(flat, edges[:-1], axis=-1)
    return pooled, [f"{a}–{b - 1}" for a, b in zip(edges[:-1], edges[1:])]
