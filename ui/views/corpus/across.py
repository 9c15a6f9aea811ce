"""The Across texts tab's views, the bodies of its endpoints: head scores, logit attribution and patching over a
corpus, each yielding (note, mean map, strip) as items finish (the summary of those finished so far), then the
core's summary. A page that stops the job keeps the last summary it was shown, whose note says of how many."""

from __future__ import annotations

import time
from contextlib import closing
from dataclasses import dataclass
from urllib.parse import urlsplit

from ui.services.corpus.over import MIN_ITEMS
from ui import links
from ui.plots.base import empty_figure
from ui.plots.corpus import examples_html, interval_words, item_strip, mean_map
from ui.plots.text import escaped
from ui.services import Services
from ui.services.checks import UserError, index_of
from ui.services.corpus.ablation import ABLATION_TEXTS, check_ablation_model, for_page
from ui.services.corpus.examples import PER_DECILE, check_examples, stream_examples
from ui.services.corpus.over import (Corpus, MapAxes, check_cell, check_kind, check_model, check_mode, check_site,
                                     corpus_pairs, corpus_texts, exported, map_axes, stream_over)
from ui.services.corpus.pages import saving_of
from ui.services.heads import check_ablation
from ui.services.sinks import EPSILON as SINK_EPSILON, sink_heads
from ui.views import export

PARTIAL_S = 1.0    # the least time between two partial summaries sent to the page
HEAD_WORDS = {
    "heads": "the Heads tab's attention-pattern score of each head, measured on each text alone",
    "attribution": "each head's direct part of logit(answer) − logit(foil) on each pair's clean prompt",
    "patch": "each pair's patching score, (patched − corrupted) / (clean − corrupted), the mean of the pairs' "
             "scores (not the score of the mean metric)",
    "ablation": "each text's mean loss with that head alone removed minus its loss with every head (the next-token "
                "cross-entropy; an encoder's, of each token read at its own position)",
}


@dataclass
class Shown:
    """What the page shows of a job, kept server-wide under the session's ticket, so a click on another cell
    redraws its strip without measuring again: the summary (partial while the job ran) and how to draw it."""
    over: object            # the Over [R, C] on the map
    axes: MapAxes
    noun: str               # "text" or "pair"
    title: str
    value_name: str
    signed: bool
    name: str               # the model's name, for the figures' file names
    view: str
    folder: object = None   # the saved job's folder once finished (what Export reads), else None


def nothing(message: str, name: str, view: str):
    return export.named(empty_figure(message), export.filename(name, view))


def figures(shown: Shown, cell: tuple[int, int]):
    """(mean map with the cell outlined, strip of the cell's items) of a kept result."""
    over, axes, noun = shown.over, shown.axes, shown.noun
    line = interval_words(over.n, noun, over.interval, MIN_ITEMS)
    fig = mean_map(over.mean.numpy(), over.low.numpy(), over.high.numpy(), over.n, axes.row_name, axes.col_name,
                   axes.col_labels, shown.title, line, signed=shown.signed, picked=cell, row_labels=axes.row_labels)
    r, c = cell
    strip = item_strip(over.per_item[:, r, c].numpy(), over.items, float(over.mean[r, c]), float(over.low[r, c]),
                       float(over.high[r, c]), f"{axes.cell_name(cell)}: each {noun}'s {shown.value_name}", line,
                       shown.value_name)
    return (export.named(fig, export.filename(shown.name, shown.view)),
            export.named(strip, export.filename(shown.name, f"{shown.view}-{axes.row_name}{r}-{axes.col_name}{c}")))


def cell_words(over, cell: tuple[int, int], axes: MapAxes) -> str:
    r, c = cell
    name = axes.cell_name(cell)
    if over.n == 0:   # every item left out (the core's note says why): no mean to state, not a NaN
        return f"{name[:1].upper() + name[1:]}: no mean, nothing was measured (n = 0)."
    low, high = float(over.low[r, c]), float(over.high[r, c])
    interval = (f"interval [{low:+.4f}, {high:+.4f}]" if low == low and high == high
                else f"no interval (n = {over.n}, too few)" if not over.interval else "no interval (a value is NaN)")
    return f"{name[:1].upper() + name[1:]}: mean **{float(over.mean[r, c]):+.4f}**, {interval}."


def running_words(update, noun: str) -> str:
    """"**Running: 3 of 20 pairs done (41 s).** " while a job runs, "" once it finished."""
    if update.finished:
        return ""
    return f"**Running: {update.done} of {update.total} {noun}s done ({update.seconds:.0f} s).** "


def note_of(over, corpus: Corpus, analysis: str, cell: tuple[int, int], axes: MapAxes, update, what: str) -> str:
    state = running_words(update, corpus.noun)
    core_note = f"  \nNote: {escaped(over.note)}." if over.note else ""
    return (f"{state}**{escaped(what)}** over {escaped(corpus.source)}: {HEAD_WORDS[analysis]}. The map shows the "
            f"mean over n = **{over.n}**; {interval_words(over.n, corpus.noun, over.interval, MIN_ITEMS)} (hover a cell for "
            f"its interval; click one for its items). {cell_words(over, cell, axes)}"
            f"{finished_words(update)}{core_note}")


def finished_words(update) -> str:
    """How the job ended (empty while it runs): done in so many seconds, or stopped at the time cap; then what
    saving did."""
    if not update.finished:
        return ""
    ended = update.capped or f"Done in {update.seconds:.1f} s."
    return f" {ended} {update.saved}"


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


def running(message: str, name: str, view: str):
    return message, nothing("Running…", name, view), nothing("Running…", name, view), None


def sink_share_words(over, noun: str) -> str:
    """Gu et al.'s Sink^ε over the corpus: the share of heads whose mean first-token weight passes ε, counted on the
    mean and on the interval's lower end (the heads sure to pass at 95 %), read from the Over the map draws."""
    total = over.mean.numel()
    above = int(sink_heads(over.mean).sum())
    sure = "" if not over.interval else (f"; {int(sink_heads(over.low).sum())} pass it with their whole 95 % "
                                  "interval")
    return (f"  \n**Sink heads** (Gu et al.'s Sink^ε, ε = {SINK_EPSILON:g}): {above} of {total} heads "
            f"({100 * above / max(total, 1):.1f} %) put more than ε of their attention on the first token, mean over "
            f"these {over.n} {noun}s{sure}.")


def heads_view(services: Services, model_name, corpus, n, upload, kind, cell_layer, cell_head, previous=None,
               page=None, progress=None):
    """(note, mean map, strip, kept result): one attention-pattern score of every head over the corpus; the body
    of the `corpus_heads` endpoint. page: the session whose saved jobs it reads and adds to."""
    name = model_name
    model = services.models.get(name, progress)
    check_model(model, "heads")
    kind = check_kind(kind)
    chosen = corpus_texts(model, corpus, n, upload)
    axes = map_axes(model, "heads", chosen)
    cell = check_cell(axes, cell_layer, cell_head)
    view, words = f"corpus-{kind}", kind.replace("_", "-")
    yield running(f"Scoring {escaped(chosen.source)}…", name, view)
    last = None

    def render(over, update):
        shown = Shown(over, axes, "text", f"{words} score, mean over the corpus", "score", False, name, view, update.folder)
        note = note_of(over, chosen, "heads", cell, axes, update, f"The {words} score")
        if kind == "first_token":
            note += sink_share_words(over, chosen.noun)
        return note, *figures(shown, cell), shown

    updates = stream_over(model, "heads", chosen, model_name=name, saving=saving_of(services, page),
                          max_seconds=services.settings.corpus_max_seconds)
    for last in streamed(updates, lambda result: (result or {}).get(kind), render, progress, "text"):
        yield last
    if last is None:
        why = (f"No text of this corpus could be scored for {kind}: it is measured on texts that repeat a span "
               "once (the induction texts), and only on decoders.")
        yield escaped(why), nothing("No text scored.", name, view), nothing("No text scored.", name, view), None


def attribution_view(services: Services, model_name, corpus, n, upload, cell_layer, cell_head, previous=None,
                     page=None, progress=None):
    """(note, mean map, strip, kept result): each head's direct logit attribution over the pairs; the body of
    the `corpus_attribution` endpoint. page: as heads_view's."""
    name = model_name
    model = services.models.get(name, progress)
    check_model(model, "attribution")
    chosen = corpus_pairs(model, corpus, n, upload)
    axes = map_axes(model, "attribution", chosen)
    cell = check_cell(axes, cell_layer, cell_head)
    view = "corpus-attribution"
    yield running(f"Attributing over {escaped(chosen.source)}…", name, view)

    def render(over, update):
        shown = Shown(over, axes, "pair", "Direct logit attribution of logit(answer) − logit(foil), mean over "
                         "the pairs", "direct part", True, name, view, update.folder)
        return (note_of(over, chosen, "attribution", cell, axes, update, "Direct logit attribution"),
                *figures(shown, cell), shown)

    yield from streamed(stream_over(model, "attribution", chosen, model_name=name,
                                    saving=saving_of(services, page),
                                    max_seconds=services.settings.corpus_max_seconds),
                        lambda result: result and result[0],
                        render, progress, "pair")


def patch_view(services: Services, model_name, corpus, n, upload, site, mode, layer_index, cell_row, cell_col,
               previous=None, page=None, progress=None):
    """(note, mean map, strip, kept result): a patching sweep of every pair, the mean of the pairs' normalised
    scores; the body of the `corpus_patch` endpoint. page: as heads_view's."""
    name = model_name
    model = services.models.get(name, progress)
    check_model(model, "patch")
    core_site, layer = check_site(model, site, layer_index)
    mode = check_mode(mode)
    chosen = corpus_pairs(model, corpus, n, upload)
    axes = map_axes(model, "patch", chosen, site)
    cell = check_cell(axes, cell_row, cell_col)
    view = f"corpus-patch-{site}-{mode}"
    yield running(f"Patching {escaped(chosen.source)}…", name, view)
    layer_words = f" of layer {layer}" if layer is not None else ""

    def render(over, update):
        shown = Shown(over, axes, "pair", f"{mode.capitalize()} {site}{layer_words}: mean patching score over "
                         "the pairs", "score", True, name, view, update.folder)
        return (note_of(over, chosen, "patch", cell, axes, update, f"Patching ({mode}, {site}{layer_words})"),
                *figures(shown, cell), shown)

    yield from streamed(stream_over(model, "patch", chosen, core_site, mode, layer, model_name=name,
                                    saving=saving_of(services, page),
                                    max_seconds=services.settings.corpus_max_seconds), lambda result: result, render,
                        progress, "pair")


def ablation_view(services: Services, model_name, corpus, n, upload, ablation, cell_layer, cell_head,
                  previous=None, page=None, progress=None):
    """(note, mean map, strip, kept result): the loss increase when each head alone is removed, over the first
    ABLATION_TEXTS texts of the corpus (the core's note says how many of how many); the body of the
    `corpus_ablation` endpoint. page: as heads_view's."""
    name = model_name
    model = services.models.get(name, progress)
    check_ablation_model(model)
    kind = check_ablation(ablation)
    chosen = corpus_texts(model, corpus, n, upload)
    axes = map_axes(model, "ablation", chosen)
    cell = check_cell(axes, cell_layer, cell_head)
    view = f"corpus-ablation-{kind}"
    swept = min(len(chosen.items), ABLATION_TEXTS)
    yield running(f"Ablating each head over the first {swept} texts of {escaped(chosen.source)}…", name, view)
    what = f"{kind.capitalize()} ablation of each head (at most the first {ABLATION_TEXTS} texts are swept)"

    def render(over, update):
        shown = Shown(over, axes, "text", f"{kind.capitalize()} ablation: mean loss increase over the texts",
                      "loss increase", True, name, view, update.folder)
        return note_of(over, chosen, "ablation", cell, axes, update, what), *figures(shown, cell), shown

    yield from streamed(stream_over(model, "ablation", chosen, model_name=name, saving=saving_of(services, page),
                                    ablation=kind, max_seconds=services.settings.corpus_max_seconds), for_page,
                        render, progress, "text")


# what each measure of the shortcuts job is, in the note's table: (column heading, digits)
SHORTCUT_MEASURES = {"rho": ("Spearman ρ", 2), "overlap": ("top-10 overlap", 2),
                     "false_negatives": ("strong cells missed", 1), "signed_error": ("signed error", 2),
                     "cost": ("cost (forward passes)", 1)}


def mean_interval(over, index: tuple[int, int], digits: int) -> str:
    """"0.97 [0.95, 0.99]" for one cell of an Over, "—" where it has no value (the flow graph on the residual
    stream), the mean alone where it has no interval (too few pairs)."""
    mean, low, high = (float(t[index]) for t in (over.mean, over.low, over.high))
    if mean != mean:
        return "—"
    if low != low or high != high:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def shortcuts_table(result: dict, axes: MapAxes) -> str:
    """Every method on each site: ρ, overlap, false negatives, signed error and cost, each mean [95 % interval]
    over the pairs; the exact sweep's own row gives its cost and its strong cells."""
    heading = "| where | method | " + " | ".join(name for name, _ in SHORTCUT_MEASURES.values()) + " |"
    lines = [heading, "|---|---|" + "---:|" * len(SHORTCUT_MEASURES)]
    exact = result["exact"]
    for c, site in enumerate(axes.col_labels):
        lines.append(f"| {site} | exact patching ({mean_interval(exact, (1, c), 1)} cells ≥ 0.1) | 1 | 1 | 0 | 0 | "
                     f"{mean_interval(exact, (0, c), 1)} |")
        for r, method in enumerate(axes.row_labels):
            if float(result["rho"].mean[r, c]) != float(result["rho"].mean[r, c]):
                continue          # no such method at this site
            cells = [mean_interval(result[key], (r, c), digits) for key, (_, digits) in SHORTCUT_MEASURES.items()]
            lines.append(f"| {site} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_intervals(result: dict) -> str:
    """Which interval each measure of the table has, read from its Over (core.corpus.stats chose it by the
    measure's range), or that the pairs are too few for any."""
    by_method: dict[str, list[str]] = {}
    for key, (name, _) in SHORTCUT_MEASURES.items():
        by_method.setdefault(result[key].interval, []).append(name)
    n = result["rho"].n
    if list(by_method) == [""]:
        return f"No intervals: n = {n} pairs are too few (an interval needs at least {MIN_ITEMS})."
    kinds = "; ".join(f"{method} for {', '.join(names)}" for method, names in by_method.items() if method)
    return f"Intervals over n = {n} pairs: {kinds} (a bootstrap interval stays in its measure's range)."


def shortcuts_view(services: Services, model_name, corpus, n, upload, mode, cell_row, cell_col, previous=None,
                   page=None, progress=None):
    """(note, ρ map, strip, kept result): exact patching against every shortcut (AtP, AtP*, EAP-IG, the flow
    graph) on each head and on the residual stream of every pair (core shortcuts_over), the map Spearman's ρ
    per method and site, the note every measure with its interval and each method's cost; the body of the
    `corpus_shortcuts` endpoint. page: as heads_view's. A cell outside the 4 × 2 map (another map's, kept by the
    page's cell fields) shows the first; a cell that is no index is refused in words."""
    name = model_name
    model = services.models.get(name, progress)
    check_model(model, "shortcuts")
    mode = check_mode(mode)
    chosen = corpus_pairs(model, corpus, n, upload)
    axes = map_axes(model, "shortcuts", chosen)
    try:
        cell = check_cell(axes, cell_row, cell_col)
    except UserError:
        if not all(index_of(value) is not None and index_of(value) >= 0 for value in (cell_row, cell_col)):
            raise              # not an index at all (NaN, inf, 2.5, -1): refused as every other map's cell is
        cell = (0, 0)          # the cell of another map (a layer, a head): this map's first
    view = f"corpus-shortcuts-{mode}"
    yield running(f"Comparing every shortcut with exact patching over {escaped(chosen.source)}…", name, view)

    def render(result, update):
        over = result["rho"]
        shown = Shown(over, axes, "pair", f"{mode.capitalize()}: each shortcut's Spearman ρ with exact patching, "
                      "mean over the pairs", "ρ", True, name, view, update.folder)
        state = running_words(update, "pair")
        core_note = f"  \nNote: {escaped(over.note)}." if over.note else ""
        note = (f"{state}**Every shortcut against exact patching** ({mode}) over {escaped(chosen.source)}: on each "
                f"pair, each method's map of every head (z) and of the residual stream (resid_pre) against the exact "
                f"sweep, over the cells whose activation differs between the two prompts. The map shows Spearman's "
                f"ρ, mean over n = **{over.n}**; {interval_words(over.n, 'pair', over.interval, MIN_ITEMS)}. {cell_words(over, cell, axes)}"
                f"\n\n{shortcuts_table(result, axes)}\n\n{table_intervals(result)} "
                f"{SHORTCUTS_KEY} **{SHORTCUTS_WARNING}**{finished_words(update)}{core_note}")
        return note, *figures(shown, cell), shown

    yield from streamed(stream_over(model, "shortcuts", chosen, mode=mode, model_name=name,
                                    saving=saving_of(services, page),
                                    max_seconds=services.settings.corpus_max_seconds),
                        lambda result: result if result and result.get("rho") is not None else None, render,
                        progress, "pair")


SHORTCUTS_KEY = ("Mean [95 % interval] over the pairs. Top-10 overlap: the share of the exact sweep's 10 strongest "
                 "cells (by size) among the method's 10; strong cells missed: cells whose exact effect is at least "
                 "0.1 of the clean − corrupted difference that the method ranks below 10 (where more than 10 reach "
                 "0.1, as the exact row counts, even a perfect ranking misses the rest); signed error: method − "
                 "exact on the 10 strongest cells, in the sweep's units (1: the clean answer back); cost: the "
                 "method's time over one forward pass of the same pair, timed in this run. The flow graph is a "
                 "proximity, not an effect: its ρ is against the exact effect's size, it has no signed error, and "
                 "no part for the residual stream.")
SHORTCUTS_WARNING = ("A method's map can look right and still rank the wrong heads: read the overlap and the cells "
                     "it misses beside ρ.")


def cell_view(services: Services, cell_row, cell_col, previous=None):
    """(cell note, mean map, strip, kept result): another cell of the result the session was last shown, drawn
    from the kept summary without measuring again."""
    if previous is None:
        raise UserError("Run an analysis first (or again: the server's memory budget dropped the last result); "
                        "then a click on a cell shows its items.")
    cell = check_cell(previous.axes, cell_row, cell_col)
    return cell_words(previous.over, cell, previous.axes), *figures(previous, cell), previous


def export_view(services: Services, previous=None):
    """(files, kept result): the last finished job's CSVs (cells with mean, low, high and n; every item's value)
    and its .npz, from the saved job."""
    if previous is None:
        raise UserError("Run an analysis first; then its finished result can be exported.")
    found = exported(previous.folder)
    # saved.export names the files after the model as the server names it (a folder's path, maybe): named here as
    # the figures are, the rest of each name (the part, "_items", the suffix) kept
    stem = next(name for name in found if name.endswith(".npz")).removesuffix(".npz")
    base = export.filename(previous.name, previous.view)
    try:
        files = [str(export.write(data, base + name[len(stem):])) for name, data in found.items()]
    except ValueError as error:   # an export over the size a download may have
        raise UserError(str(error)) from None
    return files, previous


RUN_BUTTONS = ("Score the heads", "Attribute over the pairs", "Patch every pair",
               "Check every shortcut", "Ablate each head")  # the tab's, in its order
EXAMPLES_BUTTON = "Find its top examples"
PLANE_BUTTON = "Draw its query/key plane"


def switched(model_name) -> tuple[str, str, str]:
    """(note, examples note, plane note) after a model change, the old model's results cleared: which button
    computes them for the new one."""
    named = escaped(str(model_name or "the new model"))
    runs = ", ".join(f"**{button}**" for button in RUN_BUTTONS[:-1]) + f" or **{RUN_BUTTONS[-1]}**"
    return (f"Now on {named}: press {runs} to compute this over the corpus for it.",
            f"Now on {named}: press **{EXAMPLES_BUTTON}** to find a head's top examples for it.",
            f"Now on {named}: press **{PLANE_BUTTON}** to draw a head's queries and keys for it.")


def mark_stopped(note: str) -> str:
    """The note after Stop: the figures keep the summary of the items finished before it."""
    return f"**Stopped.** The figures keep the summary of the items finished before the stop.  \n{note or ''}"



def examples_view(services: Services, model_name, corpus, n, upload, layer, head, k, progress=None):
    """(note, table): the places of the corpus where one head puts its most weight, and a sample from each decile
    of its weights, each opening its text in the Attention tab at that head; the body of `corpus_examples`."""
    name = model_name
    model = services.models.get(name, progress)
    check_model(model, "heads")
    layer, head, k = check_examples(model, layer, head, k)
    chosen = corpus_texts(model, corpus, n, upload)
    yield f"Reading {escaped(chosen.source)} through layer {layer}, head {head}…", ""
    with closing(stream_examples(model, chosen, layer, head, k, services.settings.corpus_max_seconds)) as updates:
        for update in updates:
            if progress is not None:
                progress(update.done / max(update.total, 1), f"{update.done} of {update.total} texts")
            if update.finished:
                top, deciles, found = update.result
    line = (f"Layer {layer}, head {head} over {chosen.source}: the {len(top)} places of largest weight of "
            f"{found.places:,}, then {PER_DECILE} sampled from each decile (10: the largest weights)")
    core_note = f"  \nNote: {escaped(found.note)}." if found.note else ""
    skipped = f" Left out: {', '.join(found.skip)} (key 0, the query's own token)." if found.skip else ""
    note = (f"**Top examples**: where layer {layer}, head {head} puts its most weight over {escaped(chosen.source)} "
            f"({found.n} texts, {found.places:,} query–key places).{skipped} A link opens the text in the Attention "
            "tab at this head, at the positions listed; a text whose words do not read back as its tokens (random "
            f"tokens, as in the induction texts) has none.{core_note}")
    rows = [place_row(name, layer, head, place) for place in [*top, *deciles]]
    yield note, examples_html(rows, line)


TOO_LONG = "no link: too long for a link"


def place_row(model_name: str, layer: int, head: int, place) -> dict:
    """A place as examples_html's row: its link's query string ("?model=…&tab=attention&layer=…&head=…&text=…"),
    or "" and the words for why it has none."""
    row = {key: value for key, value in vars(place).items() if key != "link_text"}
    row["link"] = ""
    if place.link_text is not None:
        link, left_out = links.make("/", model_name, "attention", layer, head, place.link_text)
        row["link"], row["why"] = ("", TOO_LONG) if left_out else (f"?{urlsplit(link).query}", "")
    return row
