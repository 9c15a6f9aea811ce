"""A corpus job split into chunks of items, each chunk run as a job of its own (the same *_over of core/analysis
on a sub-list, wherever it runs: a Ray Serve replica, a thread here), and the finished chunks merged into what one
run over the whole corpus gives: each part's per_item concatenated in input order and summarised once
(jobs.Job.over, which calls summarise), its note naming items by their index in the whole corpus.

    heads = ANALYSES["head_scores"]                   # core/analysis/over.py names the analyses
    empty = check(heads, model, texts)                # the whole corpus refused or accepted as one run would be
    begun = saved.begin(heads, texts, root, name, {})      # items finished before: begun.done
    ranges = remaining(len(texts), begun.done, CHUNK_ITEMS)
    finished = list(as_finished(submit, ranges, in_flight, "text"))   # submit(items) → Future of run_chunk's
    # each chunk's chunk.kept() written with saved.write_item as it finishes, so a stopped job resumes from them
    before = [from_saved(heads, model, texts, begun.done)] if begun.done else []
    result = merge(empty, before + finished, "text", len(texts), stopped=len(finished) < len(ranges))

An analysis that measures only some items (ablation: its first `limit` texts) is split after its cap:
measured, cap = capped(ANALYSES["ablation"], texts, {}); the chunks are of `measured`, and merge(..., cap=cap)
adds the note one run gives of the rest.

No measurement is implemented here: a chunk is the analysis's *_over on fewer items, and the merge only moves
its rows."""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

from . import jobs, saved
from .jobs import Analysis
from .stats import Over

log = logging.getLogger(__name__)

CHUNK_ITEMS = 8            # items one chunk measures: a patching chunk of 8 pairs is 8 sweeps
STOP_POLL_S = 0.25         # how often a wait for chunks asks stop()
ITEMS_AT_MOST = {"ablation": 1, "shortcuts": 1}   # an ablation text runs the model once per head, a shortcuts
                                  # pair two exact sweeps and seven estimates: each its own call, so 8 items keep 8
                                  # replicas busy


@dataclass(frozen=True)
class Measured:
    """What one chunk's run gives back: the analysis's result over the chunk's items alone, and each finished
    item's own value as the analysis hands it to `each` (what saved.write_item keeps), by its index in the chunk."""
    result: object           # dict[str, Over] | tuple[Over, Over] | Over
    values: dict[int, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Chunk:
    items: Sequence[int]     # the chunk's items: their indices in the whole corpus, in order
    result: object           # the analysis's result over those items alone (dict[str, Over] | tuple[Over, Over] | Over)
    values: dict[int, object] = field(default_factory=dict)     # Measured.values: index in the chunk → value

    def kept(self) -> dict[int, object]:
        """index in the whole corpus → value, of every item the chunk measured (a skipped pair has none)."""
        return {self.items[i]: value for i, value in self.values.items()}


def capped(analysis: Analysis, items: Sequence, arguments: dict) -> tuple[list, str]:
    """(the items a job measures, the note one run gives of the others): ablation sweeps only the first `limit`
    texts (over.ABLATION_TEXTS of core/analysis unless told) and its note says so; the other analyses measure every item, with
    no note. The cap is applied before splitting, so a chunk never reaches it and merge adds the note once."""
    arguments = saved.arguments_of(analysis, arguments)
    count = analysis.count(arguments, len(items))
    if count == len(items):
        return list(items), ""
    return list(items[:count]), jobs.ablation_cap_note(count, len(items), arguments["limit"])


def chunk_items(analysis: Analysis, size: int) -> int:
    """Items one chunk of `analysis` measures, given `size` for the others (ITEMS_AT_MOST caps the sweeps)."""
    return min(size, ITEMS_AT_MOST.get(analysis.name, size))


def split(n: int, size: int = CHUNK_ITEMS) -> list[range]:
    """Consecutive ranges of at most `size` indices that cover 0..n−1 in order."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"a chunk holds at least one item: size must be a whole number ≥ 1, got {size!r}")
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def remaining(total: int, done, size: int = CHUNK_ITEMS) -> list[tuple[int, ...]]:
    """The items of 0..total−1 not in `done` (those finished before), in order, as chunks of at most `size`."""
    todo = [i for i in range(total) if i not in done]
    return [tuple(todo[j] for j in part) for part in split(len(todo), size)]


def check(analysis: Analysis, model, items: Sequence, **arguments):
    """The whole corpus checked as one run checks it (every id, the pairs' lengths for a position site, the
    model's kind, the arguments), measuring nothing: the analysis itself, told to stop before its first item.
    Returns that empty result, whose parts give the merge each part's shape. A chunk checks only its own items,
    so what holds across chunks (one token length) is checked here, once."""
    return analysis.run(model, items, stop=lambda: True, **arguments)


def run_chunk(analysis: Analysis, model, items: Sequence, stop: jobs.Stop | None = None, **arguments) -> Measured:
    """One chunk: the analysis's *_over on the chunk's items alone (what a replica runs), with each item's value."""
    values: dict[int, object] = {}
    result = analysis.run(model, list(items), stop=stop, each=values.__setitem__, **arguments)
    return Measured(result, values)


def from_saved(analysis: Analysis, model, items: Sequence, done: dict[int, object], **arguments) -> Chunk:
    """The items finished before (index in the corpus → value, as saved.read_items reads them back) as one chunk,
    summarised where this runs without measuring anything: the analysis is told every one of them is done."""
    chosen = sorted(done)
    result = analysis.run(model, [items[i] for i in chosen],
                          done={place: done[i] for place, i in enumerate(chosen)}, **arguments)
    return Chunk(tuple(chosen), result)


def words(items: Sequence[int], noun: str) -> str:
    """'texts 8–15', 'texts 3, 4, 9' or 'text 8': a chunk's items by their index in the corpus."""
    if len(items) == 1:
        return f"{noun} {items[0]}"
    if list(items) == list(range(items[0], items[-1] + 1)):
        return f"{noun}s {items[0]}–{items[-1]}"
    return f"{noun}s {', '.join(map(str, items))}"


def as_finished(submit: Callable[[Sequence[int]], Future], ranges: Sequence[Sequence[int]], in_flight: int, noun: str,
                stop: jobs.Stop | None = None) -> Iterator[Chunk]:
    """Each chunk as it finishes (in any order), with at most `in_flight` submitted and unfinished at once, the
    rest submitted as those finish. Ends early once stop() says so; ending (early, or the reader closing the
    iterator) cancels the chunks still under way. A chunk that fails raises a ValueError naming its items.
    submit(items) gives a Future of run_chunk's Measured over those items."""
    waiting, pending = list(ranges), {}
    if in_flight < 1:
        raise ValueError(f"in_flight is how many chunks run at once: at least 1, got {in_flight}")
    try:
        while waiting or pending:
            while waiting and len(pending) < in_flight:
                items = waiting.pop(0)
                pending[submit(items)] = items
            if stop is not None and stop():
                return
            done, _ = wait(pending, timeout=STOP_POLL_S, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: pending[f][0]):
                items = pending.pop(future)
                measured = outcome(future, items, noun)
                yield Chunk(items, measured.result, measured.values)
    finally:
        for future in pending:
            future.cancel()


def outcome(future: Future, items: Sequence[int], noun: str) -> Measured:
    try:
        return future.result()
    except ValueError as error:      # the analysis refused something in the chunk: its own words
        raise ValueError(f"{words(items, noun)} (one chunk of the job): {error}") from None
    except Exception as error:  # noqa: BLE001 - a worker that died, a lost connection: named, never a traceback
        log.warning("the chunk of %s failed", words(items, noun), exc_info=error)
        raise ValueError(f"{words(items, noun)} (one chunk of the job) failed where it ran "
                         f"({type(error).__name__}); the finished chunks are kept, and the log has the details") \
            from None


def merge(empty, chunks: Sequence[Chunk], noun: str, total: int, stopped: bool = False, cap: str = ""):
    """The finished chunks as one result over the corpus of `total` items, in the form of `empty` (check's):
    each part's per_item rows concatenated in input order and summarised once, as jobs.Job.over summarises one run.
    Each part's left_out (index in its chunk → why) is named again by the index in the whole corpus: an item a
    chunk measured but left out of a part (a text that is no repeated span, for induction) is left out of that
    part here; one no part holds (a skipped pair) is skipped. stopped: the chunks not merged were stopped, which
    the note says, as a stopped run's does. cap: capped's note of the items the job leaves, put first in each
    part's note as one run puts it."""
    form = "over" if isinstance(empty, Over) else "tuple" if isinstance(empty, tuple) else "dict"
    ordered = sorted(chunks, key=lambda chunk: chunk.items[0])
    measured = {chunk.items[i] for chunk in ordered for over in saved.parts_of(chunk.result).values()
                for i in over.items}
    merged = {}
    for name, blank in saved.parts_of(empty).items():
        job = jobs.Job(total, noun, stopped=stopped)
        left_out = {}
        for chunk in ordered:
            over = saved.parts_of(chunk.result)[name]
            for row, i in enumerate(over.items):
                job.values[chunk.items[i]] = over.per_item[row]
            for i, why in over.left_out.items():
                index = chunk.items[i]
                if index in measured:
                    job.values[index], left_out[index] = None, why     # measured, not of this part
                else:
                    job.skipped[index] = why
        over = job.over(tuple(blank.per_item.shape[1:]), left_out=left_out, bounds=blank.bounds)
        over.note = "; ".join(part for part in (cap, over.note) if part)
        merged[name] = over
    return saved.result_of(form, merged)
