"""The Across texts tab's query/key plane of one head (AttentionViz): the body of the `corpus_qk` endpoint, the
figure with a line saying exactly what it plots, and the note."""

from __future__ import annotations

from contextlib import closing

from ui.plots.base import empty_figure
from ui.plots.corpus import qk_plane
from ui.plots.text import escaped
from ui.services import Services
from ui.services.corpus.over import corpus_texts
from ui.services.corpus.qk import PLANE_DEFINITION, PLANE_POINTS, PlaneShown, check_plane, stream_plane
from ui.views import export


def after_words(shown: PlaneShown) -> str:
    """Where in the head the vectors are read: after the rotary embedding and the QK-norm where the model has them."""
    parts = [part for part, has in (("QK-norm", shown.qk_norm), ("RoPE", shown.rope)) if has]
    if not parts:
        return "q and k as projected (this model has neither RoPE nor QK-norm)"
    return f"q and k after {' and '.join(parts)}, as the scores use them"


def plane_line(shown: PlaneShown) -> tuple[str, str]:
    """The line under the figure, in two parts: n texts and the tokens kept of those read; the plane's definition
    (the Inside tab's too) and where the vectors are read."""
    plane = shown.plane
    kept = len(plane.queries)
    texts = f"{plane.n} text{'s' if plane.n != 1 else ''}"
    return (f"{texts}: {kept:,} of {plane.tokens:,} tokens, each a query and a key",
            f"{PLANE_DEFINITION}; {after_words(shown)}")


def qk_view(services: Services, model_name, corpus, n, upload, layer, head, progress=None):
    """(note, figure): the queries and keys of one head over the corpus in the plane of their first two principal
    components; the body of `corpus_qk`."""
    name = model_name
    model = services.models.get(name, progress)
    layer, head = check_plane(model, layer, head)
    chosen = corpus_texts(model, corpus, n, upload)
    view = f"corpus-qk-L{layer}H{head}"
    yield (f"Reading {escaped(chosen.source)} through layer {layer}, head {head}…",
           export.named(empty_figure("Running…"), export.filename(name, view)))
    shown = None
    with closing(stream_plane(model, chosen, layer, head, services.settings.corpus_max_seconds)) as updates:
        for update in updates:
            if progress is not None:
                progress(update.done / max(update.total, 1), f"{update.done} of {update.total} texts")
            if update.finished:
                shown = update.result
    plane = shown.plane
    first, second = plane_line(shown)
    fig = qk_plane(plane.points.numpy(), plane.is_key.numpy(), plane.text.numpy(), plane.position.numpy(),
                   shown.labels, plane.explained.tolist(), f"Layer {layer}, head {head}: queries and keys",
                   f"{escaped(first)}<br>{escaped(second)}")
    core_note = f"  \nNote: {escaped(plane.note)}." if plane.note else ""
    note = (f"**Query/key plane** of layer {layer}, head {head} over {escaped(chosen.source)}: {escaped(first)}; {escaped(second)}. "
            f"The score of a query and a key is q·k × {plane.scale:.3g} before the softmax; the plane keeps the two "
            f"directions of most variance ({explained_words(plane.explained.tolist())}), so a query near a key in it "
            f"is a guide to a high score, not a measure of one. Hover a point for its token, text and position; at "
            f"most {PLANE_POINTS:,} points are drawn, the tokens kept spread evenly through the corpus.{core_note}")
    yield note, export.named(fig, export.filename(name, view))


def explained_words(explained: list[float]) -> str:
    shares = [f"{share * 100:.0f} %" for share in explained if share == share]   # NaN: no points
    return " and ".join(shares) + " of it" if shares else "none: no points"
