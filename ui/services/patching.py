"""What carries the answer, as plain values over core.analysis.patching: a clean and a corrupted prompt checked
and encoded, the answer and foil tokens (typed, or the two runs' top tokens), the patching sweep streamed with
its progress, direct logit attribution, and the information-flow graph."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from core.analysis import patching
from ui.services.checks import UserError, check_float, check_range
from ui.services.jobs import JobUpdate, stream_job
from ui.services.text import Encoded, as_batch, encode, one_token, token_pieces, token_texts

MAX_PATCH_TOKENS = 64   # a residual sweep patches layers × tokens cells (1,920 for SmolLM2 at 64 tokens)
MAX_FLOW_TOKENS = 64    # the flow graph holds layers × heads × tokens² importances
DEFAULT_THRESHOLD = 0.04
PRESETS = {  # name → (clean, corrupted): the answer is the clean run's top token, the foil the corrupted run's
    "IOI: who gets the drink": ("When Mary and John went to the store, John gave a drink to",
                                "When Mary and John went to the store, Mary gave a drink to"),
    "Fact: which city": ("The Eiffel Tower is in the city of", "The Colosseum is in the city of"),
    "Induction: a repeated phrase": ("The keeper lit the lamp at dusk. The keeper lit the",
                                     "The farmer fed the goats at noon. The keeper lit the"),
}
SITES = {  # the API's site name → (core site, by position at one layer)
    "resid_pre": ("resid_pre", False),
    "attn_out": ("attn_out", False),
    "mlp_out": ("mlp_out", False),
    "z": ("z", False),
    "z_by_position": ("z", True),
}


def patching_reason(model) -> str | None:
    """Why this model cannot be patched here, or None when it can."""
    cfg = model.config
    if cfg.is_encoder_decoder:
        return ("Patching compares next-token predictions of one prompt, and this is an encoder-decoder: its "
                "predictions come from a decoder that needs a target text of its own. Choose a decoder model.")
    if not cfg.causal or model.lm_head is None:
        return ("Patching compares next-token predictions, and this model is an encoder: it reads the text in both "
                "directions and predicts no next token. Choose a decoder model (e.g. smollm2-135m-instruct).")
    return None


def attribution_reason(model) -> str | None:
    """Why direct logit attribution and the flow graph cannot read this model, or None."""
    reason = patching_reason(model)
    if reason is None and model.config.norm_placement != "pre":
        reason = ("These read the final residual stream as a sum of parts, which needs Pre-LN blocks: a Post-LN "
                  "block's norm mixes the parts.")
    return reason


class TokenMismatch(UserError):
    """The two prompts have different token counts; `rows` lists them side by side."""

    def __init__(self, text: str, rows: list[list]):
        super().__init__(text)
        self.rows = rows


@dataclass
class PatchPair:
    clean: Encoded
    corrupted: Encoded
    answer: int
    foil: int
    chosen: str          # how the answer and foil were chosen, in words
    pieces: tuple[str, str]   # the answer's and the foil's own text (a leading space kept)

    @property
    def ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        return as_batch(self.clean.ids), as_batch(self.corrupted.ids)


def side_by_side(model, clean: Encoded, corrupted: Encoded) -> list[list]:
    """[position, clean token, corrupted token] rows, '' where one prompt has no token."""
    a, b = token_texts(model, clean.ids), token_texts(model, corrupted.ids)
    return [[i, a[i] if i < len(a) else "", b[i] if i < len(b) else ""] for i in range(max(len(a), len(b)))]


def top_tokens(model, ids: list[int], k: int = 2) -> list[int]:
    with torch.inference_mode():
        logits = model(as_batch(ids, model.device)).logits[0, -1]
    return logits.topk(k).indices.tolist()


def prepare_pair(model, clean_text, corrupted_text, answer_text, foil_text) -> PatchPair:
    """Both prompts encoded (the same token count, at most MAX_PATCH_TOKENS), and the answer and foil ids."""
    reason = patching_reason(model)
    if reason:
        raise UserError(reason)
    clean = encode(model, clean_text, MAX_PATCH_TOKENS)
    if corrupted_text is None or (isinstance(corrupted_text, str) and not corrupted_text.strip()):
        raise UserError("The corrupted prompt is empty: type the clean prompt with the detail that matters changed.")
    corrupted = encode(model, corrupted_text, MAX_PATCH_TOKENS)
    if len(clean.ids) != len(corrupted.ids):
        raise TokenMismatch(
            f"The two prompts must have the same number of tokens, position for position, and the clean one has "
            f"{len(clean.ids)} while the corrupted one has {len(corrupted.ids)}. Change a word for one of the same "
            "token count (the tokens are listed side by side).", side_by_side(model, clean, corrupted))
    answer = one_token(model, "Answer", answer_text, "to use the clean run's top token")
    foil = one_token(model, "Foil", foil_text, "to use the corrupted run's top token")
    chosen = []
    if answer is None:
        answer = top_tokens(model, clean.ids, 1)[0]
        chosen.append("the answer is the clean run's top token")
    if foil is None:
        ranked = top_tokens(model, corrupted.ids)
        foil = ranked[1] if ranked[0] == answer else ranked[0]
        chosen.append("the foil is the corrupted run's top token" + (" after the answer" if ranked[0] == answer else ""))
    if answer == foil:
        raise UserError("The answer and the foil are the same token, so their logit difference is always 0: choose "
                        "two different tokens (or leave the foil empty).")
    return PatchPair(clean, corrupted, answer, foil, "; ".join(chosen), tuple(token_pieces(model, [answer, foil])))


def check_site(name) -> tuple[str, bool]:
    if not isinstance(name, str) or name not in SITES:
        raise UserError(f"Site must be one of {', '.join(SITES)}, got {str(name)[:40]!r}.")
    return SITES[name]


def check_mode(name) -> str:
    if not isinstance(name, str) or name not in patching.MODES:
        raise UserError(f"Mode must be 'denoise' or 'noise', got {str(name)[:40]!r}.")
    return name


def sweep_shape(model, site: str, by_position: bool, n_tokens: int) -> tuple[int, int]:
    cfg = model.config
    if site == "z":
        return (cfg.n_heads, n_tokens) if by_position else (cfg.n_layers, cfg.n_heads)
    return cfg.n_layers, n_tokens


def stream_patching(model, pair: PatchPair, site_name: str, mode: str, layer) -> Iterator[JobUpdate]:
    """The sweep in a worker thread, an update after each batch and then the core's PatchSweep as the result."""
    site, by_position = check_site(site_name)
    mode = check_mode(mode)
    chosen = check_range("Layer", layer, 0, model.config.n_layers - 1) if by_position else None
    clean, corrupted = pair.ids
    total = sweep_shape(model, site, by_position, len(pair.clean.ids))
    work = lambda report: patching.patch_sweep(  # noqa: E731
        model, clean.to(model.device), corrupted.to(model.device), pair.answer, pair.foil, site, mode, chosen,
        progress=report)
    return stream_job(work, total[0] * total[1], "patch-sweep")


def logit_parts(model, pair: PatchPair) -> patching.LogitAttribution:
    """Direct logit attribution of logit(answer) − logit(foil) on the clean prompt's last position."""
    reason = attribution_reason(model)
    if reason:
        raise UserError(reason)
    return patching.logit_attribution(model, pair.ids[0].to(model.device), pair.answer, pair.foil)


def check_threshold(value) -> float:
    return check_float("Threshold", value, 0.0, 1.0)


def flow(model, tokens: Encoded, threshold) -> patching.FlowGraph:
    """The information-flow graph of the last token's prediction, pruned at `threshold`."""
    reason = attribution_reason(model)
    if reason:
        raise UserError(reason)
    return patching.flow_graph(model, as_batch(tokens.ids, model.device), -1, check_threshold(threshold))


def encode_flow(model, text) -> Encoded:
    return encode(model, text, MAX_FLOW_TOKENS)
