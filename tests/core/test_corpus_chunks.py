"""A corpus job split into chunks (core/corpus/chunks.py), each chunk run on its own, merged back: the same Over as
one run over the whole corpus (mean, interval, per_item, items and note), a stop that keeps the finished chunks,
a chunk that fails named by its items, and the whole corpus checked before any chunk runs. No Ray: the chunks run
in threads here, as a Ray front runs them on replicas."""
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from core import load_model
from core.analysis import over as overs
from core.corpus import Pair, chunks, jobs, saved, stats
from tests import tiny

ANSWER, FOIL = 11, 23


@pytest.fixture(scope="module")
def llama():
    return load_model(tiny.save(tiny.llama(num_key_value_heads=2)), device="cpu")


def random_ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, tiny.VOCAB - 1, (n,), generator=torch.Generator().manual_seed(seed))


def corpus_texts() -> list[torch.Tensor]:
    """Texts of several lengths; every other one a span repeated once (scored for induction), the rest not."""
    texts = []
    for i, n in enumerate([7, 5, 9, 6, 8, 4, 7]):
        span = random_ids(n, i)
        texts.append(torch.cat([span, span]) if i % 2 == 0 else random_ids(2 * n + 1, 100 + i))
    return texts


def corpus_pairs() -> list[Pair]:
    pairs = []
    for i in range(7):
        clean = random_ids(9, 200 + i)
        corrupted = clean.clone()
        corrupted[2] = (clean[2] + 7) % (tiny.VOCAB - 3) + 3
        pairs.append(Pair(clean, corrupted, ANSWER, FOIL))
    pairs[4] = Pair(pairs[4].clean, pairs[4].clean.clone(), ANSWER, FOIL)   # the same metric: skipped
    return pairs


def chunked(analysis, model, items, size, stop=None, fail_at=None, **arguments):
    """The job split into chunks of `size` run in two threads, merged as a Ray front merges them."""
    empty = chunks.check(overs.ANALYSES[analysis], model, items, **arguments)
    ranges = chunks.split(len(items), size)

    def run(part: range):
        if fail_at in part:
            raise RuntimeError("the worker went away")
        return chunks.run_chunk(overs.ANALYSES[analysis], model, [items[i] for i in part], **arguments)

    noun = "pair" if isinstance(items[0], Pair) else "text"
    with ThreadPoolExecutor(2) as pool:
        finished = list(chunks.as_finished(lambda part: pool.submit(run, part), ranges, 2, noun, stop))
    return chunks.merge(empty, finished, noun, len(items), stopped=len(finished) < len(ranges)), finished


def assert_same(got: stats.Over, want: stats.Over) -> None:
    for field in ("mean", "low", "high", "per_item"):
        torch.testing.assert_close(getattr(got, field), getattr(want, field), atol=1e-5, rtol=0, equal_nan=True)
    assert (got.n, got.items, got.note, got.left_out) == (want.n, want.items, want.note, want.left_out)
    assert (got.interval, got.bounds) == (want.interval, want.bounds)     # merged in the range one run uses


def test_split_covers_the_corpus_in_order():
    assert chunks.split(7, 3) == [range(0, 3), range(3, 6), range(6, 7)]
    assert chunks.split(2, 8) == [range(0, 2)] and chunks.split(0, 3) == []
    with pytest.raises(ValueError, match="size must be a whole number ≥ 1, got 0"):
        chunks.split(5, 0)


def test_chunked_head_scores_are_the_whole_runs(llama):
    texts = corpus_texts()
    whole = overs.head_scores_over(llama, texts)
    merged, finished = chunked("head_scores", llama, texts, 3)
    assert len(finished) == 3 and set(merged) == set(whole)
    for name in whole:
        assert_same(merged[name], whole[name])
    # the texts that are no repeated span, left out of induction by index in the whole corpus
    assert merged["induction"].items == (0, 2, 4, 6) and "text 5 (not a span repeated once)" in merged["induction"].note


def test_chunked_attribution_and_patching_are_the_whole_runs(llama):
    pairs = corpus_pairs()
    for got, want in zip(chunked("logit_attribution", llama, pairs, 3)[0],
                         overs.logit_attribution_over(llama, pairs)):
        assert_same(got, want)
    for site, layer in (("z", None), ("resid_pre", None), ("z", 1)):
        merged, _ = chunked("patch", llama, pairs, 2, site=site, layer=layer)
        want = overs.patch_over(llama, pairs, site, layer=layer)
        assert_same(merged, want)
        assert 4 not in merged.items and "pair 4 (its clean and corrupted runs give the same" in merged.note


def test_chunked_ablation_is_capped_before_splitting_and_is_the_whole_run(llama):
    """Ablation sweeps only the first ABLATION_TEXTS texts: the cap is applied before splitting (no chunk reaches
    it), and the merged Over carries the cap's note as one run does."""
    texts = corpus_texts() + corpus_texts()[:3]                 # 10 texts: 8 swept
    measured, cap = chunks.capped(overs.ANALYSES["ablation"], texts, {})
    assert len(measured) == overs.ABLATION_TEXTS == 8 and cap.startswith("swept the first 8 of 10 texts")
    empty = chunks.check(overs.ANALYSES["ablation"], llama, texts)              # every text checked, as one run checks them
    with ThreadPoolExecutor(2) as pool:
        finished = list(chunks.as_finished(
            lambda part: pool.submit(chunks.run_chunk, overs.ANALYSES["ablation"], llama, [measured[i] for i in part],
                                     ablation="mean"), chunks.split(len(measured), 3), 2, "text"))
    assert sorted(len(chunk.items) for chunk in finished) == [2, 3, 3]
    assert all("swept the first" not in chunk.result.note for chunk in finished)    # no chunk is capped
    merged = chunks.merge(empty, finished, "text", len(measured), cap=cap)
    assert_same(merged, overs.ablation_over(llama, texts, "mean"))
    assert chunks.capped(overs.ANALYSES["ablation"], texts[:5], {})[1] == "" and len(chunks.capped(overs.ANALYSES["ablation"], texts, {"limit": 3})[0]) == 3
    assert chunks.capped(overs.ANALYSES["ablation"], texts, {"limit": None})[1] == ""


def test_items_left_out_are_named_by_index_past_the_ones_a_note_names(llama):
    """A chunk that leaves out more items than its note names (jobs.NAMED): each is still left out, with its
    own reason, by its index in the whole corpus."""
    texts = [random_ids(6, 300 + i) for i in range(jobs.NAMED + 4)]
    texts[1] = torch.cat([texts[1][:3], texts[1][:3]])        # the one text scored for induction
    whole = overs.head_scores_over(llama, texts)["induction"]
    merged = chunked("head_scores", llama, texts, len(texts) - 1)[0]["induction"]
    assert len(whole.left_out) == len(texts) - 1 and merged.items == (1,)
    assert_same(merged, whole)


def test_the_items_finished_before_merge_with_the_rest_as_one_run(llama, tmp_path):
    """Items one run finished and saved (saved.write_item), read back and summarised without measuring, then
    merged with chunks of the rest alone: the whole run's Over. A skipped pair has no value saved: it is sent
    again, and skipped again."""
    texts, pairs = corpus_texts(), corpus_pairs()
    jobs = (("head_scores", texts, {}, overs.head_scores_over(llama, texts)),
            ("patch", pairs, {"site": "z"}, overs.patch_over(llama, pairs, "z")))
    for analysis, items, arguments, whole in jobs:
        folder = tmp_path / analysis
        (folder / saved.ITEMS).mkdir(parents=True)
        first = chunks.run_chunk(overs.ANALYSES[analysis], llama, items[1:5], **arguments)      # items 1–4, finished before
        for i, value in first.values.items():
            saved.write_item(folder, 1 + i, value)
        done = saved.read_items(folder, len(items))
        assert sorted(done) == ([1, 2, 3, 4] if analysis == "head_scores" else [1, 2, 3])   # pair 4: skipped
        ranges = chunks.remaining(len(items), done, 2)
        assert sorted(i for part in ranges for i in part) == sorted(set(range(len(items))) - set(done))
        rest = []
        for part in ranges:
            measured = chunks.run_chunk(overs.ANALYSES[analysis], llama, [items[i] for i in part], **arguments)
            rest.append(chunks.Chunk(part, measured.result, measured.values))
        before = chunks.from_saved(overs.ANALYSES[analysis], llama, items, done, **arguments)
        assert before.items == tuple(sorted(done)) and before.values == {}
        noun = "pair" if analysis == "patch" else "text"
        merged = chunks.merge(chunks.check(overs.ANALYSES[analysis], llama, items, **arguments), [*rest, before], noun, len(items))
        for name, over in saved.parts_of(whole).items():
            assert_same(saved.parts_of(merged)[name], over)


def test_a_stop_keeps_the_finished_chunks(llama):
    texts = corpus_texts()
    asked = []

    def stop() -> bool:     # stops once the first chunks are in: asked again after they finish
        asked.append(1)
        return len(asked) > 2

    merged, finished = chunked("head_scores", llama, texts, 2, stop=stop)
    done = sorted(i for chunk in finished for i in chunk.items)
    assert 0 < len(done) < len(texts)
    alone = overs.head_scores_over(llama, [texts[i] for i in done])["previous_token"]
    got = merged["previous_token"]
    assert got.items == tuple(done) and got.n == len(done)
    torch.testing.assert_close(got.mean, alone.mean, atol=1e-5, rtol=0)
    assert f"stopped after {len(done)} of {len(texts)} texts" in got.note


def test_a_failed_chunk_names_its_items(llama):
    with pytest.raises(ValueError, match=r"texts 3–5 \(one chunk of the job\) failed where it ran \(RuntimeError\)"):
        chunked("head_scores", llama, corpus_texts(), 3, fail_at=4)
    assert chunks.words((2, 3, 6), "pair") == "pairs 2, 3, 6" and chunks.words((5,), "text") == "text 5"


def test_the_whole_corpus_is_checked_before_any_chunk_runs(llama):
    pairs = corpus_pairs()
    pairs[5] = Pair(random_ids(11, 9), random_ids(11, 10), ANSWER, FOIL)   # one pair of another length
    with pytest.raises(ValueError, match=r"pairs 5 \(11\) do not"):
        chunks.check(overs.ANALYSES["patch"], llama, pairs, site="resid_pre")      # each chunk alone would be of one length
    with pytest.raises(ValueError, match="got 'attention'"):
        chunks.check(overs.analysis_named("attention"), llama, corpus_texts())
