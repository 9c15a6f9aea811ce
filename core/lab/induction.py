"""The induction circuit, found in a model trained to need it: ground truth for "what feeds a head".

A Lab decoder trained on copy-62 (<bos> s <sep> s <eos>, s random letters and digits, the loss on the second copy)
can only predict the second copy by looking back: at s[i] in the second copy, find s[i] in the first and read the
character after it. Olsson et al. (2022) show how a two-layer attention-only model does this: a layer-0
previous-token head writes each position's previous character into it, and a layer-1 induction head's keys read
that, so the query s[i] matches the key whose previous character is s[i]. `circuit` measures both heads on fresh
random texts and asks core.analysis.qk.composition_over where the induction head's keys come from: on a model that
learned the circuit, the previous-token head is the first.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

from . import qk
from .heads import induction_score, row_scores
from ..lab.train import BOS, SEP, SYMBOLS, encode, letters

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
    """Layer 0's previous-token scores and layer 1's induction scores [H] (means over the texts), the strongest
    head of each, and what feeds the induction head's keys over the same texts."""
    previous_token: Tensor      # [H] mean weight on the key just before the query
    induction: Tensor           # [H] mean weight from s[i] of the second copy to s[i + 1] of the first
    previous_head: int
    induction_head: int
    keys: qk.CompositionOver    # composition_over(layer 1, induction_head, "key")
    n_texts: int

    @property
    def first_source(self) -> str:
        """The earlier single head with the largest mean share of the induction head's keys ("L0 H2", say)."""
        heads = [i for i, label in enumerate(self.keys.labels) if " H" in label]
        return self.keys.labels[max(heads, key=lambda i: self.keys.shares.mean[i].item())]

    @property
    def found(self) -> bool:
        """Whether the induction head's keys come first from the previous-token head."""
        return self.first_source == f"L0 H{self.previous_head}"


def circuit(model, texts: list[Tensor] | None = None) -> Circuit:
    """The circuit of a two-layer Lab decoder on `texts` (probe_texts by default, each <bos> s <sep> s)."""
    if model.encoder is not None or model.config.n_layers != 2:
        raise ValueError("the induction circuit is read on a two-layer decoder-only Lab model")
    texts = probe_texts() if texts is None else texts
    heads = model.config.n_heads
    previous, induction = torch.zeros(heads), torch.zeros(heads)
    with torch.inference_mode():
        for ids in texts:
            length = (len(ids) - 2) // 2
            probs = model(ids[None], capture_attention=True, return_logits=False).attentions   # [1, H, T, T] each
            previous += row_scores(probs[0][0], ids, causal=True)["previous_token"].cpu()
            induction += induction_score(probs[1][0], *second_copy_places(length)).cpu()
    previous, induction = previous / len(texts), induction / len(texts)
    head = int(induction.argmax())
    return Circuit(previous, induction, int(previous.argmax()), head, qk.composition_over(model, texts, 1, head, "key"),
                   len(texts))
