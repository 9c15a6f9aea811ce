"""Analyses over many texts: the mean and its interval against scipy.stats (Student's t, the percentile bootstrap),
in range and absent below 5 items, Spearman's ρ against scipy's, and each *_over equal
to its single-text analysis run item by item (batched head scores included), with skips, refusals and stops."""
import math
import time
import tracemalloc

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from core import load_model
from core.analysis import heads, patching
from core.analysis import over as overs
from core.corpus import Pair, jobs, stats
from tests import tiny

ANSWER, FOIL = 11, 23


@pytest.fixture(scope="module")
def llama():
    return load_model(tiny.save(tiny.llama(num_key_value_heads=2)), device="cpu")


def random_texts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, tiny.VOCAB - 1, (n,), generator=gen) for n in lengths]


def random_pair(n, at, seed):
    """A clean prompt of n random tokens and a corrupted one that differs at the positions `at`."""
    clean = random_texts([n], seed)[0]
    corrupted = clean.clone()
    for p in at:
        corrupted[p] = (clean[p] + 7) % (tiny.VOCAB - 3) + 3
    return Pair(clean, corrupted, ANSWER, FOIL)


def test_an_unbounded_mean_gets_students_t_from_scipy():
    per_item = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 7.0], [2.0, -1.0], [9.0, 4.0], [4.0, 0.5]])
    over = stats.summarise(per_item, bounds=stats.UNBOUNDED)
    assert over.n == 6 and over.items == tuple(range(6)) and over.note == "" and torch.equal(over.per_item, per_item)
    assert over.interval == stats.STUDENT and over.bounds is None
    for cell in range(2):
        values = per_item[:, cell].double().numpy()
        want = scipy_stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=scipy_stats.sem(values))
        assert float(over.mean[cell]) == pytest.approx(values.mean(), abs=1e-6)
        assert (float(over.low[cell]), float(over.high[cell])) == pytest.approx(want, abs=1e-5)
    assert stats.student_interval(torch.tensor([[0.0], [2.0]]).double(), torch.tensor([1.0]).double())[1] == \
        pytest.approx(1 + 12.7062, abs=1e-4)                     # t_{0.975, 1} from a printed table


def test_a_bounded_mean_gets_scipys_seeded_percentile_bootstrap():
    per_item = torch.tensor([[0.2, 0.9], [0.4, 1.0], [0.3, 1.0], [0.9, 0.7], [0.5, 1.0], [0.1, 1.0], [0.6, 0.8]])
    over = stats.summarise(per_item, bounds=stats.SHARE)
    assert over.interval == stats.BOOTSTRAP and over.bounds == (0.0, 1.0)
    want = scipy_stats.bootstrap((per_item.double().numpy(),), np.mean, axis=0, method="percentile",
                                 n_resamples=stats.BOOTSTRAP_RESAMPLES,
                                 rng=np.random.default_rng(stats.BOOTSTRAP_SEED)).confidence_interval
    np.testing.assert_allclose(over.low.numpy(), want.low, atol=1e-6)
    np.testing.assert_allclose(over.high.numpy(), want.high, atol=1e-6)
    assert float(over.high[1]) <= 1                        # Student's t reaches past 1 on these values
    t_high = float(stats.summarise(per_item, bounds=stats.UNBOUNDED).high[1])
    assert t_high > 1, t_high
    again = stats.summarise(per_item, bounds=stats.SHARE)          # seeded: the same values, the same interval
    assert torch.equal(again.low, over.low) and torch.equal(again.high, over.high)


def test_the_bootstrap_of_a_large_map_stays_within_its_memory_and_time():
    """N = 50 items of a [30, 9] map: batches of resamples hold about BOOTSTRAP_BYTES (all 9,999 at once would
    hold over 1 GB); the peak is measured by tracemalloc, which numpy reports its arrays to."""
    per_item = torch.rand(50, 30, 9, generator=torch.Generator().manual_seed(0))
    tracemalloc.start()
    started = time.perf_counter()
    over = stats.summarise(per_item, bounds=stats.SHARE)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert over.low.shape == (30, 9) and (over.low <= over.mean).all() and (over.mean <= over.high).all()
    resampled = 8 * 50 * 30 * 9 * stats.BOOTSTRAP_RESAMPLES
    assert peak < 4 * stats.BOOTSTRAP_BYTES < resampled / 8, (peak, resampled)
    assert seconds < 20, seconds


def test_too_few_items_get_no_interval_and_a_note_saying_so():
    per_item = torch.tensor([[0.87], [0.72], [1.0], [0.9]])
    for bounds in (stats.UNBOUNDED, stats.SHARE, stats.CORRELATION):
        over = stats.summarise(per_item, note="text 1 (skipped)", bounds=bounds)
        assert over.n == 4 and over.low.isnan().all() and over.high.isnan().all() and over.interval == ""
        assert over.note == "text 1 (skipped); too few items for an interval (n = 4; an interval needs at least 5)"
        torch.testing.assert_close(over.mean, per_item.mean(0))
    none = stats.summarise(torch.empty(0, 2), bounds=stats.SHARE)
    assert none.n == 0 and none.mean.isnan().all() and "n = 0" in none.note


def test_a_cell_with_a_nan_item_has_no_interval_and_the_others_keep_theirs():
    per_item = torch.rand(6, 3, generator=torch.Generator().manual_seed(1))
    per_item[2, 1] = math.nan
    over = stats.summarise(per_item, bounds=stats.SHARE)
    assert over.low[1].isnan() and over.high[1].isnan() and over.mean[1].isnan()
    assert not over.low[[0, 2]].isnan().any() and not over.high[[0, 2]].isnan().any()


def test_bounds_are_checked_and_values_outside_them_refused():
    with pytest.raises(ValueError, match="bounds is a quantity's range"):
        stats.summarise(torch.rand(6), bounds=(1.0, 0.0))
    with pytest.raises(ValueError, match="bounds is a quantity's range"):
        stats.summarise(torch.rand(6), bounds="share")
    with pytest.raises(ValueError, match=r"told the values lie in \(0.0, 1.0\), but 1.5 lies outside it"):
        stats.summarise(torch.tensor([0.5, 1.5, 0.2, 0.1, 0.3]), bounds=stats.SHARE)
    with pytest.raises(TypeError, match="bounds"):      # every caller says its quantity's range
        stats.summarise(torch.rand(6))
    rounded = stats.summarise(torch.tensor([1.0000001, 1.0, 0.9, 1.0, 1.0]), bounds=stats.SHARE)
    assert float(rounded.high) <= 1                      # a float sum's last bit is the quantity's still


def test_spearman_is_scipys():
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        x, y = torch.randint(0, 4, (3, 5), generator=gen).float(), torch.randn(3, 5, generator=gen)   # ties in x
        assert stats.spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x.flatten(), y.flatten()).statistic,
                                                     abs=1e-12)
    assert stats.spearman(torch.arange(5.0), torch.arange(5.0) * 10) == pytest.approx(1)
    assert math.isnan(stats.spearman(torch.ones(5), torch.arange(5.0)))        # a constant map has no ranks
    with pytest.raises(ValueError, match="one shape"):
        stats.spearman(torch.ones(5), torch.ones(4))


@pytest.mark.parametrize("build", ["llama", "gpt2", "bert"])
def test_batched_head_scores_equal_each_text_alone(build, llama):
    model = llama if build == "llama" else load_model(tiny.save(getattr(tiny, build)()), device="cpu")
    texts = random_texts([9, 4, 13, 1, 9, 6, 12])
    texts[2][8:] = texts[2][3:8]                                            # duplicate tokens
    seen = []
    over = overs.head_scores_over(model, texts, batch_tokens=30, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (7, 7) and 1 < len(seen) <= 7                        # several batches, each reported
    alone = [heads.pattern_scores(model, t[None]) for t in texts]
    for name in alone[0]:
        assert over[name].n == 7 and over[name].items == tuple(range(7)) and over[name].per_item.shape == (7, 2, 4)
        want = torch.stack([a[name] for a in alone])
        torch.testing.assert_close(over[name].per_item, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(over[name].mean, want.mean(0), atol=1e-5, rtol=0)
        # every score is an attention weight in [0, 1] but entropy (≥ 0): a bootstrap in that range
        assert over[name].interval == stats.BOOTSTRAP and over[name].bounds == heads.SCORE_BOUNDS[name]
        low = over[name].bounds[0]
        assert (over[name].low >= low).all() and (over[name].low <= over[name].mean + 1e-6).all()
    assert ("induction" in over) == (build != "bert")
    assert not over["duplicate_token"].per_item[2].eq(0).all()              # the copies were seen


def test_induction_over_repeated_texts_is_the_probes_score(llama):
    probes = [heads.induction(llama, length, seed) for length, seed in ((12, 0), (20, 1))]   # BOS, then twice
    texts = [probes[0].ids[0], random_texts([10])[0], probes[1].ids[0], probes[1].ids[0, 1:]]   # the last: no BOS
    over = overs.head_scores_over(llama, texts)["induction"]
    assert over.items == (0, 2, 3) and over.n == 3 and "left out 1 of 4 texts: text 1 (not a span" in over.note
    for row, probe in zip(over.per_item, probes):
        torch.testing.assert_close(row, probe.scores, atol=1e-5, rtol=0)
    assert not torch.allclose(over.per_item[2], over.per_item[1])             # without BOS, other positions


def test_a_stopped_job_keeps_its_finished_items(llama, monkeypatch):
    texts = random_texts([5, 5, 8, 8, 8])
    finished = []
    over = overs.head_scores_over(llama, texts, batch_tokens=10, progress=lambda d, t: finished.append(d),
                                      stop=lambda: len(finished) >= 2)
    assert over["entropy"].n == 2 and over["entropy"].items == (0, 1)
    assert "stopped after 2 of 5 texts" in over["entropy"].note
    # a sweep stops between its batches of pairs (PAIR_TOKENS 7: one pair each) or between the batches of cells
    # inside one (PATCH_TOKENS 8: two rows of 4 positions each): the pair under way is dropped, the finished kept
    pairs = [random_pair(7, (3,), seed) for seed in range(3)]
    one = patching.patch_sweep(llama, pairs[0].clean[None], pairs[0].corrupted[None], ANSWER, FOIL, "z")
    for sizes in ({"PAIR_TOKENS": 7}, {"PATCH_TOKENS": 8}):
        calls, streamed = [], {}
        with monkeypatch.context() as patched_sizes:
            for name, value in sizes.items():
                patched_sizes.setattr(overs, name, value)
            patched = overs.patch_over(llama, pairs, "z", progress=lambda d, t: calls.append(d),
                                           stop=lambda: len(calls) >= 1, each=streamed.__setitem__)
        assert patched.n == 1 and "stopped after 1 of 3 pairs" in patched.note, sizes
        assert list(streamed) == [0] and torch.equal(streamed[0], patched.per_item[0])
        torch.testing.assert_close(patched.per_item[0], one.scores, atol=1e-5, rtol=0)


def test_logit_attribution_over_is_the_mean_of_each_pairs(llama):
    pairs = [random_pair(n, (2,), seed) for seed, n in enumerate((6, 9, 7))]
    head_over, mlp_over = overs.logit_attribution_over(llama, pairs)
    each = [patching.logit_attribution(llama, p.clean[None], ANSWER, FOIL) for p in pairs]
    torch.testing.assert_close(head_over.per_item, torch.stack([e.heads for e in each]))
    torch.testing.assert_close(mlp_over.mean, torch.stack([e.mlps for e in each]).mean(0))
    assert head_over.mean.shape == (2, 4) and mlp_over.mean.shape == (2,) and head_over.n == mlp_over.n == 3


def test_patch_over_is_the_mean_of_single_pair_sweeps(llama):
    pairs = [random_pair(8, at, seed) for seed, at in enumerate(((2,), (5,), (1, 6)))]
    pairs.insert(1, Pair(pairs[0].clean, pairs[0].clean.clone(), ANSWER, FOIL))   # the same metric on both runs
    for site, layer in (("resid_pre", None), ("z", 1)):
        over = overs.patch_over(llama, pairs, site, "denoise", layer)
        sweeps = [patching.patch_sweep(llama, p.clean[None], p.corrupted[None], ANSWER, FOIL, site, "denoise", layer)
                  for p in (pairs[0], pairs[2], pairs[3])]
        by_hand = torch.stack([s.scores for s in sweeps])
        assert over.items == (0, 2, 3) and over.n == 3 and "pair 1 (its clean and corrupted runs give" in over.note
        torch.testing.assert_close(over.per_item, by_hand)
        torch.testing.assert_close(over.mean, by_hand.mean(0))
        metrics = torch.stack([s.metrics for s in sweeps]).mean(0)            # not the normalised mean metric
        clean = sum(s.clean_metric for s in sweeps) / 3
        corrupted = sum(s.corrupted_metric for s in sweeps) / 3
        assert not torch.allclose(over.mean, (metrics - corrupted) / (clean - corrupted))


def test_head_sites_take_any_lengths_and_position_sites_refuse_them(llama):
    pairs = [random_pair(n, (2,), seed) for seed, n in enumerate((8, 6, 8, 11))]
    over = overs.patch_over(llama, pairs, "z", "noise")
    assert over.per_item.shape == (4, 2, 4) and over.n == 4
    one = patching.patch_sweep(llama, pairs[3].clean[None], pairs[3].corrupted[None], ANSWER, FOIL, "z", "noise")
    torch.testing.assert_close(over.per_item[3], one.scores)
    with pytest.raises(ValueError, match=r"most have 8 tokens, but pairs 1 \(6\), 3 \(11\) do not"):
        overs.patch_over(llama, pairs, "resid_pre")
    with pytest.raises(ValueError, match="pair 1: the clean prompt has 6 tokens and the corrupted 5"):
        overs.patch_over(llama, [pairs[0], Pair(pairs[1].clean, pairs[1].corrupted[:5], 3, 4)], "z")
    with pytest.raises(ValueError, match="pair 0: the answer and the foil are the same token"):
        overs.logit_attribution_over(llama, [Pair(pairs[0].clean, pairs[0].corrupted, 5, 5)])
    with pytest.raises(ValueError, match="text 1 is empty"):
        overs.head_scores_over(llama, [pairs[0].clean, torch.tensor([], dtype=torch.long)])


def test_ablation_over_caps_its_texts_and_equals_each_sweep(llama):
    texts = random_texts([7, 10, 5])
    over = overs.ablation_over(llama, texts, limit=2)
    assert over.n == 2 and "swept the first 2 of 3 texts (limit=2" in over.note
    want = torch.stack([heads.ablation_sweep(llama, t[None]) for t in texts[:2]])
    torch.testing.assert_close(over.per_item, want)
    assert overs.ABLATION_TEXTS == 8 and "8" in overs.ablation_over.__doc__


def test_smollm2_scores_texts_of_different_lengths_in_one_batch_as_alone(smollm):
    tok = smollm.tokenizer
    strings = ["When Mary and John went to the store, John gave a drink to",
               "The cat sat on the mat.", "One two three four five six seven eight, one two three four"]
    texts = [torch.tensor(tok(s)["input_ids"]) for s in strings]
    assert len({len(t) for t in texts}) == 3
    over = overs.head_scores_over(smollm, texts)
    for i, t in enumerate(texts):
        alone = heads.pattern_scores(smollm, t[None])
        for name, table in alone.items():
            torch.testing.assert_close(over[name].per_item[i], table, atol=1e-5, rtol=0)
    assert over["first_token"].n == 3 and over["first_token"].low.isnan().all()     # too few for an interval
    assert "too few items for an interval (n = 3" in over["first_token"].note


def test_left_padding_scores_as_right_padding(llama):
    texts = random_texts([4, 9])
    right, mask = jobs.padded(texts, 0)
    left = torch.stack([right[1], torch.cat([torch.zeros(5, dtype=torch.long), texts[0]])])
    left_mask = torch.stack([mask[1], mask[0].flip(0)])
    by_left = heads.batch_pattern_scores(llama, left, left_mask)
    by_right = heads.batch_pattern_scores(llama, right, mask)
    for name, table in by_right.items():
        torch.testing.assert_close(by_left[name], table.flip(0), atol=1e-5, rtol=0)


def looped(model, pairs, site, mode="denoise", layer=None):
    """Each pair's single-pair sweep, or None where its runs give the same metric."""
    found = []
    for p in pairs:
        try:
            found.append(patching.patch_sweep(model, p.clean[None], p.corrupted[None], p.answer, p.foil, site, mode,
                                              layer))
        except ValueError:
            found.append(None)
    return found


@pytest.fixture(scope="module")
def llama64():
    """The tiny Llama in float64. A score divides by clean − corrupted, which random weights can make small, so
    float32's rounding of a padded batch against one prompt alone (about 1e-6 in the metric) could pass 1e-5 in a
    score; in float64 it cannot, and a wrong mask, position or row still shows."""
    return load_model(tiny.save(tiny.llama(num_key_value_heads=2)), device="cpu", dtype=torch.float64)


@pytest.mark.parametrize("build", ["llama", "gpt2", "bloom", "gemma2"])
def test_pairs_of_any_lengths_sweep_together_as_each_alone(build, llama64, monkeypatch):
    """Head sites batch pairs of different lengths, left-padded: one clean and one corrupted pass for them all and
    fewer batches of cells than the sweeps one by one, and each pair's scores as its own sweep gives them."""
    if build == "llama":
        model = llama64
    else:
        made = tiny.gemma(2) if build == "gemma2" else getattr(tiny, build)()
        model = load_model(tiny.save(made), device="cpu", dtype=torch.float64)
    pairs = [random_pair(n, at, seed) for seed, (n, at) in enumerate(((8, (2,)), (6, (4,)), (11, (3, 9)), (8, (6,))))]
    pairs.insert(2, Pair(pairs[1].clean, pairs[1].clean.clone(), ANSWER, FOIL))     # the same metric on both runs
    alone = looped(model, pairs, "z", "noise")
    forwards, forward = [], model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: forwards.append(1) or forward(*a, **k))
    over = overs.patch_over(model, pairs, "z", "noise")
    assert len(forwards) == 2                                                       # all five in one batch
    assert over.items == (0, 1, 3, 4) and "pair 2 (its clean and corrupted runs give the same logit" in over.note
    torch.testing.assert_close(over.per_item, torch.stack([alone[i].scores for i in over.items]), atol=1e-5, rtol=0)
    # the cells of all the pairs share one batch, where the sweeps one by one need one each
    batch = patching.pair_batch([(p.clean, p.corrupted, p.answer, p.foil) for p in pairs])
    assert batch.mask is not None and batch.mask.sum(1).tolist() == [8, 6, 6, 11, 8]
    together, apart = [], []
    found = dict(patching.sweep_pairs(model, batch, "z", "noise", progress=lambda d, t: together.append(d)))
    for p in pairs[:2] + pairs[3:]:
        patching.patch_sweep(model, p.clean[None], p.corrupted[None], ANSWER, FOIL, "z", "noise",
                             progress=lambda d, t: apart.append(d))
    assert list(found) == [0, 1, 2, 3, 4] and found[2].scores.isnan().all()
    assert len(together) == 1 and len(apart) == 4
    assert sum(found[i].computed for i in found) == sum(s.computed for s in alone if s is not None)


def test_padded_position_sweeps_keep_each_pairs_own_positions(llama64):
    """sweep_pairs over pairs of different lengths at a position site: each sweep has its own T columns, the
    padding left out, equal to its single-pair sweep; patch_over batches equal lengths only there."""
    pairs = [random_pair(n, (2,), seed) for seed, n in enumerate((9, 5, 7))]
    batch = patching.pair_batch([(p.clean, p.corrupted, p.answer, p.foil) for p in pairs], pad=3)
    for site, layer in (("resid_pre", None), ("z", 1)):
        found = dict(patching.sweep_pairs(llama64, batch, site, "denoise", layer))
        for row, sweep in zip(found, looped(llama64, pairs, site, "denoise", layer)):
            assert found[row].scores.shape == sweep.scores.shape and found[row].computed == sweep.computed
            torch.testing.assert_close(found[row].scores, sweep.scores, atol=1e-5, rtol=0)
            torch.testing.assert_close(found[row].metrics, sweep.metrics, atol=1e-5, rtol=0)


def test_smollm2_ioi_pairs_of_three_lengths_sweep_together_as_alone(smollm):
    """Real weights: IOI pairs of three token lengths in one left-padded batch (one layer's heads × positions, a
    sweep that reads the padded prefix cache and positions; cheaper than every layer's), each pair's sweep as its
    own patch_sweep gives it, within 1e-5."""
    from core.corpus.texts import ioi_pairs

    pool = ioi_pairs(smollm.tokenizer, 12, seed=0)
    pairs = list({len(p.clean): p for p in pool}.values())[:3]
    assert len({len(p.clean) for p in pairs}) == 3
    layer = smollm.config.n_layers // 2
    batch = patching.pair_batch([(p.clean, p.corrupted, p.answer, p.foil) for p in pairs])
    found = dict(patching.sweep_pairs(smollm, batch, "z", "denoise", layer))
    for row, sweep in zip(found, looped(smollm, pairs, "z", "denoise", layer)):
        assert found[row].scores.shape == (smollm.config.n_heads, len(pairs[row].clean))
        torch.testing.assert_close(found[row].scores, sweep.scores, atol=1e-5, rtol=0)
