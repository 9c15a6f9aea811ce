"""The induction circuit, found in a model trained to need it: ground truth for "what feeds a head".

A Lab decoder trained on copy-62 (<bos> s <sep> s <eos>, s random letters and digits, the loss on the second copy)
can only predict the second copy by looking back: at s[i] in the second copy, find s[i] in the first and read the
character after it. Olsson et al. (2022) show how a two-layer attention-only model does this: a layer-0
previous-token head writes each position's previous character into it, and a layer-1 induction head's keys read
that, so the query s[i] matches the key whose previous character is s[i]. `circuit` measures both scores of every
head on fresh random texts, asks core.analysis.qk.composition_over where the strongest induction head's keys come
from, and leaves the decision to core.analysis.circuits.induction_circuit (the one rule, with its minimums).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

from ..analysis import qk
from ..analysis.circuits import InductionCircuit, induction_circuit, induction_head
from ..analysis.heads import induction_score, row_scores
from .train import BOS, SEP, SYMBOLS, encode, letters

TEXTS = 16          # fresh random texts the circuit is measured on
LENGTH = 20         # characters in each copy (the longest the Lab's tasks make)


def probe_texts(n: int = TEXTS, length: int = LENGTH, seed: int = 0) -> list[Tensor]:
    """n texts <bos> s <sep> s [2·length + 2], s `length` random letters and digits from a seeded generator."""
    rng = random.Random(f"induction-probe-{seed}")
    texts = []
    for _ in range(n):
        s = encode(letters(rng, length, "".join(SYMBOLS)))
        texts.append(torch.tensor([BOS, *s, SEP, *s]))
    return texts


def second_copy_places(length: int) -> tuple[Tensor, Tensor]:
    """Queries: the second copy's characters s[i] at length + 2 + i (i < length − 1); keys: s[i + 1] of the first
    copy, at i + 2, the character after the earlier s[i] (what an induction head reads)."""
    i = torch.arange(length - 1)
    return length + 2 + i, i + 2


@dataclass
class Circuit:
    """Every head's previous-token and induction scores [L, H] (means over the texts), what feeds the strongest
    induction head's keys over the same texts, and the decision read from them (finding)."""
    previous_token: Tensor      # [L, H] mean weight on the key just before the query
    induction: Tensor           # [L, H] mean weight from s[i] of the second copy to s[i + 1] of the first
    keys: qk.CompositionOver    # composition_over(the induction head, "key")
    finding: InductionCircuit
    n_texts: int

    @property
    def found(self) -> bool:
        return self.finding.found


def scores(model, texts: list[Tensor], approx=None) -> tuple[Tensor, Tensor]:
    """Every head's previous-token and induction scores [L, H], means over texts (each <bos> s <sep> s), on the
    maps of the model's own attention: under `approx` (a Lab run's lab_approx) the approximation's."""
    layers, heads = model.config.n_layers, model.config.n_heads
    previous, induction = torch.zeros(layers, heads), torch.zeros(layers, heads)
    with torch.inference_mode():
        for ids in texts:
            length = (len(ids) - 2) // 2
            probs = model(ids[None], capture_attention=True, return_logits=False, approx=approx).attentions
            for layer, p in enumerate(probs):
                previous[layer] += row_scores(p[0], ids, causal=True)["previous_token"].cpu()
                induction[layer] += induction_score(p[0], *second_copy_places(length)).cpu()
    return previous / len(texts), induction / len(texts)


def circuit(model, texts: list[Tensor] | None = None, approx=None) -> Circuit:
    """The circuit of a two-layer Lab decoder on `texts` (probe_texts by default, each <bos> s <sep> s). approx: a
    Lab run's approximation (lab_approx); its maps give the scores, while the key trace splits the exact score q·k
    (what the approximation estimates: composition_over reads the plain pass)."""
    if model.encoder is not None or model.config.n_layers != 2:
        raise ValueError("the induction circuit is read on a two-layer decoder-only Lab model")
    if model.config.differential_attention:
        raise ValueError("the key trace splits one softmax's score q·k; a differential-attention head weighs a "
                         "difference of two (Q₁K₁ᵀ and Q₂K₂ᵀ), so its circuit is not traced here (scores() still "
                         "reads its maps)")
    texts = probe_texts() if texts is None else texts
    previous, induction = scores(model, texts, approx)
    target, _ = induction_head(induction)
    keys = qk.composition_over(model, texts, target.layer, target.head, "key")
    return Circuit(previous, induction, keys, induction_circuit(previous, induction, keys), len(texts))
