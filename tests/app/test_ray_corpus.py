"""The front's side of a corpus job run in chunks (ui/services/corpus/over.py stream_over inside chunks_on), with a
runner of threads in this process in place of the Ray deployment: the updates stream as chunks finish, the last
is the one-process result, a page that stops cancels the chunks not yet run, and a finished job is saved on the
front and reopened without sending a chunk. The same path on a local Ray instance: tests/app/test_ray_backend.py."""
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch

from core import load_model
from core.corpus import chunks, summaries
from tests import tiny
from ui.services.corpus.over import Corpus, chunks_on, stream_over


class ThreadChunks:
    """A ChunkRunner that runs each chunk in a thread here, recording what it was sent."""

    def __init__(self, model, in_flight: int, chunk_items: int):
        self.model, self.in_flight, self.chunk_items = model, in_flight, chunk_items
        self.pool = ThreadPoolExecutor(in_flight)
        self.sent: list[tuple[str, int, Future]] = []

    def submit(self, analysis: str, items: list, arguments: dict) -> Future:
        future = self.pool.submit(chunks.run_chunk, analysis, self.model, items, **arguments)
        self.sent.append((analysis, len(items), future))
        return future


@pytest.fixture(scope="module")
def llama():
    return load_model(tiny.save(tiny.llama(num_key_value_heads=2)), device="cpu")


def texts() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    spans = [torch.randint(3, tiny.VOCAB - 1, (4 + i % 3,), generator=gen) for i in range(7)]
    return [torch.cat([span, span]) for span in spans]


def over_in_chunks(runner, model, corpus, **options):
    with chunks_on(runner):
        return stream_over(model, "heads", corpus, **options)


def test_a_job_in_chunks_streams_each_chunk_and_ends_with_the_one_process_result(llama):
    corpus = Corpus(texts(), "text", "seven repeated spans")
    runner = ThreadChunks(llama, in_flight=1, chunk_items=2)
    updates = list(over_in_chunks(runner, llama, corpus))
    assert [size for _, size, _ in runner.sent] == [2, 2, 2, 1]
    assert [u.done for u in updates] == [0, 2, 4, 6, 7] and [u.finished for u in updates][-2:] == [False, True]
    partial = updates[2].result["induction"]
    assert partial.items == (0, 1, 2, 3) and partial.note.startswith("4 of 7 texts finished so far")
    whole = summaries.head_scores_over(llama, corpus.items)
    for name, over in whole.items():
        got = updates[-1].result[name]
        for field in ("mean", "low", "high", "per_item"):
            torch.testing.assert_close(getattr(got, field), getattr(over, field), atol=1e-5, rtol=0)
        assert (got.n, got.items, got.note) == (over.n, over.items, over.note)
    assert updates[-1].saved.startswith("Not saved")        # no runs folder given


class FirstChunkOnly(ThreadChunks):
    """Runs the first chunk; the others stay under way, as on a replica still at work, until cancelled."""

    def submit(self, analysis: str, items: list, arguments: dict) -> Future:
        if self.sent:
            future = Future()
            self.sent.append((analysis, len(items), future))
            return future
        return super().submit(analysis, items, arguments)


def test_a_page_that_stops_cancels_the_chunks_under_way(llama):
    corpus = Corpus(texts(), "text", "seven repeated spans")
    runner = FirstChunkOnly(llama, in_flight=3, chunk_items=2)
    updates = over_in_chunks(runner, llama, corpus)
    assert next(updates).done == 0 and next(updates).done == 2     # the first chunk's summary
    assert len(runner.sent) == 3                                    # three under way at most
    updates.close()                                                 # the page's Stop
    assert [future.cancelled() for _, _, future in runner.sent] == [False, True, True]


def test_a_finished_job_is_saved_on_the_front_and_reopened_without_a_chunk(llama, tmp_path):
    corpus = Corpus(texts()[:3], "text", "three repeated spans")
    runner = ThreadChunks(llama, in_flight=2, chunk_items=2)
    first = list(over_in_chunks(runner, llama, corpus, root=tmp_path, model_name="tiny"))[-1]
    assert "saved (in the runs folder" in first.saved and (first.folder / "meta.json").exists()
    again = ThreadChunks(llama, in_flight=2, chunk_items=2)
    reopened = list(over_in_chunks(again, llama, corpus, root=tmp_path, model_name="tiny"))
    assert again.sent == [] and len(reopened) == 1 and "nothing was measured again" in reopened[0].saved
    torch.testing.assert_close(reopened[0].result["induction"].mean, first.result["induction"].mean)
    # the one-process path reads the same job as finished: nothing measured there either
    here = list(stream_over(llama, "heads", corpus, root=tmp_path, model_name="tiny"))[-1]
    assert "nothing was measured again" in here.saved
