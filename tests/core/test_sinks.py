"""Attention sinks and streaming perplexity (core/analysis/sinks.py) on tiny random models: sink scores against the
captured attention by hand, the share of heads above ε, streaming perplexity against one full or masked forward
pass, and positions="cache" against StreamingLLM written out on transformers' own modules (a cache of pre-rotation
keys, rotated at their index inside the cache every step)."""
import math

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from core import load_model
from core.analysis.sinks import sink_scores, streaming_perplexity
from tests import tiny


@pytest.fixture(scope="module")
def llama_pair():
    hf = tiny.llama()
    return load_model(tiny.save(hf), device="cpu", dtype=torch.float32), hf


@pytest.fixture(scope="module")
def llama(llama_pair):
    return llama_pair[0]


@pytest.fixture(scope="module")
def bert():
    return load_model(tiny.save(tiny.bert()), device="cpu", dtype=torch.float32)


def texts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, tiny.VOCAB, (n,), generator=gen) for n in lengths]


def by_hand(model, ids, k):
    """Per head [L, H]: token 0's attention over queries 1.., the first k's over queries k.., from captured maps."""
    maps = model(ids[None], capture_attention=True).attentions                    # L × [1, H, T, T]
    first = torch.stack([a[0, :, 1:, 0].mean(-1) for a in maps])
    first_k = torch.stack([a[0, :, k:, :k].sum(-1).mean(-1) for a in maps])
    return first, first_k


def test_sink_scores_match_captured_attention(llama):
    corpus = texts([9, 14, 20, 11, 17])  # batched together, right-padded; five, so the summary has an interval
    scores = sink_scores(llama, corpus, k=3, epsilon=0.3)
    assert scores.first.n == 5 and scores.first.mean.shape == (2, 4) and scores.sep is None
    hand = [by_hand(llama, ids, 3) for ids in corpus]
    for i, (first, first_k) in enumerate(hand):
        torch.testing.assert_close(scores.first.per_item[i], first, atol=1e-5, rtol=0)
        torch.testing.assert_close(scores.first_k.per_item[i], first_k, atol=1e-5, rtol=0)
        assert float(scores.share.per_item[i]) == pytest.approx(float((first > 0.3).float().mean()))
    torch.testing.assert_close(scores.first.mean, torch.stack([h[0] for h in hand]).mean(0), atol=1e-5, rtol=0)
    assert bool((scores.first.low <= scores.first.mean).all() and (scores.first.mean <= scores.first.high).all())


def test_share_above_epsilon_moves_with_epsilon(llama):
    corpus = texts([12, 16], seed=1)
    first = torch.stack([by_hand(llama, ids, 1)[0] for ids in corpus])         # [N, L, H]
    for epsilon in (0.0, 0.1, 0.3, 0.9):
        share = sink_scores(llama, corpus, epsilon=epsilon).share
        expected = (first > epsilon).float().mean((1, 2))
        torch.testing.assert_close(share.per_item.float(), expected)
    assert float(sink_scores(llama, corpus, epsilon=0.0).share.mean) == 1.0      # every head puts some on token 0


def test_encoder_scores_cls_and_sep_over_every_query(bert):
    corpus = texts([7, 11], seed=2)
    scores = sink_scores(bert, corpus, k=2)
    for i, ids in enumerate(corpus):
        maps = bert(ids[None], capture_attention=True).attentions
        torch.testing.assert_close(scores.first.per_item[i], torch.stack([a[0, :, :, 0].mean(-1) for a in maps]),
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(scores.sep.per_item[i], torch.stack([a[0, :, :, -1].mean(-1) for a in maps]),
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(scores.first_k.per_item[i],
                                   torch.stack([a[0, :, :, :2].sum(-1).mean(-1) for a in maps]), atol=1e-5, rtol=0)


def full_losses(model, ids, **mask):
    logits = model(ids[None], **mask).logits[0, :-1]
    return F.cross_entropy(logits, ids[1:], reduction="none")


@pytest.mark.parametrize("positions", ["text", "cache"])
def test_window_covering_the_text_is_full_attention(llama, positions):
    ids = texts([40], seed=3)[0]
    result = streaming_perplexity(llama, ids, window=40, sinks=4, positions=positions)
    expected = full_losses(llama, ids)
    torch.testing.assert_close(result.loss, expected, atol=1e-4, rtol=0)
    assert result.perplexity == pytest.approx(math.exp(float(expected.mean())), rel=1e-5)


@pytest.mark.parametrize("window,sinks", [(8, 0), (8, 1), (5, 4)])
def test_text_positions_equal_a_masked_forward(llama, window, sinks):
    ids = texts([48], seed=4)[0]
    result = streaming_perplexity(llama, ids, window, sinks, positions="text")
    expected = full_losses(llama, ids, window=window, global_tokens=sinks)
    torch.testing.assert_close(result.loss, expected, atol=1e-4, rtol=0)
    assert result.perplexity != pytest.approx(math.exp(float(full_losses(llama, ids).mean())), rel=1e-3)


def streaming_reference(hf, ids: list[int], window: int, sinks: int) -> torch.Tensor:
    """StreamingLLM written out on transformers' Llama modules: every layer caches pre-rotation keys and values of
    the tokens kept (j < sinks or j > i − window); each step rotates the kept keys at their index inside the cache
    and the query at the last index. Returns the next-token losses [T − 1]."""
    m, cfg = hf.model, hf.config
    hd = cfg.hidden_size // cfg.num_attention_heads
    keys = [dict() for _ in m.layers]
    values = [dict() for _ in m.layers]
    losses = []
    with torch.no_grad():
        for i, token in enumerate(ids[:-1]):
            kept = [j for j in range(i + 1) if j < sinks or j > i - window]
            x = m.embed_tokens(torch.tensor([[token]]))
            cos, sin = m.rotary_emb(x, torch.arange(len(kept))[None])
            for layer, block in enumerate(m.layers):
                attn, h = block.self_attn, block.input_layernorm(x)
                q = attn.q_proj(h).view(1, 1, -1, hd).transpose(1, 2)
                keys[layer][i] = attn.k_proj(h).view(1, 1, -1, hd).transpose(1, 2)
                values[layer][i] = attn.v_proj(h).view(1, 1, -1, hd).transpose(1, 2)
                k = torch.cat([keys[layer][j] for j in kept], dim=2)
                v = torch.cat([values[layer][j] for j in kept], dim=2)
                q, _ = apply_rotary_pos_emb(q, q, cos[:, -1:], sin[:, -1:])
                _, k = apply_rotary_pos_emb(k, k, cos, sin)
                groups = cfg.num_attention_heads // cfg.num_key_value_heads
                probs = (q @ repeat_kv(k, groups).transpose(-1, -2) / math.sqrt(hd)).softmax(-1)
                z = (probs @ repeat_kv(v, groups)).transpose(1, 2).reshape(1, 1, -1)
                x = x + attn.o_proj(z)
                x = x + block.mlp(block.post_attention_layernorm(x))
            logits = hf.lm_head(m.norm(x))[0, 0]
            losses.append(F.cross_entropy(logits[None], torch.tensor([ids[i + 1]])))
    return torch.stack(losses)


@pytest.mark.parametrize("window,sinks", [(8, 0), (8, 1), (6, 4)])
def test_cache_positions_equal_streamingllm_written_out(llama_pair, window, sinks):
    model, hf = llama_pair
    ids = texts([36], seed=5)[0]
    result = streaming_perplexity(model, ids, window, sinks, positions="cache")
    expected = streaming_reference(hf, ids.tolist(), window, sinks)
    torch.testing.assert_close(result.loss, expected, atol=1e-4, rtol=0)
    text = streaming_perplexity(model, ids, window, sinks, positions="text").loss
    if sinks:   # the sinks sit nearer the query in the cache than in the text: the losses differ past the fill
        assert (result.loss[window + sinks:] - text[window + sinks:]).abs().max() > 1e-3
    else:       # no sinks: RoPE sees only distances, and a window key's distance is the same in both
        torch.testing.assert_close(result.loss, text, atol=1e-4, rtol=0)


def test_refusals_in_words(llama, bert):
    ids = texts([20], seed=6)[0]
    with pytest.raises(ValueError, match="decoder-only"):
        streaming_perplexity(bert, ids, 8, 0)
    for window, sinks, words in ((0, 0, "window=0"), (8, -1, "sinks=-1"), (8.5, 0, "whole number"),
                                 (8, 20, "fewer sinks than tokens")):
        with pytest.raises(ValueError, match=words):
            streaming_perplexity(llama, ids, window, sinks)
    with pytest.raises(ValueError, match="positions="):
        streaming_perplexity(llama, ids, 8, 0, positions="rope")
    with pytest.raises(ValueError, match="one token"):
        streaming_perplexity(llama, ids[:1], 8, 0)
    with pytest.raises(ValueError, match="empty"):
        sink_scores(llama, [])
    with pytest.raises(ValueError, match="at most 2 tokens"):
        sink_scores(llama, [ids, ids[:2]], k=2)
    with pytest.raises(ValueError, match="epsilon"):
        sink_scores(llama, [ids], epsilon=1.5)


def test_learned_positions_refused_past_their_table_and_for_the_cache():
    gpt2 = load_model(tiny.save(tiny.gpt2()), device="cpu", dtype=torch.float32)
    table = gpt2.config.max_positions
    with pytest.raises(ValueError, match="cannot be renumbered"):
        streaming_perplexity(gpt2, texts([20])[0], 8, 1, positions="cache")
    with pytest.raises(ValueError, match=f"learned positions for {table} tokens"):
        streaming_perplexity(gpt2, texts([table + 1])[0], 8, 1, positions="text")
    assert streaming_perplexity(gpt2, texts([30])[0], 8, 1, positions="text").perplexity > 1


def test_widened_local_layers_equal_transformers_gemma3_with_no_window():
    """local_windows=False: Gemma 3's sliding layers read every key, with their own (local) rotation kept: equal to
    transformers' Gemma 3 on the same weights with a window wider than the text; as trained, the window changes it."""
    import copy

    from transformers import Gemma3ForCausalLM

    hf = tiny.gemma(3)
    ours = load_model(tiny.save(hf), device="cpu", dtype=torch.float32)
    ids = texts([24], seed=5)[0]                                    # 24 tokens past the tiny window of 4
    config = copy.deepcopy(hf.config)
    config.sliding_window = 1000
    wide = Gemma3ForCausalLM(config).eval()
    wide.load_state_dict(hf.state_dict())
    with torch.no_grad():
        expected = F.cross_entropy(wide(ids[None]).logits[0, :-1].float(), ids[1:], reduction="none")
    widened = streaming_perplexity(ours, ids, window=len(ids), positions="text", local_windows=False)
    torch.testing.assert_close(widened.loss, expected, atol=1e-4, rtol=0)
    trained = streaming_perplexity(ours, ids, window=len(ids), positions="text")
    torch.testing.assert_close(trained.loss, full_losses(ours, ids), atol=1e-5, rtol=0)
    assert (trained.loss - widened.loss).abs().max() > 1e-3        # the local window matters on this text
    with pytest.raises(ValueError, match="has none"):
        streaming_perplexity(load_model(tiny.save(tiny.llama()), device="cpu"), ids, 8, positions="text",
                             local_windows=False)
