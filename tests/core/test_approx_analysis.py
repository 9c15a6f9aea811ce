"""What an approximation costs in accuracy (core/analysis/approx.py approximation) and over a corpus
(core/analysis/over.py approximation_over) on tiny models: a decoder's perplexity and an encoder's cosine, exactness
where the budget covers every key, NaN exactly where nothing is approximated, the corpus job equal to a hand loop
over the single-text function (saved, resumed, run in chunks), refusals in words, and fit_linformer's sign and
bounds."""
import math

import pytest
import torch

from core import load_model
from core.analysis import over as overs
from core.analysis.approx import approx_from_words, approx_words, approximation
from core.approx import Approx, fit_linformer
from core.corpus import chunks, saved, stats
from tests import tiny

LENGTHS = (9, 14, 11, 16, 12, 10)       # five items at least: the summaries get intervals


@pytest.fixture(scope="module")
def llama():
    return load_model(tiny.save(tiny.llama()), device="cpu")


@pytest.fixture(scope="module")
def bert():
    return load_model(tiny.save(tiny.bert()), device="cpu")


def random_texts(lengths=LENGTHS, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, tiny.VOCAB - 1, (n,), generator=gen) for n in lengths]


# ---- one text ----

def test_a_decoder_is_measured_by_perplexity_and_an_encoder_by_cosine(llama, bert):
    ids = random_texts()[1]
    result = approximation(llama, ids, Approx("topk", k=3))
    assert result.measure == "perplexity" and result.tokens == len(ids)
    for approx, measured in ((None, result.exact), (Approx("topk", k=3), result.approximate)):
        with torch.inference_mode():
            logits = llama(ids[None], approx=approx).logits[0, :-1].float()
        assert measured == pytest.approx(math.exp(torch.nn.functional.cross_entropy(logits, ids[1:]).item()), rel=1e-5)
    assert result.approximate != pytest.approx(result.exact)
    assert result.change == result.approximate / result.exact - 1
    assert result.cache_bytes_exact == result.cache_bytes_approx == 2 * 2 * 2 * 12 * 4   # L · 2 · H_kv · d · float32

    encoded = approximation(bert, ids, Approx("performer", features=16))
    assert encoded.measure == "cosine" and encoded.exact == 1.0
    with torch.inference_mode():
        plain = bert(ids[None]).hidden_states[0].mean(0)
        replaced = bert(ids[None], approx=Approx("performer", features=16)).hidden_states[0].mean(0)
    assert encoded.approximate == pytest.approx(torch.cosine_similarity(plain, replaced, dim=0).item(), abs=1e-6)
    assert -1 <= encoded.approximate < 1 and encoded.change == 1 - encoded.approximate


# a family of each kind of term top-k carries: ALiBi's bias, Gemma 2's soft cap, Gemma 3's local and global layers,
# a sliding window, partial rotary
@pytest.mark.parametrize("family", ["bloom", "gemma2", "gemma3", "mistral-window", "qwen3-window", "gpt_neox-parallel"])
def test_top_k_over_every_key_is_exact_in_each_familys_terms(family):
    _, model = tiny.family_pair(family)
    ids = random_texts((13,), seed=4)[0]
    result = approximation(model, ids, Approx("topk", k=13))
    assert result.measure == "perplexity"
    assert float(result.tv.abs().max()) < 1e-5 and float(result.z_error.max()) < 1e-4
    assert result.approximate == pytest.approx(result.exact, rel=1e-5)


def test_errors_are_nan_exactly_where_nothing_is_approximated(llama, bert):
    ids = random_texts()[3]
    result = approximation(llama, ids, Approx("bigbird", layers=[1], heads=[0, 2], block=2, random_blocks=0))
    chosen = torch.zeros(2, 4, dtype=torch.bool)
    chosen[1, [0, 2]] = True
    for errors in (result.tv, result.z_error):
        assert torch.equal(errors.isnan(), ~chosen)
        assert (errors[chosen] > 0).all()            # 16 tokens in blocks of 2: the pattern bites
    linformer = approximation(bert, ids, Approx("linformer", rank=4, layers=[0]))
    assert linformer.tv is None                      # no weight per key
    assert linformer.z_error[0].isfinite().all() and linformer.z_error[1].isnan().all()


# ---- over a corpus ----

def test_the_corpus_job_is_the_hand_loop_over_each_text(llama, bert):
    texts = random_texts()
    approx = Approx("topk", k=4, layers=[1])
    over = overs.approximation_over(llama, texts, approx)
    each = [approximation(llama, ids, approx) for ids in texts]
    assert set(over) == {"tv", "z_error", "perplexity_change", "measure", "cache_bytes", "tokens"}
    torch.testing.assert_close(over["tv"].mean, torch.stack([r.tv for r in each]).mean(0), equal_nan=True)
    torch.testing.assert_close(over["z_error"].mean, torch.stack([r.z_error for r in each]).mean(0), equal_nan=True)
    change = over["perplexity_change"]
    assert float(change.mean) == pytest.approx(sum(r.change for r in each) / len(each), rel=1e-9)
    assert change.n == len(texts) and change.interval == stats.BOOTSTRAP and change.bounds == (-1.0, None)
    assert -1 <= float(change.low) < float(change.mean) < float(change.high)
    torch.testing.assert_close(over["measure"].mean, torch.tensor([sum(r.exact for r in each) / len(each),
                                                                   sum(r.approximate for r in each) / len(each)],
                                                                  dtype=torch.float64))
    assert over["tokens"].per_item.tolist() == list(map(float, LENGTHS))
    assert over["cache_bytes"].mean.tolist() == [each[0].cache_bytes_exact, each[0].cache_bytes_approx]
    tv = over["tv"]
    assert tv.interval == stats.BOOTSTRAP and tv.n == len(texts)
    assert tv.low[0].isnan().all() and (tv.low[1] >= 0).all() and (tv.high[1] <= 1).all()
    assert (tv.low[1] <= tv.mean[1]).all() and (tv.mean[1] <= tv.high[1]).all()

    cosine = overs.approximation_over(bert, texts, "performer features=8")["cosine"]
    values = [approximation(bert, ids, Approx("performer", features=8)).approximate for ids in texts]
    assert float(cosine.mean) == pytest.approx(sum(values) / len(values), rel=1e-9)
    assert cosine.interval == stats.BOOTSTRAP
    assert -1 <= float(cosine.low) <= float(cosine.mean) <= float(cosine.high) <= 1
    few = overs.approximation_over(bert, texts[:3], "performer features=8")["cosine"]
    assert few.n == 3 and math.isnan(float(few.low)) and few.interval == stats.NO_INTERVAL and "too few" in few.note


def test_a_stopped_job_resumes_saved_and_in_chunks_to_the_same_summary(llama, tmp_path):
    texts, words = random_texts(), "bigbird block=2 global_blocks=1 random_blocks=1 seed=0"
    whole = overs.approximation_over(llama, texts, words)
    kept, seen = [], []
    analysis = overs.analysis_named("approximation")
    half = saved.run_over(analysis, llama, texts, tmp_path, "tiny", approx=words,
                          each=lambda i, value: kept.append(i), stop=lambda: len(kept) >= 2)
    assert not half.finished and half.measured == 2 and "stopped after 2 of 6 texts" in half.result["tv"].note
    resumed = saved.run_over(analysis, llama, texts, tmp_path, "tiny", approx=words,
                             progress=lambda done, total: seen.append(done))
    assert resumed.finished and resumed.reused == 2 and resumed.measured == 4 and seen[0] == 2 and seen[-1] == 6
    for name, over in whole.items():
        torch.testing.assert_close(resumed.result[name].mean, over.mean, equal_nan=True)
        torch.testing.assert_close(resumed.result[name].low, over.low, equal_nan=True)
    reopened = saved.open_job(resumed.folder).result
    assert reopened["perplexity_change"].interval == stats.BOOTSTRAP and reopened["tv"].bounds == stats.SHARE

    empty = chunks.check(analysis, llama, texts, approx=words)
    assert empty["tv"].per_item.shape == (0, 2, 4) and empty["perplexity_change"].n == 0
    parts = [chunks.Chunk(tuple(r), chunks.run_chunk(analysis, llama, [texts[i] for i in r], approx=words).result)
             for r in chunks.split(len(texts), 4)]
    merged = chunks.merge(empty, parts, "text", len(texts))
    for name, over in whole.items():
        torch.testing.assert_close(merged[name].mean, over.mean, equal_nan=True)
        assert merged[name].interval == over.interval


def test_an_approximation_in_words_reads_back_as_itself():
    approx = Approx("bigbird", layers=[1], heads=[0, 2], block=8, random_blocks=2)
    words = approx_words(approx)
    assert words == "bigbird block=8 global_blocks=1 random_blocks=2 seed=0 layers=1 heads=0,2"
    again = approx_from_words(words)
    assert (again.method, again.budget, again.layers, again.heads) == ("bigbird", approx.budget, (1,), (0, 2))
    assert approx_words(approx_from_words("topk")) == "topk k=64"


@pytest.mark.parametrize("words, match", [
    ("", "a method and its terms"),
    ("sparse k=3", "unknown approximation 'sparse'"),
    ("topk k=three", "k must be a whole number"),
    ("topk 32", "not a term"),
    ("topk rank=3", "topk takes k"),
    ("linformer rank=4 fit=fitted", "needs its projections"),
])
def test_words_that_name_no_approximation_are_refused(words, match):
    with pytest.raises(ValueError, match=match):
        approx_from_words(words)


def test_bad_input_is_refused_in_words(llama, bert):
    texts = random_texts()
    with pytest.raises(ValueError, match="text 2 is empty"):
        overs.approximation_over(llama, [texts[0], texts[1], torch.tensor([], dtype=torch.long)], Approx("topk"))
    with pytest.raises(ValueError, match="ids is empty"):
        approximation(llama, torch.tensor([], dtype=torch.long), Approx("topk"))
    with pytest.raises(ValueError, match="integer token ids"):
        approximation(llama, torch.rand(5), Approx("topk"))
    with pytest.raises(ValueError, match="approx must be a core.approx.Approx"):
        approximation(llama, texts[0], "topk k=3")
    with pytest.raises(ValueError, match="approx must be a core.approx.Approx or its words"):
        overs.approximation_over(llama, texts, 32)
    with pytest.raises(ValueError, match="unknown approximation 'nearest'"):
        overs.approximation_over(llama, texts, "nearest k=3")
    with pytest.raises(ValueError, match="causal model would read its future"):
        overs.approximation_over(llama, texts, Approx("linformer", rank=4))      # before any text is measured
    with pytest.raises(ValueError, match="layer 5 is out of range"):
        overs.approximation_over(bert, texts, Approx("topk", layers=[5]))
    with pytest.raises(ValueError, match="a perplexity needs at least two tokens"):
        approximation(llama, texts[0][:1], Approx("topk"))
    one_token = overs.approximation_over(llama, [texts[0][:1], *texts[1:]], Approx("topk", k=2))
    assert one_token["tv"].n == len(texts) - 1 and "text 0 (a perplexity needs at least two tokens)" in \
        one_token["tv"].note
    with pytest.raises(ValueError, match="must be a number, a string"):
        saved.run_over(overs.analysis_named("approximation"), llama, texts, "unused", "tiny", approx=Approx("topk"))


# ---- Linformer fitted on texts, evaluated on others ----

def test_fit_linformer_signs_its_rows_and_refuses_what_it_cannot_fit(bert):
    fit, held_out = random_texts((12, 15, 13), seed=1), random_texts((15, 11), seed=2)
    fitted = fit_linformer(bert, fit, rank=4)
    for e in fitted.values():
        assert e.shape == (4, 15) and (e.sum(-1) >= 0).all()    # the solver's sign would leave some rows negative
        torch.testing.assert_close(e @ e.T, torch.eye(4), atol=1e-5, rtol=0)
    approx = Approx("linformer", rank=4, fit="fitted", projections=fitted)
    over = overs.approximation_over(bert, held_out, approx)
    assert over["cosine"].n == 2 and over["tv"].mean.isnan().all() and over["z_error"].mean.isfinite().all()
    longer = overs.approximation_over(bert, [*held_out, random_texts((20,))[0]], approx)
    assert longer["cosine"].n == 2 and "the fitted projection covers 15 tokens; this text has 20" in \
        longer["cosine"].note
    with pytest.raises(ValueError, match="rank 16 is above the 15 positions"):
        fit_linformer(bert, fit, rank=16)
    with pytest.raises(ValueError, match="at least one text"):
        fit_linformer(bert, [], rank=4)
    with pytest.raises(ValueError, match="words cannot hold"):
        approx_words(approx)
