"""The rolling KV cache (core/kv_cache.py RollingKVCache, core/generate.py greedy_rolling): windowed layers keep a
ring of sinks + window entries, and greedy generation is the same, token by token, as with the full cache that
masks the old keys. Tiny random configs (Mistral: every layer windowed; Gemma 3: local and global layers with
their own RoPE bases; Llama with a window and sinks given), and Gemma 3 270M when the store has it."""
import pytest
import torch

from core import load_model
from core.generate import feed_rolling, greedy, greedy_rolling, prefill, decode_step, one_sequence, rolling_cache, \
    rolling_decode_step
from core.kv_cache import RollingKVCache
from core.store import WeightsUnavailable, ensure
from core.store.registry import REPO_ROOT
from tests import tiny

WINDOW = 16
PROMPT = list(range(3, 13))           # 10 tokens
PAST = 200                            # generated tokens past the window


def load(hf):
    return load_model(tiny.save(hf), device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def mistral():
    return load(tiny.mistral(sliding_window=WINDOW, max_position_embeddings=512))


def lockstep(model, ids: list[int], n_new: int, window=None, sinks=0):
    """Greedy with the full cache and with the rolling one side by side: (tokens, largest |Δ logits| per step)."""
    full = model.new_cache(1, len(ids) + n_new)
    ring = rolling_cache(model, 1, len(ids) + n_new, window, sinks)
    tokens, deltas = [], []
    with torch.inference_mode():
        full_logits = prefill(model, one_sequence(ids, model.device), None, full)
        ring_logits = feed_rolling(model, ids, ring)
        for i in range(n_new):
            if i:
                step = one_sequence(tokens[-1:], model.device)
                full_logits = decode_step(model, step, full)
                ring_logits = rolling_decode_step(model, step, ring)
                full.advance(1)
                ring.advance(1)
            deltas.append((full_logits - ring_logits).abs().max().item())
            assert int(full_logits.argmax()) == int(ring_logits.argmax()), f"step {i}: the tokens part"
            tokens.append(int(full_logits.argmax()))
    return tokens, deltas, full, ring


def test_mistral_rolling_cache_generates_the_full_caches_tokens_200_past_the_window(mistral):
    n_new = WINDOW - len(PROMPT) + PAST
    tokens, deltas, full, ring = lockstep(mistral, PROMPT, n_new)
    assert max(deltas) <= 1e-4
    assert ring.length == full.length == len(PROMPT) + n_new - 1 > WINDOW + PAST - 2   # the ring wrapped ~13 times
    assert greedy_rolling(mistral, PROMPT, n_new) == tokens   # the public loop, eos handling included
    assert all(k.shape[2] == WINDOW for k in ring.keys)                                  # every Mistral layer rolls
    assert ring.nbytes * (len(PROMPT) + n_new) == full.nbytes * WINDOW


def test_the_window_matters_so_the_check_can_fail(mistral):
    """The same weights without their window generate other tokens: equality above is not a given."""
    unwindowed = load(tiny.mistral(sliding_window=None, max_position_embeddings=512))
    unwindowed.load_state_dict(mistral.state_dict())
    n_new = WINDOW + 40
    assert greedy(unwindowed, PROMPT, n_new, cached=True)[0] != greedy_rolling(mistral, PROMPT, n_new)


def test_a_long_prompt_is_prefilled_and_taken_over_by_the_ring():
    """A prompt of 5 windows: one prefill into a full cache, whose last window the ring takes over."""
    model = load(tiny.mistral(sliding_window=8, max_position_embeddings=512))
    prompt = [(7 * i) % 90 + 3 for i in range(40)]
    tokens, deltas, *_ = lockstep(model, prompt, 30)
    assert max(deltas) <= 1e-4


def test_sinks_on_a_long_prompt_equal_the_masked_forward_whichever_way_the_prompt_is_read():
    """Past the window with sinks: a model without a window prefills under forward's window + sinks mask; Mistral's
    own sliding layers cannot draw that mask, so its prompt is read token by token through the ring. Both equal
    the reference of every step's forward(window, global_tokens) on a model without a window of its own."""
    llama = load(tiny.mistral(sliding_window=None, max_position_embeddings=512))   # no window of its own
    mistral_like = load(tiny.mistral(sliding_window=12, max_position_embeddings=512))
    mistral_like.load_state_dict(llama.state_dict())
    prompt = [(5 * i) % 90 + 3 for i in range(30)]
    expected = list(prompt)
    with torch.inference_mode():
        for _ in range(20):
            logits = llama(one_sequence(expected, "cpu"), window=12, global_tokens=3).logits[0, -1]
            expected.append(int(logits.argmax()))
    assert greedy_rolling(llama, prompt, 20, window=12, sinks=3) == expected[len(prompt):]
    assert greedy_rolling(mistral_like, prompt, 20, sinks=3) == expected[len(prompt):]


def test_gemma3_local_layers_roll_and_global_layers_keep_every_token():
    model = load(tiny.gemma(3, sliding_window=6, max_position_embeddings=512))
    tokens, deltas, full, ring = lockstep(model, PROMPT, 80)   # 84 past the local window
    assert max(deltas) <= 1e-4
    kinds = model.config.layer_types
    assert "full" in kinds and "sliding" in kinds
    assert [k.shape[2] for k in ring.keys] == [6 if t == "sliding" else full.max_len for t in kinds]


def test_sinks_and_a_window_given_to_a_model_without_one_equal_the_masked_forward():
    """Llama has no window; rolling every layer over w tokens + s sinks reads exactly what forward(window=w,
    global_tokens=s) lets a query read (StreamingLLM's cache with positions kept as in the text)."""
    model = load(tiny.llama(max_position_embeddings=512))
    window, sinks, n_new = 12, 4, 60
    expected = list(PROMPT)
    with torch.inference_mode():
        for _ in range(n_new):
            logits = model(one_sequence(expected, "cpu"), window=window, global_tokens=sinks).logits[0, -1]
            expected.append(int(logits.argmax()))
    assert greedy_rolling(model, PROMPT, n_new, window=window, sinks=sinks) == expected[len(PROMPT):]
    assert greedy_rolling(model, PROMPT, n_new, window=window) != expected[len(PROMPT):]   # the sinks matter here


def test_ring_entries_hold_the_positions_the_window_needs():
    cache = RollingKVCache(1, 1, 1, 64, 2, torch.float32, "cpu", (True,), window=5, sinks=2)
    for position, expected_entry in [(0, 0), (1, 1), (2, 2), (6, 6), (7, 2), (13, 3)]:
        assert int(cache.ring_index(torch.tensor([position]))) == expected_entry
    cache.slot.fill_(13)   # query 13 reads sinks 0, 1 and positions 9..13
    assert cache.ring_allowed()[0, 0, 0].tolist() == [True] * 7
    cache.slot.fill_(3)    # entries 0..3 hold positions 0..3; entries 4..6 are empty yet
    assert cache.ring_allowed()[0, 0, 0].tolist() == [True] * 4 + [False] * 3


def test_bad_requests_are_refused_in_words(mistral):
    with pytest.raises(ValueError, match="have their own window of 16 tokens; pass window=None or 16, not 8"):
        rolling_cache(mistral, 1, 64, window=8)
    with pytest.raises(ValueError, match="has no sliding-window layers: give window=w"):
        rolling_cache(load(tiny.llama()), 1, 64)
    with pytest.raises(ValueError, match=r"window=0, sinks=0: the window needs w ≥ 1"):
        rolling_cache(load(tiny.llama()), 1, 64, window=0)
    with pytest.raises(ValueError, match="adds a position bias to the scores"):
        rolling_cache(load(tiny.bloom()), 1, 64, window=8)
    with pytest.raises(ValueError, match="decoder-only causal models"):
        rolling_cache(load(tiny.t5()), 1, 64, window=8)
    with pytest.raises(ValueError, match="decoder_ids is empty"):
        greedy_rolling(mistral, [], 4)
    cache = rolling_cache(mistral, 1, 64)
    with pytest.raises(ValueError, match="takes a prompt chunk only while it fits its window"):
        prefill(mistral, one_sequence(list(range(3, 3 + WINDOW + 1)), "cpu"), None, cache)


@pytest.mark.real_weights
@pytest.mark.slow
def test_gemma3_270m_rolling_cache_equals_the_full_cache_past_its_512_window():
    """A 690-token prompt (prefilled, its last 512 positions taken over by the ring) and 24 greedy tokens, to
    position 714: 202 past the window; the logits of every generated step compared."""
    try:
        model = load_model(ensure("gemma-3-270m"), device="cpu", dtype=torch.float32)
    except WeightsUnavailable as error:
        pytest.skip(f"gemma-3-270m: no weight source reachable:\n{error}")
    ids = model.tokenizer((REPO_ROOT / "core" / "model.py").read_text())["input_ids"][:690]
    tokens, deltas, full, ring = lockstep(model, ids, 24)
    print(f"Gemma 3 270M rolling cache: max |Δ logits| {max(deltas):.3g} over 24 steps; "
          f"{ring.nbytes / 2**20:.1f} MiB against {full.nbytes / 2**20:.1f} MiB")
    assert max(deltas) <= 1e-3 and len(ids) + 24 - 512 >= PAST
    assert sum(k.shape[2] == 512 for k in ring.keys) == 15
