"""Approximations of attention (core/approx.py) as one switch of the forward pass: each method checked against its
definition, against exact attention where it must equal it, and on every tiny family it applies to; the families
it cannot apply to refuse in words."""
from __future__ import annotations

import copy

import pytest
import torch

from core.approx import (Approx, approximate, bigbird_blocks, bigbird_blocks_pattern, bigbird_mask, favor_features,
                         fit_linformer, linformer_projection, seed_for)
from core.attention import attention
from tests import tiny

ALL_FAMILIES = [*tiny.FAMILY_DECODERS, *tiny.FAMILY_SEQ2SEQ]


def qkv(batch=2, heads=6, kv_heads=2, n=45, d=16, seed=0, size=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, n, d, generator=gen) * size, torch.randn(batch, kv_heads, n, d, generator=gen) * size,
            torch.randn(batch, kv_heads, n, d, generator=gen))


def padding_mask(n: int) -> torch.Tensor:
    """[2, 1, n, n]: the second text's last 5 keys padded."""
    real = torch.ones(2, n, dtype=torch.bool)
    real[1, -5:] = False
    return real[:, None, None, :].expand(2, 1, n, n)


# ---- top-k ----

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_topk_keeping_every_visible_key_is_exact_attention(causal, padded):
    q, k, v = qkv()
    allowed = padding_mask(45) if padded else None
    exact, exact_probs = attention(q, k, v, allowed, causal, return_probs=True)
    out, probs = approximate(q, k, v, Approx("topk", k=45), 0, allowed, causal, return_probs=True)
    torch.testing.assert_close(out, exact, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs, exact_probs, atol=1e-6, rtol=1e-5)


def test_topk_keeps_the_k_highest_scores_of_each_row():
    q, k, v = qkv(heads=2, kv_heads=2)
    _, probs = approximate(q, k, v, Approx("topk", k=5), 0, None, True, return_probs=True)
    scores = (q @ k.transpose(-1, -2)) * 16 ** -0.5
    scores = scores.masked_fill(~torch.ones(45, 45, dtype=torch.bool).tril(), float("-inf"))
    top = scores.topk(5, dim=-1).indices
    kept = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, top, True) & (scores > float("-inf"))
    assert torch.equal(probs > 0, kept)
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))


# ---- BigBird ----

def hand_pattern(n: int, block: int, global_blocks: int) -> torch.Tensor:
    """BigBird without random blocks, by its definition, place by place."""
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            bi, bj = i // block, j // block
            allowed[i, j] = abs(bi - bj) <= 1 or bj < global_blocks or bi < global_blocks
    return allowed


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("global_blocks", [0, 1, 2])
def test_bigbird_without_random_blocks_is_attention_under_a_mask_of_its_block_pattern(causal, global_blocks):
    q, k, v = qkv()
    pattern = hand_pattern(45, 7, global_blocks)
    if causal:
        pattern &= torch.ones(45, 45, dtype=torch.bool).tril()
    assert torch.equal(bigbird_mask(45, 45, 7, global_blocks, 0, 0, causal), pattern)
    exact = attention(q, k, v, pattern)[0]
    approx = Approx("bigbird", block=7, global_blocks=global_blocks, random_blocks=0)
    fast = approximate(q, k, v, approx, 0, None, causal)[0]                     # the block-gathering path
    explicit, probs = approximate(q, k, v, approx, 0, None, causal, return_probs=True)
    torch.testing.assert_close(fast, exact, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit, exact, atol=1e-5, rtol=1e-5)
    assert not (probs[..., ~pattern] > 0).any()


@pytest.mark.parametrize("causal", [False, True])
def test_bigbird_random_blocks_are_seeded_outside_the_window_and_the_fast_path_reads_exactly_them(causal):
    n_blocks = 9
    pattern = bigbird_blocks_pattern(n_blocks, 1, 2, seed=3, causal=causal)
    assert torch.equal(pattern, bigbird_blocks_pattern(n_blocks, 1, 2, seed=3, causal=causal))
    base = bigbird_blocks_pattern(n_blocks, 1, 0, seed=3, causal=causal)
    extra = pattern & ~base
    assert torch.equal(extra[1:].sum(-1), torch.tensor([min(2, max(0, i - 2)) if causal else 2 for i in range(1, 9)]))
    if causal:
        assert not torch.triu(pattern, 1).any()
    q, k, v = qkv(n=9 * 5)
    fast = bigbird_blocks(q, k, v, pattern, 5, causal, 16 ** -0.5)
    mask = bigbird_mask(45, 45, 5, 1, 2, 3, causal)
    torch.testing.assert_close(fast, attention(q, k, v, mask)[0], atol=1e-5, rtol=1e-5)


# ---- Performer ----

def test_performer_features_are_unbiased_for_exp_qk_at_many_features():
    """E[φ(q)·φ(k)] = exp(q·k·scale): over 64 seeds of 1,024 features, the mean estimate lies within 4 standard
    errors of the truth at every pair, and those errors are under 1.5% of it (so the check could see a bias of 6%)."""
    q, k, _ = qkv(batch=1, heads=1, kv_heads=1, n=6, size=0.5)
    scale = 16 ** -0.5
    truth = ((q @ k.transpose(-1, -2)) * scale).exp()
    draws = []
    for seed in range(64):
        q_f, k_f = favor_features(q, k, scale, 1024, seed, stabilise=False)
        draws.append(q_f @ k_f.transpose(-1, -2))
    draws = torch.stack(draws)
    mean, standard_error = draws.mean(0), draws.std(0) / 64 ** 0.5
    assert (standard_error / truth).max() < 0.015
    assert ((mean - truth).abs() <= 4 * standard_error).all()


@pytest.mark.parametrize("causal", [False, True])
def test_performer_error_falls_as_the_features_grow(causal):
    q, k, v = qkv(size=0.7)
    exact = attention(q, k, v, None, causal)[0]

    def error(features):
        outs = [approximate(q, k, v, Approx("performer", features=features, seed=s), 0, None, causal)[0]
                for s in range(4)]
        return sum(float((o - exact).norm() / exact.norm()) for o in outs) / len(outs)

    errors = [error(m) for m in (16, 128, 2048)]
    assert errors[0] > errors[1] > errors[2]


@pytest.mark.parametrize("causal", [False, True])
def test_performer_linear_path_equals_its_own_weights(causal):
    """The prefix sums (causal) and φ(K)ᵀV (bidirectional) give what the explicit weights φ(q)·φ(k) give."""
    q, k, v = qkv(n=300)
    approx = Approx("performer", features=32, seed=1)
    fast = approximate(q, k, v, approx, 0, None, causal)[0]
    explicit, probs = approximate(q, k, v, approx, 0, None, causal, return_probs=True)
    torch.testing.assert_close(fast, explicit, atol=1e-4, rtol=1e-4)
    assert (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
    if causal:
        assert not probs.triu(1).any()


def test_performer_reads_every_earlier_key_when_the_queries_are_the_last_of_the_keys():
    q, k, v = qkv(n=40)
    approx = Approx("performer", features=64, seed=2)
    whole = approximate(q, k, v, approx, 0, None, True)[0]
    last = approximate(q[:, :, -3:], k, v, approx, 0, None, True)[0]
    torch.testing.assert_close(last, whole[:, :, -3:], atol=1e-4, rtol=1e-4)


# ---- Linformer ----

def test_linformer_projects_the_keys_along_the_sequence():
    q, k, v = qkv()
    e = linformer_projection(8, 45, seed_for(0, 2))
    assert e.shape == (8, 45)
    out, probs = approximate(q, k, v, Approx("linformer", rank=8), 2, None, False)
    assert out.shape == q.shape and probs is None
    torch.testing.assert_close(out, attention(q, e @ k, e @ v)[0], atol=1e-5, rtol=1e-5)


def test_linformer_refuses_a_causal_model_in_words():
    _, model = tiny.family_pair("mistral-window")
    with pytest.raises(ValueError, match="causal model would read its future"):
        model(torch.arange(10)[None], approx=Approx("linformer", rank=4))


def test_linformer_runs_on_an_encoder_and_its_fitted_projection_is_orthonormal():
    model = load_tiny(tiny.bert())
    texts = [torch.randint(5, 90, (n,)) for n in (11, 13, 9)]
    fitted = fit_linformer(model, texts, rank=4)
    assert set(fitted) == set(range(model.config.n_layers))
    for e in fitted.values():
        assert e.shape == (4, 13)
        torch.testing.assert_close(e @ e.T, torch.eye(4), atol=1e-5, rtol=0)
    ids = texts[1][None]
    for approx in (Approx("linformer", rank=4), Approx("linformer", rank=4, fit="fitted", projections=fitted)):
        hidden = model(ids, approx=approx).hidden_states
        assert hidden.shape == model(ids).hidden_states.shape and torch.isfinite(hidden).all()
    with pytest.raises(ValueError, match="covers 13 tokens"):
        model(torch.randint(5, 90, (1, 20)), approx=Approx("linformer", rank=4, fit="fitted", projections=fitted))


# ---- low-rank KV ----

@pytest.mark.parametrize("family", ["mistral-window", "gemma3", "gpt_neox-parallel"])
def test_lowrank_kv_at_full_rank_is_exact_and_at_rank_r_is_the_model_with_its_weights_truncated(family):
    _, model = tiny.family_pair(family)
    cfg = model.config
    ids = torch.randint(0, 90, (1, 13))
    exact = model(ids).logits
    full = min(2 * cfg.n_kv_heads * cfg.head_dim, cfg.d_model)
    torch.testing.assert_close(model(ids, approx=Approx("lowrank_kv", rank=full)).logits, exact, atol=1e-4, rtol=1e-4)
    rank = 5
    truncated = copy.deepcopy(model)
    with torch.no_grad():
        for block in truncated.stack.blocks:
            attn = block.attn
            u, s, vh = torch.linalg.svd(attn.kv_weight().double(), full_matrices=False)
            attn.qkv.weight[attn.n_heads * attn.head_dim:] = (u[:, :rank] * s[:rank] @ vh[:rank]).float()
    torch.testing.assert_close(model(ids, approx=Approx("lowrank_kv", rank=rank)).logits, truncated(ids).logits,
                               atol=1e-4, rtol=1e-4)
    assert not torch.allclose(truncated(ids).logits, exact, atol=1e-3)


def test_lowrank_kv_caches_rank_numbers_per_token_per_layer():
    _, model = tiny.family_pair("mistral-window")
    cfg = model.config
    exact = 2 * cfg.n_kv_heads * cfg.head_dim
    approx = Approx("lowrank_kv", rank=6, layers=[1])
    assert approx.cache_bytes_per_token(cfg, 2) == 2 * ((cfg.n_layers - 1) * exact + 6)


# ---- the switch on every family ----

def load_tiny(hf_model):
    from core import load_model
    return load_model(tiny.save(hf_model), device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_every_method_runs_or_refuses_in_words_on_every_family(family):
    _, model = tiny.family_pair(family)
    cfg = model.attention_stack()[0].cfg
    ids = torch.randint(0, 90, (1, 13))
    exact = model(ids).logits
    torch.testing.assert_close(model(ids, approx=Approx("topk", k=13)).logits, exact, atol=1e-4, rtol=1e-4)
    shadowed = model(ids, approx=Approx("bigbird", block=2, random_blocks=1, shadow=True))
    torch.testing.assert_close(shadowed.logits, exact, atol=1e-4, rtol=1e-4)   # shadow keeps exact attention's output
    assert set(shadowed.approx_errors) == set(range(cfg.n_layers))
    for method, budget in (("performer", {"features": 32}), ("linformer", {"rank": 4}), ("lowrank_kv", {"rank": 4})):
        refuses = (method in ("performer", "linformer") and (cfg.attn_softcap is not None or cfg.score_bias != "none"
                                                              or cfg.attention_sinks)) \
            or (method == "linformer" and cfg.causal)
        if refuses:
            with pytest.raises(ValueError, match=method):
                model(ids, approx=Approx(method, **budget))
        else:
            logits = model(ids, approx=Approx(method, **budget)).logits
            assert torch.isfinite(logits).all() and not torch.allclose(logits, exact, atol=1e-4)


def test_chosen_heads_change_and_the_others_keep_exact_attention():
    _, model = tiny.family_pair("qwen3")
    ids = torch.randint(0, 90, (1, 13))
    exact = model(ids, record=("z",)).records["z"]
    approx = model(ids, record=("z",), approx=Approx("topk", k=2, layers=[1], heads=[2])).records["z"]  # [B, T, H, d]
    torch.testing.assert_close(approx[0], exact[0])
    torch.testing.assert_close(approx[1][:, :, [0, 1, 3]], exact[1][:, :, [0, 1, 3]])
    assert not torch.allclose(approx[1][:, :, 2], exact[1][:, :, 2])
    out = model(ids, approx=Approx("topk", k=2, layers=[1], heads=[2], shadow=True))
    tv, z = out.approx_errors[1]
    assert tv[0, [0, 1, 3]].abs().max() < 1e-6 and tv[0, 2] > 0.01 and z[0, 2] > 0.01


def test_the_captured_pattern_is_the_approximation_s_own():
    _, model = tiny.family_pair("qwen3")
    maps = model(torch.randint(0, 90, (1, 13)), capture_attention=True, approx=Approx("topk", k=3)).attentions
    assert all(((m > 0).sum(-1) <= 3).all() for m in maps)


@pytest.mark.parametrize("make, words", [
    (lambda: Approx("dense"), "unknown approximation"),
    (lambda: Approx("topk", rank=3), "topk takes k"),
    (lambda: Approx("topk", k=0), "k must be a whole number"),
    (lambda: Approx("bigbird", block=2.5), "block must be a whole number"),
    (lambda: Approx("linformer", rank=4, fit="learned"), "fit must be"),
    (lambda: Approx("linformer", rank=4, fit="fitted"), "needs its projections"),
    (lambda: Approx("lowrank_kv", rank=4, heads=[0]), "takes no heads"),
])
def test_bad_budgets_are_refused_in_words(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def test_what_a_model_cannot_take_is_refused_in_words():
    _, model = tiny.family_pair("bloom")
    ids = torch.randint(0, 90, (1, 9))
    with pytest.raises(ValueError, match="performer estimates exp"):
        model(ids, approx=Approx("performer"))
    with pytest.raises(ValueError, match="layer 7 is out of range"):
        model(ids, approx=Approx("topk", layers=[7]))
    with pytest.raises(ValueError, match="head 9 is out of range"):
        model(ids, approx=Approx("topk", heads=[9]))
    with pytest.raises(ValueError, match="above .* full rank"):
        model(ids, approx=Approx("lowrank_kv", rank=10_000))
    bert = load_tiny(tiny.bert())
    with pytest.raises(ValueError, match="no attention pattern"):
        bert(torch.randint(5, 90, (1, 9)), capture_attention=True, approx=Approx("linformer", rank=4))
