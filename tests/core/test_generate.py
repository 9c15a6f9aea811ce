"""Generation: the KV cache changes no number, greedy decoding equals transformers', sampling obeys its settings."""
import pytest
import torch

from core import load_model
from core.generate import Sampling, Step, filled_cache, filter_top_k, filter_top_p, greedy, next_token, step_times
from tests import tiny

# no end-of-sequence token, so that greedy runs compare all 64 tokens
DECODERS = {
    "gpt2": lambda: tiny.gpt2(eos_token_id=None),
    "llama-gqa": lambda: tiny.llama(num_key_value_heads=2, eos_token_id=None),
    "llama-mqa": lambda: tiny.llama(num_key_value_heads=1, head_dim=16, tie_word_embeddings=False, eos_token_id=None),
    "qwen2": lambda: tiny.llama("qwen2", num_key_value_heads=2, eos_token_id=None),
}
SEQ2SEQ = {"marian": lambda: tiny.marian(eos_token_id=tiny.VOCAB - 2, forced_eos_token_id=None)}


@pytest.fixture(scope="module")
def pairs():
    """name → (transformers model, our model on the same weights)"""
    made = {}
    for name, build in {**DECODERS, **SEQ2SEQ}.items():
        hf = build()
        made[name] = (hf, load_model(tiny.save(hf), device="cpu"))
    return made


def prompt(batch=1, n=7, seed=0):
    return torch.randint(3, tiny.VOCAB - 1, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(DECODERS))
@pytest.mark.parametrize("padded", [False, True])
def test_cached_logits_equal_uncached(pairs, name, padded):
    _, model = pairs[name]
    ids = prompt(batch=2, n=12)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :3] = 0
    full = model(ids, attention_mask=mask).logits
    cache = model.new_cache(2, 12)
    split = 5  # prefill 5 tokens, then decode the rest one at a time
    chunks = [(0, split)] + [(i, i + 1) for i in range(split, 12)]
    with torch.inference_mode():
        for a, b in chunks:
            hidden = model.run_stack(model.stack, ids[:, a:b], mask[:, :b], kind="self", causal=True, padding_mask=True,
                                     scale=True, positions=True, cache=cache)
            step = model.logits(hidden)
            real = mask[:, a:b].bool()
            diff = (step - full[:, a:b])[real].abs().max().item()
            assert diff <= 1e-5, f"positions {a}..{b}: cached logits differ by {diff:.3g}"


def test_cached_seq2seq_decoder_equals_uncached(pairs):
    _, model = pairs["marian"]
    src, dec = prompt(batch=2, n=9), prompt(batch=2, n=6, seed=1)
    full = model(src, decoder_input_ids=dec).logits
    cache = model.new_cache(2, 6)
    with torch.inference_mode():
        memory = model.run_stack(model.encoder, src, None, kind="encoder", causal=False, padding_mask=True, scale=True,
                                 positions=True)
        for i in range(6):
            hidden = model.run_stack(model.stack, dec[:, i:i + 1], None, kind="self", causal=True, padding_mask=True,
                                     scale=True, positions=True, cache=cache, memory=memory)
            assert (model.logits(hidden)[:, 0] - full[:, i]).abs().max() <= 1e-5
    assert all(kv is not None for kv in cache.cross), "cross-attention keys/values are cached once per layer"


@pytest.mark.parametrize("name", list(DECODERS) + ["marian"])
def test_greedy_equals_transformers_generate(pairs, name):
    hf, model = pairs[name]
    ids = prompt(n=6, seed=3)
    ours = model.generate(ids, 64)
    with torch.no_grad():
        ref = hf.generate(ids, max_new_tokens=64, do_sample=False, num_beams=1)
    assert ours.shape[1] == (1 if name in SEQ2SEQ else ids.shape[1]) + 64
    assert torch.equal(ours, ref), f"\nours {ours.tolist()}\nref  {ref.tolist()}"


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_greedy_left_padded_batch_equals_transformers(pairs, name):
    hf, model = pairs[name]
    ids = prompt(batch=2, n=8, seed=4)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    ids[0, :3] = 0
    ours = model.generate(ids, 24, attention_mask=mask)
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=2)
    width = min(ours.shape[1], ref.shape[1])
    assert torch.equal(ours[:, :width], ref[:, :width])


def test_stream_yields_what_generate_returns(pairs):
    _, model = pairs["llama-gqa"]
    ids = prompt()
    streamed = list(model.stream(ids, 20))
    assert all(isinstance(s, Step) and isinstance(s.token, int) for s in streamed)
    assert all(s.rows is None and s.top_probs is None for s in streamed), "only what was asked for is filled"
    assert [s.token for s in streamed] == model.generate(ids, 20)[0, ids.shape[1]:].tolist()


def test_stream_of_a_batch_yields_batched_steps(pairs):
    _, model = pairs["llama-gqa"]
    ids = prompt(batch=2)
    streamed = list(model.stream(ids, 6, top_probs=3))
    assert all(s.token.shape == (2,) and s.top_probs.shape == (2, 3) for s in streamed)
    assert torch.equal(torch.stack([s.token for s in streamed], 1), model.generate(ids, 6)[:, ids.shape[1]:])


def test_stream_captures_each_tokens_attention_row(pairs):
    _, model = pairs["llama-gqa"]
    ids = prompt()
    steps = list(model.stream(ids, 5, capture_attention=True))
    tokens = [s.token for s in steps]
    for i, step in enumerate(steps):
        context = ids.shape[1] + i
        assert step.rows.shape == (model.config.n_layers, model.config.n_heads, context)
        torch.testing.assert_close(step.rows.float().sum(-1), torch.ones(step.rows.shape[:2]), atol=2e-3, rtol=0)
    # the row that produced the last token equals the last row of a full forward's attention
    full = torch.cat([ids, torch.tensor([tokens[:-1]])], dim=1)
    reference = torch.stack(model(full, capture_attention=True).attentions)[:, 0, :, -1]
    torch.testing.assert_close(steps[-1].rows.float(), reference, atol=1e-3, rtol=0)


def test_stream_of_seq2seq_gives_cross_rows_and_probabilities(pairs):
    _, model = pairs["marian"]
    src = prompt(n=9)
    steps = list(model.stream(src, 4, capture_attention=True, top_probs=5))
    for i, step in enumerate(steps):
        assert step.rows.shape == (model.config.n_layers, model.config.n_heads, 1 + i)
        assert step.cross_rows.shape == (model.config.n_layers, model.config.n_heads, 9)
        assert step.top_ids.shape == (5,) and int(step.top_ids[0]) == step.token  # greedy picks the top one
        assert int(step.chosen_rank) == 1 and abs(float(step.chosen_prob) - float(step.top_probs[0])) < 1e-6


def test_seeded_sampling_repeats_exactly(pairs):
    _, model = pairs["gpt2"]
    ids = prompt()
    kw = dict(temperature=1.3, top_k=20, top_p=0.95, seed=1234)
    a, b = model.generate(ids, 30, **kw), model.generate(ids, 30, **kw)
    assert torch.equal(a, b)
    others = [model.generate(ids, 30, **{**kw, "seed": s}) for s in (1, 2, 3)]
    assert any(not torch.equal(a, o) for o in others), "different seeds should give different samples"


def test_top_k_never_leaves_its_set():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    allowed = torch.topk(logits, 5).indices
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        token = next_token(logits, Sampling(temperature=2.0, top_k=5), None, gen)
        assert all(token[b] in allowed[b] for b in range(4))


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.06, 0.04]])
    kept = torch.isfinite(filter_top_p(probs.log(), 0.8))
    assert kept.tolist() == [[True, True, True, False, False]]  # 0.5 + 0.25 < 0.8 ≤ 0.5 + 0.25 + 0.15
    assert torch.isfinite(filter_top_p(probs.log(), 0.01)).sum() == 1
    gen = torch.Generator().manual_seed(2)
    for _ in range(300):
        token = next_token(probs.log(), Sampling(temperature=1.0, top_p=0.8), None, gen)
        assert token.item() in (0, 1, 2)
    assert torch.isfinite(filter_top_k(probs.log(), 2)).sum() == 2


def test_repetition_penalty_discourages_seen_tokens():
    logits = torch.tensor([[2.0, 1.9, -1.0]])
    seen = torch.tensor([[True, False, True]])
    assert next_token(logits, Sampling(repetition_penalty=1.0), seen, None).item() == 0
    assert next_token(logits, Sampling(repetition_penalty=1.2), seen, None).item() == 1


def test_stop_string_and_budget(pairs):
    _, model = pairs["gpt2"]

    class Digits:  # a stand-in tokenizer: token id i decodes to "<i>"
        def decode(self, ids):
            return "".join(f"<{int(i)}>" for i in ids)

    model.tokenizer = Digits()
    ids = prompt()
    free = model.generate(ids, 12)[0, ids.shape[1]:].tolist()
    stop_at = free[3]
    stopped = model.generate(ids, 12, stop=f"<{stop_at}>")[0, ids.shape[1]:].tolist()
    assert stopped == free[:free.index(stop_at) + 1]
    model.tokenizer = None
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        model.generate(ids, 3, stop="x")
    # learned positions end at max_positions: the budget shrinks, it does not crash
    long = torch.randint(3, 90, (1, model.config.max_positions - 2))
    assert model.generate(long, 10).shape[1] <= model.config.max_positions
    with pytest.raises(ValueError, match="only 128 positions"):
        model.generate(torch.randint(3, 90, (1, 130)), 1)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_k=0), dict(top_p=1.5), dict(repetition_penalty=0)])
def test_bad_sampling_settings_are_named(pairs, bad):
    _, model = pairs["gpt2"]
    with pytest.raises(ValueError, match=next(iter(bad))):
        model.generate(prompt(), 3, **bad)


def test_compile_falls_back_cleanly_when_the_compiler_fails(pairs, monkeypatch):
    _, model = pairs["llama-gqa"]
    ids = prompt()
    expected = model.generate(ids, 12)

    def broken_compile(fn, **kw):
        def fails(*args, **kwargs):
            raise RuntimeError("no compiler here")
        return fails

    monkeypatch.setattr(torch, "compile", broken_compile)
    model.decoding.step = None
    with pytest.warns(UserWarning, match="compiled decode step failed .*no compiler here"):
        assert torch.equal(model.generate(ids, 12, compile=True), expected)


def test_compiled_decode_step_gives_the_same_tokens(pairs):
    """The real compiler (inductor's C++ back end on a CPU): one compile, then other prompt lengths reuse it."""
    _, model = pairs["gpt2"]
    model.decoding.step = None
    for n in (6, 11):
        ids = prompt(batch=2, n=n, seed=n)
        mask = torch.ones_like(ids)
        mask[1, :2] = 0  # left padding goes through the static step's mask
        expected = model.generate(ids, 10, attention_mask=mask)
        assert torch.equal(model.generate(ids, 10, attention_mask=mask, compile=True), expected)
    assert model.decoding.cache.max_len == 256, "the kept cache's length is rounded up to a multiple of 256"


# ---- the KV panel's seams: greedy with and without the cache, the cache's bytes, the time of a step ----

@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "llama-mqa", "marian"])
def test_greedy_gives_the_same_tokens_with_and_without_the_cache(pairs, name):
    _, model = pairs[name]
    seq2seq = name in SEQ2SEQ
    ids = prompt(n=8, seed=5)[0].tolist()
    source, decoder = (ids, [model.config.decoder_start_token_id]) if seq2seq else (None, ids)
    cached, cached_seconds = greedy(model, decoder, 12, cached=True, source_ids=source)
    uncached, uncached_seconds = greedy(model, decoder, 12, cached=False, source_ids=source)
    assert cached == uncached and len(cached) == 12
    assert len(cached_seconds) == len(uncached_seconds) == 12 and min(cached_seconds + uncached_seconds) > 0
    expected = model.generate(torch.tensor([ids]), 12)[0, 1 if seq2seq else len(ids):].tolist()
    assert cached == expected


@pytest.mark.parametrize("name", ["llama-gqa", "marian"])
def test_greedy_stops_after_an_end_of_sequence_token(pairs, name, monkeypatch):
    _, model = pairs[name]
    ids = prompt(n=6, seed=6)[0].tolist()
    source, decoder = (ids, [model.config.decoder_start_token_id]) if name in SEQ2SEQ else (None, ids)
    free, _ = greedy(model, decoder, 12, cached=True, source_ids=source)
    monkeypatch.setattr(model.config, "eos_token_id", free[4])  # the fifth token now ends the text
    for cached in (True, False):
        tokens, seconds = greedy(model, decoder, 12, cached=cached, source_ids=source)
        assert tokens == free[:free.index(free[4]) + 1] and len(seconds) == len(tokens)


def test_greedy_reads_the_clock_it_is_given(pairs):
    _, model = pairs["gpt2"]
    ticks = iter(range(100))
    _, seconds = greedy(model, [5, 6, 7], 4, cached=True, clock=lambda: float(next(ticks)))
    assert seconds == [1.0] * 4


@pytest.mark.parametrize("name", ["llama-gqa", "llama-mqa", "marian"])
def test_filled_cache_takes_what_the_formula_says(pairs, name):
    _, model = pairs[name]
    cfg = model.config
    source = prompt(n=9)[0].tolist() if name in SEQ2SEQ else None
    decoder = [cfg.decoder_start_token_id] + [7, 8] if source else prompt(n=11)[0].tolist()
    cache = filled_cache(model, decoder, source_ids=source)
    bytes_per = cache.keys[0].element_size()
    size = lambda tokens: 2 * cfg.n_layers * tokens * cfg.n_kv_heads * cfg.head_dim * bytes_per  # noqa: E731
    assert cache.length == len(decoder)
    assert cache.nbytes == size(len(decoder)) + (size(len(source)) if source else 0)
    assert all((kv is not None) == bool(source) for kv in cache.cross)


@pytest.mark.parametrize("name", ["llama-gqa", "marian"])
def test_step_times_gives_one_pass_and_repeats_steps(pairs, name):
    _, model = pairs[name]
    source = prompt(n=9)[0].tolist() if name in SEQ2SEQ else None
    uncached, cached = step_times(model, prompt(n=20)[0].tolist(), 3, source_ids=source)
    assert uncached > 0 and len(cached) == 3 and all(s > 0 for s in cached)


def test_source_ids_are_asked_for_where_they_belong(pairs):
    with pytest.raises(ValueError, match="needs source_ids"):
        greedy(pairs["marian"][1], [tiny.VOCAB - 1], 2, cached=True)
    with pytest.raises(ValueError, match="decoder-only"):
        filled_cache(pairs["gpt2"][1], [5, 6], source_ids=[7, 8])
    assert filled_cache(pairs["gpt2"][1], [5, 6], source_ids=[]).length == 2  # an empty source is no source
