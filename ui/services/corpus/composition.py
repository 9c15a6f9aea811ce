"""What feeds one head's keys or queries over the built-in induction texts (core.analysis.qk.composition_over),
beside what its weights alone allow (composition_scores), as plain values for the Heads tab: the named components
largest first with their intervals, the rest summed per text and summarised the same way."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from core.analysis import heads as head_scores
from core.analysis import qk
from core.analysis.circuits import induction_head
from core.corpus import texts as corpora
from core.corpus.stats import Over, summarise
from ui.services.checks import UserError, check_choice, check_head, check_range
from ui.services.corpus.over import induction_length
from ui.services.heads import INDUCTION_LENGTH, INDUCTION_SEED, next_token_reason
from ui.services.patching import refusals_in_words

MAX_TEXTS = 50        # induction texts one composition reads: each is one pass and 16 pairs' splits
DEFAULT_TEXTS = 20
TOP = 8               # components named in the bars; the others are summed per text into "rest"
SIDES = ("key", "query")


@dataclass
class Composition:
    layer: int
    head: int
    side: str                    # "key" or "query"
    labels: list[str]            # the named components, largest mean share first, then "rest"
    mean: np.ndarray             # [TOP + 1] each one's mean share over the texts
    low: np.ndarray              # [TOP + 1] the 95 % interval (NaN where too few texts)
    high: np.ndarray
    n: int
    interval: str                # the interval's method (core.corpus.stats), "" where too few texts
    note: str                    # the core's: the texts left out and why
    pairs: str                   # how each text's pairs were chosen and weighed, in words
    weights: np.ndarray          # [layer, H] the weights-only composition with each earlier head on this side
    source: str                  # the corpus in words
    traced: qk.CompositionOver   # every part, typed (parts), as the core measured it: what a finding reads


def check_side(side) -> str:
    return check_choice("Side", side, SIDES)


def top_and_rest(over: Over, labels: list[str], top: int = TOP) -> tuple[list[str], Over]:
    """The `top` components of largest |mean share| and "rest" (every other one's share summed on each text),
    as one Over of [top + 1] summarised over the same texts."""
    order = over.mean.abs().argsort(descending=True, stable=True).tolist()
    named, others = order[:top], order[top:]
    per_item = over.per_item
    columns = [per_item[:, i] for i in named]
    if others:
        columns.append(per_item[:, others].sum(1))
    stacked = torch.stack(columns, 1) if len(per_item) else torch.empty(0, len(columns))
    names = [labels[i] for i in named] + (["rest"] if others else [])
    return names, summarise(stacked, over.note, over.items, over.left_out, bounds=over.bounds)


def composition(model, layer, head, side, n, progress=None, stop=None) -> Composition:
    """composition_over of one head on n induction texts (the Heads tab's probe, seeds 0..n−1), the top
    components and the rest, and the weights-only scores of the same side. progress(done, total) and stop() as
    every corpus job's: a stopped job summarises the texts it finished."""
    layer, head = check_head(model, layer, head)
    side = check_side(side)
    n = check_range("Texts (n)", n, 1, MAX_TEXTS)
    length = induction_length(model)
    texts = corpora.induction_texts(model.tokenizer, n, length, bos=model.config.bos_token_id)
    source = f"{n} induction texts ({length} random tokens, repeated once, as the Heads tab's probe)"
    with refusals_in_words():
        found = qk.composition_over(model, texts, layer, head, side, progress=progress, stop=stop)
    if found.shares.n == 0:
        raise UserError(f"No text gave layer {layer}, head {head} a query that reads more than one key: "
                        f"{found.shares.note}")
    labels, over = top_and_rest(found.shares, found.labels)
    weights = (found.weights.k if side == "key" else found.weights.q).numpy()
    return Composition(layer, head, side, labels, over.mean.numpy(), over.low.numpy(), over.high.numpy(), over.n,
                       over.interval, over.note, found.pairs, weights, source, found)


def opening_head(model) -> tuple[int, int]:
    """(layer, head) that "What feeds a head" opens on: the model's strongest induction head by the Heads tab's
    induction score on its probe (core.analysis.circuits.induction_head, layers ≥ 1), whose keys an earlier head
    should feed; layer 1, head 0 on a model the probe cannot read (an encoder), layer 0 on a one-layer model."""
    fallback = (min(1, model.config.n_layers - 1), 0)
    if model.config.n_layers < 2 or next_token_reason(model, "The probe") is not None:
        return fallback
    probe = head_scores.induction(model, INDUCTION_LENGTH, INDUCTION_SEED)
    part, _ = induction_head(probe.scores)
    return part.layer, part.head
