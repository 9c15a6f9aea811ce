"""The front's side of a corpus job run elsewhere (ui/services/corpus/over.py stream_over and examples.py
stream_examples inside chunked.chunks_on), with a runner of threads in this process in place of the Ray deployment:
the updates stream as chunks finish, the last is the one-process result, a page that stops cancels the chunks not
yet run, each finished chunk's items are saved on the front so a rerun sends only the rest (and one process resumes
the same folder, and the other way), a finished job is reopened without sending a chunk, and a head's top examples
found in one call are the ones found here, as is a head's query/key plane. The same paths on a local Ray instance: tests/app/test_ray_backend.py."""
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch

from core import load_model
from core.analysis import over as overs
from core.corpus import Pair, chunks, saved
from core.corpus import heads as head_places
from tests import tiny
from tests.tiny_app_model import build_tiny_llama
from ui.services.corpus.examples import stream_examples
from ui.services.corpus.chunked import chunks_on
from ui.services.corpus.over import Corpus, stream_over


class ThreadChunks:
    """A ChunkRunner that runs each chunk in a thread here, recording what it was sent."""

    def __init__(self, model, in_flight: int, chunk_items: int):
        self.model, self.in_flight, self.chunk_items = model, in_flight, chunk_items
        self.pool = ThreadPoolExecutor(in_flight)
        self.sent: list[tuple[str, int, Future]] = []

    def submit(self, analysis: str, items: list, arguments: dict) -> Future:
        future = self.pool.submit(chunks.run_chunk, overs.ANALYSES[analysis], self.model, items, **arguments)
        self.sent.append((analysis, len(items), future))
        return future

    def examples(self, texts: list, layer: int, head: int, k: int, per_decile: int) -> Future:
        self.sent.append(("examples", len(texts), None))
        return self.pool.submit(head_places.top_examples, self.model, texts, layer, head, k, per_decile=per_decile)

    def qk(self, texts: list, layer: int, head: int, max_points: int) -> Future:
        self.sent.append(("qk", [type(text).__name__ for text in texts], None))
        return self.pool.submit(head_places.qk_over, self.model, texts, layer, head, max_points=max_points)


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
    whole = overs.head_scores_over(llama, corpus.items)
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


def job_folder(root) -> object:
    (folder,) = [path for path in root.iterdir() if (path / saved.JOB).is_file()]
    return folder


def assert_whole(got: dict, want: dict) -> None:
    for name, over in want.items():
        for field in ("mean", "low", "high", "per_item"):
            torch.testing.assert_close(getattr(got[name], field), getattr(over, field), atol=1e-5, rtol=0)
        assert (got[name].n, got[name].items, got[name].note) == (over.n, over.items, over.note)


def test_a_stopped_job_in_chunks_keeps_its_items_and_a_rerun_sends_only_the_rest(llama, tmp_path):
    corpus = Corpus(texts(), "text", "seven repeated spans")
    runner = FirstChunkOnly(llama, in_flight=2, chunk_items=2)
    updates = over_in_chunks(runner, llama, corpus, root=tmp_path, model_name="tiny")
    assert next(updates).done == 0 and next(updates).done == 2
    updates.close()                                  # the page's Stop mid-job: as a kill, for the job
    folder = job_folder(tmp_path)
    assert sorted(path.name for path in (folder / saved.ITEMS).iterdir()) == ["000000.npz", "000001.npz"]
    assert not (folder / saved.META).exists()
    again = ThreadChunks(llama, in_flight=2, chunk_items=2)
    resumed = list(over_in_chunks(again, llama, corpus, root=tmp_path, model_name="tiny"))
    assert [size for _, size, _ in again.sent] == [2, 2, 1]              # texts 2–6 only
    assert resumed[0].done == 2 and resumed[0].result["induction"].items == (0, 1)
    assert resumed[0].result["induction"].note.startswith("2 of 7 texts finished so far")
    assert "resumed from 2 items saved before" in resumed[-1].saved and resumed[-1].folder == folder
    assert_whole(resumed[-1].result, overs.head_scores_over(llama, corpus.items))


def pairs() -> list[Pair]:
    gen = torch.Generator().manual_seed(5)
    made = []
    for _ in range(6):
        clean = torch.randint(3, tiny.VOCAB - 1, (7,), generator=gen)
        corrupted = clean.clone()
        corrupted[2] = (clean[2] + 7) % (tiny.VOCAB - 3) + 3
        made.append(Pair(clean, corrupted, 11, 23))
    return made


def test_one_folder_resumes_in_chunks_or_in_one_process(llama, tmp_path):
    """The item files are the same wherever the items were measured: a job stopped in chunks finishes in one
    process, and one stopped in one process finishes in chunks."""
    corpus = Corpus(texts(), "text", "seven repeated spans")
    runner = ThreadChunks(llama, in_flight=1, chunk_items=3)
    stopped = list(over_in_chunks(runner, llama, corpus, root=tmp_path / "a", model_name="tiny",
                                  stop=lambda: len(runner.sent) > 1))[-1]
    assert "stopped; its finished items are kept" in stopped.saved and stopped.folder is None
    assert stopped.result["previous_token"].items == (0, 1, 2)
    here = list(stream_over(llama, "heads", corpus, root=tmp_path / "a", model_name="tiny"))[-1]
    assert "resumed from 3 items saved before" in here.saved
    assert_whole(here.result, overs.head_scores_over(llama, corpus.items))

    items, finished = pairs(), []
    run = saved.run_over(overs.ANALYSES["logit_attribution"], llama, items, tmp_path / "b", "tiny",
                         each=lambda i, _: finished.append(i), stop=lambda: len(finished) >= 2)
    assert not run.finished and len(list((run.folder / saved.ITEMS).iterdir())) == 2
    again = ThreadChunks(llama, in_flight=2, chunk_items=2)
    with chunks_on(again):
        resumed = list(stream_over(llama, "attribution", Corpus(items, "pair", "six pairs"), root=tmp_path / "b",
                                   model_name="tiny"))[-1]
    assert [size for _, size, _ in again.sent] == [2, 2] and "resumed from 2 items saved before" in resumed.saved
    want = overs.logit_attribution_over(llama, items)
    assert_whole(dict(zip("hm", resumed.result)), dict(zip("hm", want)))


@pytest.fixture(scope="module")
def named_llama(tmp_path_factory):
    return load_model(build_tiny_llama(tmp_path_factory.mktemp("examples") / "tiny-llama"), device="cpu")


def test_top_examples_found_in_one_call_elsewhere_are_the_ones_found_here(named_llama):
    """The front sends the texts' token ids (never a file's path) in one call; the places listed are the same."""
    tokenizer = named_llama.tokenizer
    strings = ["the cat sat on the mat and the cat sat", "a dog ran far, a dog ran", "one two three one two three"]
    corpus = Corpus([torch.tensor(tokenizer.encode(text)) for text in strings], "text", "three texts")
    runner = ThreadChunks(named_llama, in_flight=1, chunk_items=2)
    with chunks_on(runner):
        there = list(stream_examples(named_llama, corpus, 1, 2, 4))[-1].result
    here = list(stream_examples(named_llama, corpus, 1, 2, 4))[-1].result
    assert [(kind, n) for kind, n, _ in runner.sent] == [("examples", 3)]
    assert there[0] == here[0] and there[1] == here[1] and len(there[0]) == 4
    assert (there[2].places, there[2].n, there[2].note) == (here[2].places, here[2].n, here[2].note)


def test_an_ablation_in_chunks_is_capped_first_resumes_and_is_the_one_process_result(llama, tmp_path):
    """Ablation sweeps the first ABLATION_TEXTS texts: the front caps the corpus before splitting it (one text a
    chunk), saves each chunk's items so a stopped job resumes sending only the rest, and ends with one run's Over
    (note included); the one-process path reopens the same job."""
    corpus = Corpus(texts() + texts()[:3], "text", "ten repeated spans")        # 10 texts: 8 swept
    first = ThreadChunks(llama, in_flight=1, chunk_items=3)
    with chunks_on(first):
        stopped = list(stream_over(llama, "ablation", corpus, root=tmp_path, model_name="tiny", ablation="mean",
                                   stop=lambda: len(first.sent) > 3))[-1]
    assert "stopped; its finished items are kept" in stopped.saved and stopped.result.items == (0, 1, 2)
    runner = ThreadChunks(llama, in_flight=2, chunk_items=3)
    with chunks_on(runner):
        updates = list(stream_over(llama, "ablation", corpus, root=tmp_path, model_name="tiny", ablation="mean"))
    assert [(a, size) for a, size, _ in runner.sent] == [("ablation", 1)] * 5       # a sweep: one text a call
    assert "resumed from 3 items saved before" in updates[-1].saved
    assert updates[-1].total == 8 and (updates[-1].folder / saved.META).is_file()
    want = overs.ablation_over(llama, corpus.items, "mean")
    assert_whole({"over": updates[-1].result}, {"over": want})
    assert want.note.startswith("swept the first 8 of 10 texts")
    here = list(stream_over(llama, "ablation", corpus, root=tmp_path, model_name="tiny", ablation="mean"))[-1]
    assert "nothing was measured again" in here.saved and here.folder == updates[-1].folder


def test_a_qk_plane_found_in_one_call_elsewhere_is_the_one_found_here(named_llama):
    """The front sends the texts' token ids (never a file's path) in one call; the plane is the same."""
    from ui.services.corpus.qk import stream_plane

    tokenizer = named_llama.tokenizer
    strings = ["the cat sat on the mat and the cat sat", "a dog ran far, a dog ran", "one two three one two three"]
    corpus = Corpus([torch.tensor(tokenizer.encode(text)) for text in strings], "text", "three texts")
    runner = ThreadChunks(named_llama, in_flight=1, chunk_items=2)
    with chunks_on(runner):
        there = list(stream_plane(named_llama, corpus, 1, 2))[-1].result
    here = list(stream_plane(named_llama, corpus, 1, 2))[-1].result
    assert [(kind, types) for kind, types, _ in runner.sent] == [("qk", ["Tensor"] * 3)]
    for field in ("points", "is_key", "text", "position", "token"):
        torch.testing.assert_close(getattr(there.plane, field), getattr(here.plane, field), atol=1e-5, rtol=0)
    assert (there.plane.note, there.labels) == (here.plane.note, here.labels)
