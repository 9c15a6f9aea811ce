"""What is built on the forward pass and its records: attention capture for long texts (capture), what each head
does and whether it matters (heads), what carries one answer (patching), every stage inside one pass and one
attention score split into the residual stream's parts (anatomy), the views the app's pages read (inspect), and what
an approximation of attention costs (approx).

The package itself holds the typed keys of upstream parts: what wrote into the residual stream that a head reads,
keyed by (kind, layer, head). "L3 H5" is only how a part is shown; code that asks which part is a head compares keys,
never label text."""
from __future__ import annotations

from typing import NamedTuple

HEAD, ATTN_BIAS, ATTN, MLP = "head", "attn bias", "attn", "MLP"
LAYER_KINDS = (HEAD, ATTN_BIAS, ATTN, MLP)          # parts written by a layer
WHOLE_KINDS = ("embeddings", "positions", "token types", "bias")   # parts of no layer ("bias": the frozen norms')


class Part(NamedTuple):
    """One upstream part: kind is one of LAYER_KINDS (with its layer; a head also with its index) or WHOLE_KINDS."""
    kind: str
    layer: int | None = None
    head: int | None = None

    def __str__(self) -> str:
        if self.kind == HEAD:
            return f"L{self.layer} H{self.head}"
        return self.kind if self.layer is None else f"L{self.layer} {self.kind}"

    @property
    def is_head(self) -> bool:
        return self.kind == HEAD


def head(layer: int, index: int) -> Part:
    return Part(HEAD, layer, index)


def upstream_parts(labels: list[str], layer: int, n_heads: int) -> list[Part]:
    """The typed key of each label of what layer `layer` reads (core.analysis.qk's parts: the embeddings, every
    earlier layer's heads, attention bias and MLP, or its whole attention, and the norms' bias), in the labels'
    order. Each label is looked up among the parts such a layer can read, so a label of another form is refused
    rather than guessed."""
    known = {str(Part(kind)): Part(kind) for kind in WHOLE_KINDS}
    for l in range(layer):
        known.update({str(p): p for p in [head(l, h) for h in range(n_heads)]
                      + [Part(kind, l) for kind in (ATTN_BIAS, ATTN, MLP)]})
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise ValueError(f"parts {unknown[:5]} are not parts that layer {layer} reads (expected labels such as "
                         f"'embeddings', 'L0 H1', 'L0 MLP', 'L0 attn bias' or 'bias' of earlier layers)")
    return [known[label] for label in labels]
