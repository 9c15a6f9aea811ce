"""The online softmax (core/attention.py online_softmax, online_attention, softmax_bytes; eq. 6.10): a block of keys
at a time with the running max and sum, equal to the plain softmax on random rows and on the real heads of a tiny
model of every family (their scaled, capped, biased and masked scores), with masked keys and blocks that do not
divide n; and the bytes each method holds, counted against the tensors' own shapes."""

from __future__ import annotations

import math

import pytest
import torch

import tiny
from core.analysis import anatomy
from core.attention import online_attention, online_softmax, softmax_bytes

NAMES = [*tiny.FAMILY_DECODERS, *tiny.FAMILY_SEQ2SEQ]


@pytest.mark.parametrize("block", [1, 3, 7, 16, 64])
def test_online_softmax_equals_softmax_on_random_rows(block):
    gen = torch.Generator().manual_seed(block)
    scores = torch.randn(37, generator=gen) * 6
    scores[[0, 1, 2, 9, 30]] = float("-inf")               # masked keys, a whole first block with block ≤ 3
    values = torch.randn(37, 5, generator=gen)
    probs, steps, out = online_softmax(scores, block, values)
    plain = torch.softmax(scores, -1)
    assert (probs - plain).abs().max() <= 1e-6
    assert (out - plain @ values).abs().max() <= 1e-5
    assert [s.start for s in steps] == list(range(0, 37, block)) and steps[-1].stop == 37
    finite = scores[torch.isfinite(scores)]
    assert steps[-1].m == pytest.approx(float(finite.max()))
    assert steps[-1].ell == pytest.approx(float(torch.exp(finite - finite.max()).sum()), rel=1e-6)
    for before, after in zip(steps, steps[1:]):               # the recurrence, step by step
        assert after.m == max(before.m, after.block_max)
        carried = 0.0 if before.m == -math.inf else math.exp(before.m - after.m)   # nothing carried yet: ℓ = 0
        assert after.rescale == pytest.approx(carried, rel=1e-6)


def test_a_row_with_no_key_is_refused():
    with pytest.raises(ValueError, match="every key of this row is masked"):
        online_softmax(torch.full((5,), float("-inf")), 2)
    with pytest.raises(ValueError, match="block must be"):
        online_softmax(torch.zeros(5), 0)


@pytest.mark.parametrize("block", [1, 5, 8, 100])
def test_online_attention_equals_attention(block):
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 21, 8, generator=gen).unbind(0)
    mask = torch.ones(21, 21, dtype=torch.bool).tril() & ~torch.ones(21, 21, dtype=torch.bool).tril(-6)  # window 6
    plain = torch.softmax((q @ k.T / math.sqrt(8)).masked_fill(~mask, float("-inf")), -1) @ v
    assert (online_attention(q, k, v, block, mask=mask) - plain).abs().max() <= 1e-6
    with pytest.raises(ValueError, match="may read no key"):
        online_attention(q, k, v, block, mask=torch.zeros(21, 21, dtype=torch.bool))


@pytest.mark.parametrize("name", NAMES)
def test_online_softmax_on_real_heads(name):
    # each family's head: scores after its scale, soft-cap and bias, under its causal and window mask
    _, model = tiny.family_pair(name)
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 13), generator=torch.Generator().manual_seed(1))
    for layer in range(len(model.attention_stack()[0].blocks)):
        stages = anatomy.forward_stages(model, ids, layer, 0)
        rows = stages.scored.masked_fill(~stages.mask, float("-inf"))
        for query in range(13):
            probs, _, out = online_softmax(rows[query], 5, stages.v)             # 5 does not divide 13
            assert (probs - stages.probs[query]).abs().max() <= 1e-6, (name, layer, query)
            assert (out - stages.z[query]).abs().max() <= 1e-5, (name, layer, query)


def test_bytes_are_the_tensors_each_method_holds():
    n, block = 96, 32
    q, k = torch.randn(2, n, 8).unbind(0)
    scores = q @ k.T
    weights = torch.softmax(scores, -1)
    held = [scores, weights]
    assert softmax_bytes(n, n, block)["plain"] == sum(t.numel() * t.element_size() for t in held)
    block_scores = q @ k[:block].T                          # [n, block], what one step of online_attention holds
    stats = [torch.zeros(n), torch.zeros(n)]                 # m and ℓ
    assert softmax_bytes(n, n, block)["online"] == sum(t.numel() * t.element_size() for t in [block_scores, *stats])
    assert softmax_bytes(8192, 8192, 128) == {"plain": 2 * 8192 ** 2 * 4, "online": (8192 * 128 + 2 * 8192) * 4}
