"""A corpus job whose measuring runs elsewhere (the Ray backend: ui.backend.routing runs the Across texts tab's
jobs on the front inside `chunks_on(runner)`): the job is split into chunks of items (core/corpus/chunks.py), each
sent to the runner as one call, and the finished chunks are merged into the one run's summary as they come.

Saving is the front's, item by item as in core/corpus/saved.py run_over: each finished chunk's items are written
to the job's folder as the chunk comes back, so a stopped or killed job keeps them, and a rerun of the same job
(here, or in one process: the folder and the item files are the same) sends only the items not yet finished."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import closing, contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Protocol

from core.analysis.over import analysis_named
from core.corpus import chunks, saved
from ui.services.corpus.pages import Saving, saved_words, unsaved
from ui.services.corpus.updates import OverUpdate, partial_note, refusals_in_words

log = logging.getLogger(__name__)
WAIT_S = 1.0             # how often a job of one call elsewhere asks whether the page stopped it


class ChunkRunner(Protocol):
    """Where a job's chunks run (ui.backend.ray_serve.ServeChunks: the model's deployment on Ray Serve)."""
    in_flight: int           # chunks under way at once
    chunk_items: int         # items in one chunk

    def submit(self, analysis: str, items: list, arguments: dict) -> Future:
        """A Future of chunks.run_chunk(analysis, model, items, **arguments) run where the model is."""

    def examples(self, texts: list, layer: int, head: int, k: int, per_decile: int) -> Future:
        """A Future of core.corpus.heads.top_examples over the whole of `texts`, run where the model is."""

    def qk(self, texts: list, layer: int, head: int, max_points: int) -> Future:
        """A Future of core.corpus.heads.qk_over over the whole of `texts`, run where the model is."""


CHUNKS: ContextVar[ChunkRunner | None] = ContextVar("corpus_chunks", default=None)


@contextmanager
def chunks_on(runner: ChunkRunner):
    """Within this block the corpus jobs (over.stream_over, examples.stream_examples, qk.stream_plane) send their
    measuring to `runner` instead of running it here."""
    token = CHUNKS.set(runner)
    try:
        yield
    finally:
        CHUNKS.reset(token)


def waited(future: Future, report: Callable[[int, int], None], total: int):
    """The result of one call where the runner's model is (top examples, a q/k plane), asked every WAIT_S whether
    the page stopped the job (report raises then), which cancels the call."""
    try:
        while True:
            try:
                return future.result(timeout=WAIT_S)
            except TimeoutError:
                report(0, total)
    finally:
        future.cancel()


def begun_job(name: str, items: list, arguments: dict, saving: Saving,
              model_name: str) -> tuple[saved.Begun | None, Saving]:
    """The job's folder as saved.begin finds or makes it (None where it is not saved), and the Saving to tell of:
    past a cap the job is measured all the same, and not saved."""
    if saving.root is None:
        return None, saving
    try:
        analysis = analysis_named(name)
        return saved.begin(analysis, items, saving.root, model_name, saved.arguments_of(analysis, arguments),
                           max_bytes=saving.max_bytes, room=saving.room,
                           wrote=saving.wrote or (lambda folder: None)), saving
    except saved.NoRoom as error:
        return None, unsaved(error)
    except OSError as error:     # a folder that cannot be written: the job is shown all the same
        return None, not_kept(error)


def not_kept(error: OSError) -> Saving:
    log.warning("a chunked corpus job could not be saved", exc_info=error)
    return Saving(None, f"Not saved: {error}.")


def stream_chunks(runner: ChunkRunner, model, name: str, items: list, noun: str, arguments: dict,
                  stop: Callable[[], bool] | None, saving: Saving, model_name: str) -> Iterator[OverUpdate]:
    """over.stream_over of the analysis `name` (core/analysis/over.py ANALYSES) with the corpus split into chunks of
    runner.chunk_items items (an ablation's of one text: chunks.chunk_items), runner.in_flight of them under way at
    once: an update as each chunk finishes, with the merged summary of the chunks finished so far. The whole
    corpus is checked here first, as one run checks it. Saved under saving.root: a finished job is reopened; one
    stopped or killed before sends only the items it had not finished, and merges the rest read back from its
    folder. Closing the iterator (the page's Stop)
    cancels the chunks under way; stop() ends the job with the summary of the finished chunks, which are kept.
    An analysis that measures only some items (ablation's first texts) is capped here, before splitting, and its
    result noted as one run notes it; the job's folder is the whole corpus's, as one run's is."""
    with saving.held():     # the page's saved jobs are not deleted while this one runs
        yield from chunk_updates(runner, model, name, items, noun, arguments, stop, saving, model_name)


def chunk_updates(runner: ChunkRunner, model, name: str, items: list, noun: str, arguments: dict,
                  stop: Callable[[], bool] | None, saving: Saving, model_name: str) -> Iterator[OverUpdate]:
    started = time.perf_counter()
    with refusals_in_words():
        empty = chunks.check(analysis_named(name), model, items, **arguments)
        begun, saving = begun_job(name, items, arguments, saving, model_name)
        items, cap = chunks.capped(analysis_named(name), items, arguments)
        total = len(items)
        if begun is not None and begun.finished is not None:
            yield OverUpdate(total, total, begun.finished.result, time.perf_counter() - started, True,
                             saved_words(begun.finished, saving), begun.folder)
            return
        done = begun.done if begun is not None else {}
        finished = [chunks.from_saved(analysis_named(name), model, items, done, **arguments)] if done else []
    ranges = chunks.remaining(total, done, chunks.chunk_items(analysis_named(name), runner.chunk_items))
    yield OverUpdate(len(done), total, partial(empty, finished, noun, total) if done else None, 0.0)
    fits = saved.room_for(saving.root, saving.max_bytes, saving.room) if begun is not None else None
    full = ""

    def submit(part) -> Future:
        return runner.submit(name, [items[i] for i in part], arguments)

    with refusals_in_words(), closing(chunks.as_finished(submit, ranges, runner.in_flight, noun, stop)) as coming:
        for chunk in coming:   # closing: a page that stops here cancels the chunks under way at once
            if begun is not None and not full:
                try:
                    keep(begun.folder, chunk, saving, fits)
                except OSError as error:
                    begun, saving = None, not_kept(error)
                except saved.NoRoom as error:   # past a cap: measured and shown, not saved; the items that fit kept
                    full = str(error)
            finished.append(chunk)
            count = sum(len(part.items) for part in finished)
            if count < total:
                yield OverUpdate(count, total, partial(empty, finished, noun, total), time.perf_counter() - started)
    stopped = len(finished) - bool(done) < len(ranges)
    result = chunks.merge(empty, finished, noun, total, stopped, cap)
    run = None
    if begun is not None:
        measured = sum(len(chunk.values) for chunk in finished[bool(done):])
        run = saved.Run(begun.folder, result, not stopped and not full, len(done), measured, full)
        try:
            if not stopped and not full:
                save_whole(begun, name, arguments, result, saving, fits)
        except OSError as error:    # the result is still shown: only keeping it failed
            run, saving = None, not_kept(error)
        except saved.NoRoom as error:
            run = saved.Run(begun.folder, result, False, len(done), measured, str(error))
    folder = run.folder if run is not None and run.finished else None
    yield OverUpdate(total, total, result, time.perf_counter() - started, True, saved_words(run, saving), folder)


def partial(empty, finished: list[chunks.Chunk], noun: str, total: int):
    """The merged summary of the chunks finished so far, each part's note saying of how many."""
    merged = chunks.merge(empty, finished, noun, total)
    count = sum(len(chunk.items) for chunk in finished)
    for over in saved.parts_of(merged).values():
        over.note = "; ".join(part for part in (partial_note(count, total, noun), over.note) if part)
    return merged


def keep(folder: Path, chunk: chunks.Chunk, saving: Saving, fits: Callable[[int], None] | None = None) -> None:
    """A finished chunk's items written to the job's folder, one file each (saved.write_item, as run_over); the
    first that fits(size) refuses raises saved.NoRoom, those before it kept."""
    try:
        for index, value in chunk.kept().items():
            saved.write_item(folder, index, value, fits)
    finally:
        if saving.wrote is not None:
            saving.wrote(folder)


def save_whole(begun: saved.Begun, name: str, arguments: dict, result, saving: Saving,
               fits: Callable[[int], None] | None = None) -> None:
    """A finished chunked job's result saved as saved.run_over saves one (result.npz, then meta.json), so a rerun
    here or in one process reopens it and Export reads it."""
    arguments = saved.arguments_of(analysis_named(name), arguments)
    saved.save_result(begun.folder, begun.ident, analysis_named(name), arguments, result, fits)
    if saving.wrote is not None:
        saving.wrote(begun.folder)
