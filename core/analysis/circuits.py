"""Circuits as findings: whether a previous-token head feeds an induction head (Olsson et al., 2022), decided by one
rule that the Lab, the lessons, the scripts and the docs all call.

The rule, on scores measured over texts (core.analysis.heads' definitions) and what feeds the induction head's keys
(core.analysis.qk.composition_over, side "key"):
  1. the induction head's induction score is at least INDUCTION_MIN;
  2. among the single heads of earlier layers, the one with the largest mean share of its keys' relative score is
     a previous-token head: its previous-token score is at least PREVIOUS_MIN;
  3. that share is positive (the head writes what the keys are matched on, rather than working against it).

The minimums are the Heads tab's naming thresholds (core.analysis.heads.SCORES), so a head the circuit names is one
the Heads tab names too. Neither is near chance: a head spreading its attention evenly over a causal row of T keys
puts 1/(i + 1) on each key of query i, so its previous-token score is the mean of 1/(i + 1) over queries
i = 1..T−1, about ln T / T (0.081 on the Lab's 42-token probe texts), and its induction score the mean of 1/(i + 1)
over the second copy's queries (0.032 there). PREVIOUS_MIN = 0.5 asks that more than half of a head's attention
sits on the key just before the query, INDUCTION_MIN = 0.4 that two-fifths sits on the token after the earlier
copy; scores of 0.06–0.08, what a barely trained run gives, are chance and pass neither.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..corpus.stats import Over
from .heads import SCORES
from . import Part, head, upstream_parts
from .qk import CompositionOver

PREVIOUS_MIN = SCORES["previous_token"][1]    # a previous-token head: mean weight ≥ 0.5 on the key just before
INDUCTION_MIN = SCORES["induction"][1]        # an induction head: mean weight ≥ 0.4 on the token after the copy
OLSSON = "the circuit Olsson et al. (2022) describe"


@dataclass(frozen=True)
class InductionCircuit:
    """The decision and the scores it read. previous: the strongest previous-token head of the layers before the
    induction head; source: the earlier single head with the largest mean share of the induction head's keys
    (None where there is none, or no text gave a share), with its share and its own previous-token score."""
    induction: Part
    induction_score: float
    previous: Part | None
    previous_score: float
    source: Part | None
    source_share: float
    source_previous: float
    found: bool

    def scores(self) -> str:
        """The scores the decision read, each beside its minimum, in words."""
        parts = [f"induction {self.induction} {self.induction_score:.2f} "
                 f"{'≥' if self.induction_score >= INDUCTION_MIN else '<'} {INDUCTION_MIN:g}"]
        if self.previous is not None:
            parts.append(f"previous-token {self.previous} {self.previous_score:.2f} "
                         f"{'≥' if self.previous_score >= PREVIOUS_MIN else '<'} {PREVIOUS_MIN:g}")
        if self.source is None:
            parts.append("no earlier head's share of its keys was measured")
        else:
            parts.append(f"its keys fed most by {self.source} (share {self.source_share:+.2f}, previous-token "
                         f"{self.source_previous:.2f})")
        return "; ".join(parts)

    def words(self) -> str:
        """The finding in words: the circuit named, or "no circuit formed (scores …)" naming none."""
        if not self.found:
            return f"no circuit formed (scores: {self.scores()})"
        return (f"{self.source} (previous-token score {self.source_previous:.2f}) feeds the keys of "
                f"{self.induction} (induction score {self.induction_score:.2f}) more than any other earlier head "
                f"(share {self.source_share:+.2f}): {OLSSON}")


def check_table(name: str, table: Tensor, layers: int) -> None:
    if table.dim() != 2 or table.shape[0] < layers:
        raise ValueError(f"{name} scores must be a table [layers, heads] reaching layer {layers - 1}; got shape "
                         f"{tuple(table.shape)}")


def strongest(table: Tensor, layers: range) -> tuple[Part | None, float]:
    """The head of largest score in `layers` of table [L, H] (NaN, an unmeasured head, left out), and its score."""
    best, value = None, -math.inf
    for layer in layers:
        for index, score in enumerate(table[layer].tolist()):
            if not math.isnan(score) and score > value:
                best, value = head(layer, index), score
    return best, (value if best is not None else math.nan)


def induction_head(induction: Tensor) -> tuple[Part, float]:
    """The head of largest induction score [L, H] in layers ≥ 1 (a layer-0 head has no earlier head to read a
    previous token from), the one whose keys are then traced."""
    if induction.dim() != 2 or induction.shape[0] < 2:
        raise ValueError(f"induction scores must be a table [layers ≥ 2, heads]; got shape {tuple(induction.shape)}")
    found, score = strongest(induction, range(1, induction.shape[0]))
    if found is None:
        raise ValueError("no head of layers ≥ 1 has a measured induction score (all NaN)")
    return found, score


def induction_circuit(previous_token: Tensor, induction: Tensor, keys) -> InductionCircuit:
    """Whether a previous-token head feeds the induction head whose keys `keys` traced (a CompositionOver of side
    "key"), by the rule in this module's docstring. previous_token, induction: [L, H] scores over texts (NaN where
    not measured)."""
    if keys.side != "key":
        raise ValueError(f"the circuit is read on what feeds the induction head's keys (side 'key'), got {keys.side!r}")
    check_table("previous-token", previous_token, keys.layer)
    check_table("induction", induction, keys.layer + 1)
    target = head(keys.layer, keys.head)
    score = float(induction[keys.layer, keys.head])
    previous, previous_score = strongest(previous_token, range(keys.layer))
    shares = keys.shares.mean
    measured = [i for i in keys.heads() if not math.isnan(float(shares[i]))]
    source = max(measured, key=lambda i: float(shares[i]), default=None)
    if source is None:
        return InductionCircuit(target, score, previous, previous_score, None, math.nan, math.nan, False)
    part, share = keys.parts[source], float(shares[source])
    source_previous = float(previous_token[part.layer, part.head])
    found = score >= INDUCTION_MIN and source_previous >= PREVIOUS_MIN and share > 0
    return InductionCircuit(target, score, previous, previous_score, part, share, source_previous, found)


# ---- a saved run's trace as plain values, and back: the docs re-decide a stored run by the same rule ----

def keys_record(keys) -> dict:
    """What feeds a head's keys (a CompositionOver) as JSON-ready values: the labels, each part's mean share and
    interval as measured, and every text's shares."""
    shares = keys.shares
    return {"layer": keys.layer, "head": keys.head, "side": keys.side, "labels": list(keys.labels),
            "pairs": keys.pairs, "n": shares.n, "interval": shares.interval,
            "mean": shares.mean.tolist(), "low": shares.low.tolist(), "high": shares.high.tolist(),
            "per_item": shares.per_item.tolist()}


def stored_keys(record: dict, n_heads: int):
    """keys_record's values back as a CompositionOver (no weights-only scores: a record keeps none), its parts
    typed from the labels, so induction_circuit reads a saved run as it reads a live one."""
    t = lambda values: torch.tensor(values, dtype=torch.float32)                       # noqa: E731
    shares = Over(t(record["mean"]), t(record["low"]), t(record["high"]), t(record["per_item"]), record["n"],
                  interval=record["interval"])
    return CompositionOver(record["layer"], record["head"], record["side"], record["labels"], shares,
                           record["pairs"], None, upstream_parts(record["labels"], record["layer"], n_heads))
