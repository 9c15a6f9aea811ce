"""The Heads tab's "what feeds this head" section: one head's keys or queries traced over the induction texts to
the earlier components that wrote them (ui.services.corpus.composition), beside what its weights allow; the body
of the `composition_over` endpoint."""

from __future__ import annotations

import numpy as np

from ui.services.corpus.over import MIN_ITEMS
from ui.plots.corpus import interval_words
from ui.plots.heads import composition_figure, plural
from ui.plots.text import escaped
from ui.services import Services
from ui.services.corpus.composition import composition, opening_head
from ui.views import export

DEFINITION = ("The score of a query i and key j splits exactly into pairs (a part that wrote the query, a part that "
              "wrote the key), every norm frozen at its value on this text (the Inside tab's split by heads). "
              "Softmax reads only differences, so the relative score, score(i, j) − Σ_k a_ik·score(i, k), is split: "
              "it says why key j wins over the query's mean key. On each text the head's most attended pairs are "
              "taken and weighted by their attention; a component's share is its part of the {side} side over the "
              "relative score, so a text's shares add up to 1 (a negative share works against the winner).")
WEIGHTS = ("Below, what the weights alone allow: Elhage et al. (2021)'s {letter}-composition of this head with each "
           "earlier head, ‖W_QK·W_OV'‖_F / (‖W_QK‖_F·‖W_OV'‖_F) on the {side} side, from the weights with each "
           "layer's norm gain folded in and no text. A head can be allowed to compose and not do it on these "
           "texts, or the other way round: compare the map with the bars.")


def composition_view(services: Services, model_name, layer_index, head_index, side, n, progress=None):
    """(note, figure): what feeds one head's keys or queries over n induction texts, beside its weights-only
    composition scores."""
    model = services.models.get(model_name, progress)
    found = composition(model, layer_index, head_index, side, n)
    name = f"L{found.layer} H{found.head}"
    named = [label for label in found.labels if label != "rest"]
    typed = dict(zip(found.traced.labels, found.traced.parts))
    heads = [label for label in named if typed[label].is_head]
    strongest = heads[0] if heads else None
    top = found.labels[0]
    lines = [f"**What feeds {name}'s {plural(found.side)}** over {escaped(found.source)}: {escaped(found.pairs)}. "
             f"The bars show each part's mean share, {interval_words(found.n, 'text', found.interval, MIN_ITEMS)}; the largest is "
             f"**{escaped(top)}** ({found.mean[0]:+.2f})"
             + (f", the largest single earlier head **{escaped(strongest)}** "
                f"({found.mean[found.labels.index(strongest)]:+.2f})." if strongest and strongest != top else ".")]
    lines.append(DEFINITION.format(side=found.side))
    if found.weights.size:
        flat = int(np.argmax(found.weights))
        allowed = f"L{flat // found.weights.shape[1]} H{flat % found.weights.shape[1]}"
        lines.append(WEIGHTS.format(letter=found.side[0].upper(), side=found.side)
                     + f" The weights' strongest is **{allowed}** ({found.weights.max():.3f}).")
    else:
        lines.append("Layer 0 has no earlier head: only the embeddings (and positions) feed it.")
    if found.note:
        lines.append(f"Note: {escaped(found.note)}.")
    figure = composition_figure(found.labels, found.mean, found.low, found.high, found.weights, found.side,
                                f"What feeds {name}'s {plural(found.side)}, over {found.n} induction texts")
    return "\n\n".join(lines), export.named(figure, export.filename(model_name, f"composition-{name}-{found.side}"))


def composition_opening(services: Services, model_name, progress=None):
    """(layer, head) the section opens on for this model: its strongest induction head (opening_head)."""
    return opening_head(services.models.get(model_name, progress))
