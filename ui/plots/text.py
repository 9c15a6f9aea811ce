"""Text as HTML: shaded by numbers, or quoted in a note; every character of it escaped, so a token (or anything a
user typed) can never become markup."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

from ui.plots.base import CHOSEN_COLOR


def escaped(text: str) -> str:
    """Text to quote in Markdown or in a message the page renders as HTML: <, > and & escaped, so it reads as
    written and never becomes an element (quotes are left as they are: nothing here goes inside an attribute)."""
    return html.escape(str(text), quote=False)


def surprisal_html(
    pieces: Sequence[str],
    losses: np.ndarray,
    alternatives: Sequence[Sequence[tuple[str, float]]],
    full_scale: float = 10.0,
) -> str:
    """The text as spans shaded by each token's loss (nats; the shade is full from `full_scale` up), with a
    tooltip of the loss and the model's top alternatives there. pieces [T] are the tokens' own text (spaces and
    newlines kept); losses and alternatives [T - 1] (the first token is never predicted). Every string is escaped."""
    losses = np.asarray(losses, dtype=np.float64)
    if len(pieces) != len(losses) + 1 or len(alternatives) != len(losses):
        raise ValueError(f"surprisal_html: {len(pieces)} tokens need {len(pieces) - 1} losses and alternatives, "
                         f"got {len(losses)} and {len(alternatives)}")
    spans = [f'<span class="tok" title="the first token is not predicted">{html.escape(pieces[0])}</span>']
    for piece, loss, alts in zip(pieces[1:], losses, alternatives):
        listed = "\n".join(f"{p:.3f}  {tok}" for tok, p in alts)
        tip = f"{loss:.2f} nats\ntop {len(alts)} here:\n{listed}"
        alpha = min(1.0, max(0.0, loss / full_scale)) * 0.85
        spans.append(
            f'<span class="tok" data-loss="{loss:.4f}" title="{html.escape(tip, quote=True)}" '
            f'style="background: rgba(220, 60, 40, {alpha:.3f})">{html.escape(piece)}</span>'
        )
    legend = (f'<div class="surprisal-legend">shade: 0 nats (white) to ≥ {full_scale:g} nats (dark); '
              "hover a token for its loss and the model's top alternatives</div>")
    return legend + '<div class="surprisal">' + "".join(spans) + "</div>"
def shaded_spans(pieces: Sequence[str], weights: np.ndarray, current: int | None, css_class: str) -> str:
    """Spans of text shaded by weight (scaled to the largest); pieces past len(weights) are not attended to
    (greyed), `current` (an index into pieces) is outlined. Every string is escaped."""
    weights = np.asarray(weights, dtype=np.float64)
    if len(weights) > len(pieces):
        raise ValueError(f"shaded_spans: {len(weights)} weights for {len(pieces)} tokens")
    peak = float(weights.max(initial=0.0)) or 1.0
    spans = []
    for i, piece in enumerate(pieces):
        text = html.escape(piece)
        if i == current:
            spans.append(f'<span class="tok current" data-pos="{i}" title="the picked token" '
                         f'style="outline: 2px solid {CHOSEN_COLOR}">{text}</span>')
        elif i < len(weights):
            w = weights[i]
            spans.append(f'<span class="tok" data-pos="{i}" data-weight="{w:.5f}" title="{w:.4f}" '
                         f'style="background: rgba(31, 119, 180, {0.85 * w / peak:.3f})">{text}</span>')
        else:
            spans.append(f'<span class="tok later" data-pos="{i}" style="color: #aaa">{text}</span>')
    return f'<div class="{css_class}" style="white-space: pre-wrap; line-height: 1.7">' + "".join(spans) + "</div>"


def shaded_text_html(pieces: Sequence[str], weights: np.ndarray, current: int, caption: str,
                     source_pieces: Sequence[str] | None = None, source_weights: np.ndarray | None = None) -> str:
    """The text shaded by one generated token's attention: the context it saw (prompt included), the token
    itself outlined, what came after it grey; with a source, the source shaded by the cross-attention."""
    parts = [f'<div class="gen-shade-caption">{html.escape(caption)}</div>']
    if source_pieces is not None and source_weights is not None:
        parts.append("<b>source</b>" + shaded_spans(source_pieces, source_weights, None, "gen-shade-source"))
        parts.append("<b>target</b>")
    parts.append(shaded_spans(pieces, weights, current, "gen-shade"))
    return "".join(parts)
