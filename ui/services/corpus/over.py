"""Each analysis of core/corpus over a corpus the page names, as plain values: the corpus built (IOI pairs,
induction texts) or read from an upload and checked against the model, the analysis run in a worker thread
(ui.services.jobs.stream_job) and streamed with the summary of the items finished so far, so a page that stops
the job keeps what it had. The partial summary is the core's own `summarise` of the finished items' values, the
values the core hands out as each item finishes; the final one is the core's result itself.

Where the page's model work runs elsewhere (the Ray backend), a job is sent in chunks instead (chunked.py)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from core.analysis import heads as head_analysis
from core.analysis.over import analysis_named
from core.analysis.shortcuts import BOUNDS as SHORTCUT_BOUNDS, METHODS, SITES_COMPARED
from core.corpus import Pair
from core.corpus import saved
from core.corpus import texts as corpora
from core.corpus.stats import MIN_ITEMS, UNBOUNDED, Over, summarise  # MIN_ITEMS: the fewest items an interval needs, for the views
from ui.services.checks import UserError, check_choice, check_range, stack_shape
from ui.services.corpus.chunked import CHUNKS, chunks_on, stream_chunks  # noqa: F401 - chunks_on: tests import it here
from ui.services.corpus.pages import Saving, saved_words, saving_given, unsaved
from ui.services.corpus.updates import OverUpdate, partial_note, refusals_in_words
from ui.services.heads import INDUCTION_LENGTH as PROBE_LENGTH, next_token_reason
from ui.services.jobs import TimeCap, stream_job
from ui.services.patching import SITES

BUILT_IN = ("induction texts", "IOI pairs")
UPLOAD = "uploaded file"
CORPORA = (*BUILT_IN, UPLOAD)
MAX_TEXTS = 200          # texts one head-score job reads
MAX_PAIRS = 100          # pairs one attribution or patching job reads: each pair is a sweep
DEFAULT_N = 20
INDUCTION_LENGTH = PROBE_LENGTH  # tokens of each induction text before it repeats: the Heads tab's probe's
KINDS = tuple(head_analysis.SCORES)
METHOD_NAMES = {"atp": "AtP", "atp*": "AtP*", "ig": "EAP-IG", "flow": "flow graph"}
COMPARED_NAMES = {"z": "each head", "resid_pre": "residual stream"}
NOUNS = {"heads": "text", "attribution": "pair", "patch": "pair", "ablation": "text", "shortcuts": "pair"}


@dataclass
class Corpus:
    items: list              # 1-D id tensors (texts) or Pairs
    noun: str                # "text" or "pair"
    source: str              # in words: "20 induction texts (100 random tokens, repeated once, …)"


def check_corpus(corpus) -> str:
    return check_choice("Corpus", corpus, CORPORA)


def upload_path(upload) -> Path:
    """The uploaded file's path (gr.File gives a path; an API client a path or a dict with one)."""
    path = upload.get("path") if isinstance(upload, dict) else upload
    if not path:
        raise UserError("Corpus is 'uploaded file', but no file was uploaded: upload a .txt, .jsonl or .csv file, "
                        "or choose a built-in corpus.")
    return Path(str(path))


def check_model(model, analysis: str) -> None:
    """Encoder-decoders read two streams, the corpora one; attribution and patching need next-token prediction."""
    if model.config.is_encoder_decoder:
        raise UserError("The Across texts tab reads decoder-only and encoder models: this is an encoder-decoder, "
                        "whose decoder needs a target text of its own.")
    if analysis != "heads":
        what = {"attribution": "Logit attribution", "shortcuts": "The shortcuts' check against patching"}
        reason = next_token_reason(model, what.get(analysis, "Patching"),
                                   advice="Choose a decoder model (e.g. smollm2-135m-instruct).")
        if reason:
            raise UserError(reason)


def check_lengths(model, items: list, noun: str) -> None:
    """Every item within the model's positions, else the first few too long named by index."""
    limit = model.config.max_positions
    lengths = [len(item.clean if isinstance(item, Pair) else item) for item in items]
    over = [(i, n) for i, n in enumerate(lengths) if n > limit]
    if over:
        named = ", ".join(f"{noun} {i} ({n} tokens)" for i, n in over[:5]) + (" …" if len(over) > 5 else "")
        raise UserError(f"This model reads at most {limit} positions, and {named} are longer: shorten them.")


def induction_length(model) -> int:
    """The induction texts' half length: the probe's, or what fits twice after a BOS in a shorter context."""
    return max(1, min(INDUCTION_LENGTH, (model.config.max_positions - 1) // 2))


def corpus_texts(model, corpus, n, upload=None) -> Corpus:
    """The texts of a head-score job: induction texts, the IOI pairs' clean prompts, or an upload's first n."""
    corpus, n = check_corpus(corpus), check_range("Items (n)", n, 1, MAX_TEXTS)
    tokenizer = model.tokenizer
    with refusals_in_words():
        if corpus == "induction texts":
            length = induction_length(model)
            items = corpora.induction_texts(tokenizer, n, length, bos=model.config.bos_token_id)
            source = f"{n} induction texts ({length} random tokens, repeated once, as the Heads tab's probe)"
        elif corpus == "IOI pairs":
            items = [pair.clean for pair in corpora.ioi_pairs(tokenizer, n)]
            source = f"the clean prompts of {n} IOI pairs"
        else:
            path = upload_path(upload)
            strings = corpora.read_texts(path, tokenizer)
            items = corpora.encode_texts(tokenizer, strings[:n])
            source = f"the first {len(items)} of {len(strings)} texts of {path.name}"
    check_lengths(model, items, "text")
    return Corpus(items, "text", source)


def corpus_pairs(model, corpus, n, upload=None) -> Corpus:
    """The pairs of an attribution or patching job: IOI pairs, or an upload's first n (.jsonl or .csv)."""
    corpus, n = check_corpus(corpus), check_range("Items (n)", n, 1, MAX_PAIRS)
    if corpus == "induction texts":
        raise UserError("Induction texts are single texts, not prompt pairs: choose IOI pairs or upload pairs "
                        "(.jsonl or .csv with clean, corrupted, answer, foil).")
    with refusals_in_words():
        if corpus == "IOI pairs":
            items, source = corpora.ioi_pairs(model.tokenizer, n), f"{n} IOI pairs"
        else:
            path = upload_path(upload)
            pairs = corpora.read_pairs(path, model.tokenizer)
            items, source = pairs[:n], f"the first {min(n, len(pairs))} of {len(pairs)} pairs of {path.name}"
    check_lengths(model, items, "pair")
    return Corpus(items, "pair", source)


def check_site(model, site, layer) -> tuple[str, int | None]:
    """The core's site and layer for the API's site (resid_pre, attn_out, mlp_out, z, z_by_position)."""
    core_site, by_position = SITES[check_choice("What to patch", site, SITES)]
    if not by_position:
        return core_site, None
    return core_site, check_range("Layer", layer, 0, model.config.n_layers - 1)


# ---- the partial summaries: the core's summarise over the values of the items finished so far ----

def stacked(values: dict[int, object], pick: Callable, keep: Callable = lambda value: True) -> tuple[Tensor, list]:
    kept = [i for i in sorted(values) if keep(values[i])]
    return (torch.stack([pick(values[i]) for i in kept]) if kept else torch.empty(0)), kept


def partial_shortcuts(values: dict, total: int) -> dict[str, Over]:
    """The partial summary of shortcuts_over: one Over per measure, in the measure's range."""
    note = partial_note(len(values), total, "pair")
    if not values:
        return {}
    return {name: summarise(*stacked(values, lambda value, name=name: value[name])[:1], note, sorted(values),
                            bounds=SHORTCUT_BOUNDS[name])
            for name in next(iter(values.values()))}


def partial_heads(values: dict, total: int) -> dict[str, Over]:
    note = partial_note(len(values), total, "text")
    if not values:
        return {}
    result = {}
    for name in next(iter(values.values())):
        # the core leaves a text out of "induction" when it is not a span repeated once (all NaN)
        keep = (lambda value: not value["induction"].isnan().all()) if name == "induction" else (lambda value: True)
        per_item, kept = stacked(values, lambda value, name=name: value[name], keep)
        if kept:
            result[name] = summarise(per_item, note, kept, bounds=head_analysis.SCORE_BOUNDS[name])
    return result


def partial_attribution(values: dict, total: int) -> tuple[Over, Over] | None:
    if not values:
        return None
    note = partial_note(len(values), total, "pair")
    heads, kept = stacked(values, lambda value: value[0])
    mlps, _ = stacked(values, lambda value: value[1])
    return summarise(heads, note, kept, bounds=UNBOUNDED), summarise(mlps, note, kept, bounds=UNBOUNDED)


def partial_one(noun: str) -> Callable[[dict, int], Over | None]:
    """The partial summary of an analysis whose item's value is one unbounded tensor (patching's normalised
    scores, ablation's loss increases [L, H])."""
    def partial(values: dict, total: int) -> Over | None:
        if not values:
            return None
        per_item, kept = stacked(values, lambda value: value)
        return summarise(per_item, partial_note(len(values), total, noun), kept, bounds=UNBOUNDED)
    return partial


PARTIAL = {"heads": partial_heads, "attribution": partial_attribution, "patch": partial_one("pair"),
           "ablation": partial_one("text"), "shortcuts": partial_shortcuts}


SAVED_NAMES = {"heads": "head_scores", "attribution": "logit_attribution", "patch": "patch", "ablation": "ablation",
               "shortcuts": "shortcuts"}


def arguments_of(analysis: str, site: str | None, mode: str, layer: int | None, ablation: str) -> dict:
    """The analysis's own arguments of the core's *_over, as stream_over is given them."""
    if analysis == "patch":
        return dict(site=site, mode=mode, layer=layer)
    if analysis == "shortcuts":
        return dict(mode=mode)
    return dict(ablation=ablation) if analysis == "ablation" else {}


def stream_over(model, analysis: str, corpus: Corpus, site: str | None = None, mode: str = "denoise",
                layer: int | None = None, stop: Callable[[], bool] | None = None, root: Path | None = None,
                model_name: str = "", saving: Saving | None = None, ablation: str = "zero",
                max_seconds: float | None = None, clock: Callable[[], float] | None = None
                ) -> Iterator[OverUpdate]:
    """The analysis over the corpus: an update as items finish, with the summary of those finished so far, then
    the core's result (finished), its `saved` words saying what saving did. Closing the iterator stops the work;
    stop() is the core's own (a stopped job's result is the summary of the items it finished). root: save the
    job there (saved.run_over): a job already finished is reopened without measuring; saving (pages.saving_of's, for
    a page) instead gives the root with its caps and what to tell of each write. Past a cap a new job is measured
    and not saved. Run in a worker thread here, or in chunks on the runner of chunks_on where one is set.
    ablation ("zero" or "mean"): the ablation's kind; it sweeps the first over.ABLATION_TEXTS texts only (the
    updates count those), and the core's note says how many of how many. max_seconds: the job's time cap; past
    it the job stops as a stop() would (its finished items summarised and kept, a saved job resumable; asked
    between batches and between a batch's layers), and the finished update's `capped` says so, or that the job
    ended past the cap. clock: the cap's seconds (this module's time.monotonic unless given: a test's fake clock
    that ticks)."""
    saving = saving_given(root, saving)
    runner = CHUNKS.get()
    arguments = arguments_of(analysis, site, mode, layer, ablation)
    cap = TimeCap(max_seconds, stop, clock or time.monotonic)
    if runner is not None:
        updates = stream_chunks(runner, model, SAVED_NAMES[analysis], corpus.items, corpus.noun, arguments, cap,
                                saving, model_name)
    else:
        updates = stream_here(model, analysis, corpus, arguments, cap, saving, model_name)
    return told_of_cap(updates, cap)


def told_of_cap(updates: Iterator[OverUpdate], cap: TimeCap) -> Iterator[OverUpdate]:
    with closing(updates):
        for update in updates:
            yield replace(update, capped=cap.words()) if update.finished else update


def stream_here(model, analysis: str, corpus: Corpus, arguments: dict, stop: Callable[[], bool] | None,
                saving: Saving, model_name: str) -> Iterator[OverUpdate]:
    """stream_over in a worker thread of this process, saving item by item: a job stopped before resumes from
    its items."""
    values: dict[int, object] = {}

    def each(index: int, value) -> None:
        values[index] = value

    def work(report):
        hooks = dict(progress=report, stop=stop, each=each)
        with saving.held(), refusals_in_words():
            if saving.root is not None:
                try:
                    run = saved.run_over(analysis_named(SAVED_NAMES[analysis]), model, corpus.items, saving.root,
                                         model_name, max_bytes=saving.max_bytes, room=saving.room, wrote=saving.wrote,
                                         **hooks, **arguments)
                    return run.result, run, saving
                except saved.NoRoom as error:   # past a cap: measured all the same, and not saved
                    return measure(hooks), None, unsaved(error)
            return measure(hooks), None, saving

    def measure(hooks: dict):
        return analysis_named(SAVED_NAMES[analysis]).run(model, corpus.items, **arguments, **hooks)

    name = SAVED_NAMES[analysis]
    total = analysis_named(name).count(saved.arguments_of(analysis_named(name), arguments), len(corpus.items))
    for update in stream_job(work, total, f"corpus-{analysis}"):
        if update.finished:
            result, run, used = update.result
            folder = run.folder if run is not None and run.finished else None
            yield OverUpdate(update.done, update.total, result, update.seconds, True, saved_words(run, used), folder)
            continue
        finished = dict(values)   # the worker may have finished more items since this report: count those
        yield OverUpdate(max(update.done, len(finished)), total, PARTIAL[analysis](finished, total), update.seconds)


def exported(folder: Path | None) -> dict[str, bytes]:
    """A finished saved job's files (saved.export: per part, a CSV of its cells with mean, low, high and n, a CSV
    of every item's values, and the .npz of the whole result), by name."""
    if folder is None:
        raise UserError("This result has no saved job to export: run it to the end (a job past the saved jobs' "
                        "cap is not saved); each figure's camera button downloads it as an image.")
    if not (Path(folder) / saved.META).exists():
        raise UserError("This result's saved job is gone (on a shared server saved jobs are deleted a while after "
                        "their last write): run it again to export it; each figure's camera button downloads it "
                        "as an image.")
    with tempfile.TemporaryDirectory() as out, refusals_in_words():
        return {path.name: path.read_bytes() for path in saved.export(folder, out)}


@dataclass
class MapAxes:
    rows: int
    cols: int
    row_name: str        # "layer", "head"
    col_name: str        # "head", "position"
    row_labels: tuple[str, ...] | None = None    # a name for each row where an index is not one (the shortcuts')
    col_labels: tuple[str, ...] | None = None

    def cell_name(self, cell: tuple[int, int]) -> str:
        """"layer 3, head 5", or the cell's labels ("AtP, each head")."""
        r, c = cell
        row = self.row_labels[r] if self.row_labels else f"{self.row_name} {r}"
        col = self.col_labels[c] if self.col_labels else f"{self.col_name} {c}"
        return f"{row}, {col}"


def map_axes(model, analysis: str, corpus: Corpus, site: str | None = None) -> MapAxes:
    """The mean map's shape: [L, H] for head scores, attribution and the heads sweep; [L, T] for a position
    site; [H, T] for one layer's heads (T: the first pair's length; the core refuses pairs of other lengths)."""
    n_layers, n_heads = stack_shape(model)
    if analysis == "shortcuts":
        return MapAxes(len(METHODS), len(SITES_COMPARED), "method", "site", tuple(METHOD_NAMES[m] for m in METHODS),
                       tuple(COMPARED_NAMES[s] for s in SITES_COMPARED))
    if analysis != "patch" or site == "z":
        return MapAxes(n_layers, n_heads, "layer", "head")
    length = len(corpus.items[0].clean)
    if site == "z_by_position":
        return MapAxes(n_heads, length, "head", "position")
    return MapAxes(n_layers, length, "layer", "position")


def check_cell(axes: MapAxes, row, col) -> tuple[int, int]:
    """The cell whose items the strip shows, each index in the map's range, named by its field."""
    return (check_range(f"Cell {axes.row_name}", row, 0, axes.rows - 1),
            check_range(f"Cell {axes.col_name}", col, 0, axes.cols - 1))


def check_mode(mode) -> str:
    return check_choice("Direction", mode, ("denoise", "noise"))


def check_kind(kind) -> str:
    return check_choice("Score", kind, KINDS)
