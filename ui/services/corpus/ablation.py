"""Each head's ablation over a corpus (core/analysis/over.py ablation_over: the mean increase of a text's
next-token loss when that head alone is removed, Over [L, H]) as the Across texts tab runs it: over.stream_over
"ablation", in a worker thread here or in chunks on the Ray backend, saved item by item. A sweep runs the model once
per head and text, so only the first ABLATION_TEXTS texts are swept; the core's note says how many of how many."""

from __future__ import annotations

import dataclasses

from core.analysis.over import ABLATION_TEXTS
from core.corpus.jobs import LIMIT_HINT
from core.corpus.stats import Over
from ui.services.checks import UserError
from ui.services.corpus.over import check_model
from ui.services.heads import lm_head_reason

__all__ = ["ABLATION_TEXTS", "check_ablation_model", "for_page"]

ADVICE = "Choose a model with an LM head (e.g. smollm2-135m-instruct)."


def check_ablation_model(model) -> None:
    """An encoder-decoder is refused as by every corpus job; a model without an LM head has no loss to change.
    (An encoder with its masked-LM head is swept on the loss it predicts its own tokens with, as the Heads tab's
    sweep is.)"""
    check_model(model, "heads")
    reason = lm_head_reason(model, "Ablation")
    if reason:
        raise UserError(f"{reason} {ADVICE}")


def for_page(over: Over | None) -> Over | None:
    """The result as the page states it: the core's note without its hint for API callers (pass limit=None), as
    the page has no such setting; the numbers are the core's."""
    if over is None or LIMIT_HINT not in over.note:
        return over
    return dataclasses.replace(over, note=over.note.replace(LIMIT_HINT, ""))
