"""The Across texts tab's views, the bodies of its endpoints: head scores, logit attribution and patching over a
corpus, each yielding (note, mean map, strip) as items finish (the summary of those finished so far), then the
core's summary. A page that stops the job keeps the last summary it was shown, whose note says of how many."""

from __future__ import annotations

import time
from contextlib import closing

from ui.plots.base import empty_figure
from ui.plots.corpus import interval_words, item_strip, mean_map
from ui.plots.text import escaped
from ui.services import Services
from ui.services.corpus.over import (Corpus, MapAxes, check_cell, check_kind, check_model, check_mode, check_site,
                                     corpus_pairs, corpus_texts, map_axes, stream_over)
from ui.views import export

PARTIAL_S = 1.0    # the least time between two partial summaries sent to the page
HEAD_WORDS = {
    "heads": "the Heads tab's attention-pattern score of each head, measured on each text alone",
    "attribution": "each head's direct part of logit(answer) − logit(foil) on each pair's clean prompt",
    "patch": "each pair's patching score, (patched − corrupted) / (clean − corrupted), the mean of the pairs' "
             "scores (not the score of the mean metric)",
}


def nothing(message: str, name: str, view: str):
    return export.named(empty_figure(message), export.filename(name, view))


def figures(over, axes: MapAxes, cell: tuple[int, int], noun: str, title: str, value_name: str, signed: bool,
            name: str, view: str):
    """(mean map, strip of the cell's items) of one Over [R, C]."""
    line = interval_words(over.n, noun)
    col_labels = None
    fig = mean_map(over.mean.numpy(), over.low.numpy(), over.high.numpy(), over.n, axes.row_name, axes.col_name,
                   col_labels, title, line, signed=signed, picked=cell)
    r, c = cell
    strip = item_strip(over.per_item[:, r, c].numpy(), over.items, float(over.mean[r, c]), float(over.low[r, c]),
                       float(over.high[r, c]),
                       f"{axes.row_name} {r}, {axes.col_name} {c}: each {noun}'s {value_name}", line, value_name)
    return (export.named(fig, export.filename(name, view)),
            export.named(strip, export.filename(name, f"{view}-{axes.row_name}{r}-{axes.col_name}{c}")))


def note_of(over, corpus: Corpus, analysis: str, cell: tuple[int, int], axes: MapAxes, update, what: str) -> str:
    r, c = cell
    state = ("" if update.finished else
             f"**Running: {update.done} of {update.total} {corpus.noun}s done ({update.seconds:.0f} s).** ")
    core_note = f"  \nNote: {escaped(over.note)}." if over.note else ""
    low, high = float(over.low[r, c]), float(over.high[r, c])
    interval = f"interval [{low:+.4f}, {high:+.4f}]" if over.n >= 2 else "no interval (n < 2)"
    return (f"{state}**{escaped(what)}** over {escaped(corpus.source)}: {HEAD_WORDS[analysis]}. The map shows the "
            f"mean over n = **{over.n}**; {interval_words(over.n, corpus.noun)} (hover a cell for "
            f"its interval). {axes.row_name.capitalize()} {r}, {axes.col_name} {c}: mean "
            f"**{float(over.mean[r, c]):+.4f}**, {interval}."
            f"{'' if not update.finished else f' Done in {update.seconds:.1f} s.'}{core_note}")


def streamed(updates, pick, render, progress, noun: str):
    """Yields render(over, update) for the updates as they come (partials at most every PARTIAL_S), the
    finished one always; pick(result) is the Over shown, or None while there is none yet."""
    last = 0.0
    with closing(updates):
        for update in updates:
            if progress is not None:
                progress(update.done / max(update.total, 1), f"{update.done} of {update.total} {noun}s")
            now = time.monotonic()
            if not update.finished and (update.result is None or now - last < PARTIAL_S):
                continue
            over = pick(update.result)
            if over is None:
                continue
            last = now
            yield render(over, update)


def heads_view(services: Services, model_name, corpus, n, upload, kind, cell_layer, cell_head, progress=None):
    """(note, mean map, strip): one attention-pattern score of every head over the corpus; the body of the
    `corpus_heads` endpoint."""
    name = model_name
    model = services.models.get(name, progress)
    check_model(model, "heads")
    kind = check_kind(kind)
    chosen = corpus_texts(model, corpus, n, upload)
    axes = map_axes(model, "heads", chosen)
    cell = check_cell(axes, cell_layer, cell_head)
    view = f"corpus-{kind}"
    yield (f"Scoring {escaped(chosen.source)}…", nothing("Running…", name, view), nothing("Running…", name, view))
    last = None

    def render(over, update):
        title = f"{kind.replace('_', '-')} score, mean over the corpus"
        return (note_of(over, chosen, "heads", cell, axes, update, f"The {kind.replace('_', '-')} score"),
                *figures(over, axes, cell, "text", title, "score", False, name, view))

    for last in streamed(stream_over(model, "heads", chosen), lambda result: (result or {}).get(kind), render,
                         progress, "text"):
        yield last
    if last is None:
        why = (f"No text of this corpus could be scored for {kind}: it is measured on texts that repeat a span "
               "once (the induction texts), and only on decoders.")
        yield escaped(why), nothing("No text scored.", name, view), nothing("No text scored.", name, view)


def attribution_view(services: Services, model_name, corpus, n, upload, cell_layer, cell_head, progress=None):
    """(note, mean map, strip): each head's direct logit attribution over the pairs; the body of the
    `corpus_attribution` endpoint."""
    name = model_name
    model = services.models.get(name, progress)
    check_model(model, "attribution")
    chosen = corpus_pairs(model, corpus, n, upload)
    axes = map_axes(model, "attribution", chosen)
    cell = check_cell(axes, cell_layer, cell_head)
    view = "corpus-attribution"
    yield (f"Attributing over {escaped(chosen.source)}…", nothing("Running…", name, view),
           nothing("Running…", name, view))

    def render(over, update):
        title = "Direct logit attribution of logit(answer) − logit(foil), mean over the pairs"
        return (note_of(over, chosen, "attribution", cell, axes, update, "Direct logit attribution"),
                *figures(over, axes, cell, "pair", title, "direct part", True, name, view))

    yield from streamed(stream_over(model, "attribution", chosen), lambda result: result and result[0], render,
                        progress, "pair")


def patch_view(services: Services, model_name, corpus, n, upload, site, mode, layer_index, cell_row, cell_col,
               progress=None):
    """(note, mean map, strip): a patching sweep of every pair, the mean of the pairs' normalised scores; the
    body of the `corpus_patch` endpoint."""
    name = model_name
    model = services.models.get(name, progress)
    check_model(model, "patch")
    core_site, layer = check_site(model, site, layer_index)
    mode = check_mode(mode)
    chosen = corpus_pairs(model, corpus, n, upload)
    axes = map_axes(model, "patch", chosen, site)
    cell = check_cell(axes, cell_row, cell_col)
    view = f"corpus-patch-{site}-{mode}"
    yield (f"Patching {escaped(chosen.source)}…", nothing("Running…", name, view), nothing("Running…", name, view))
    layer_words = f" of layer {layer}" if layer is not None else ""

    def render(over, update):
        title = f"{mode.capitalize()} {site}{layer_words}: mean patching score over the pairs"
        what = f"Patching ({mode}, {site}{layer_words})"
        return (note_of(over, chosen, "patch", cell, axes, update, what),
                *figures(over, axes, cell, "pair", title, "score", True, name, view))

    yield from streamed(stream_over(model, "patch", chosen, core_site, mode, layer), lambda result: result, render,
                        progress, "pair")


def mark_stopped(note: str) -> str:
    """The note after Stop: the figures keep the summary of the items finished before it."""
    return f"**Stopped.** The figures keep the summary of the items finished before the stop.  \n{note or ''}"

