"""The online softmax (core/attention.py online_softmax, online_attention, softmax_bytes; eq. 6.10): a block of keys
at a time with the running max and sum, equal to the plain softmax on random rows and on the real heads of a tiny
model of every family (their scaled, capped, biased and masked scores), with masked keys and blocks that do not
divide n; and the bytes each method holds: the formula (softmax_bytes) against the most the tensors each makes
hold at once, and its plain / online ratio against the one measured by peak RSS in fresh processes."""

from __future__ import annotations

import math
import statistics
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

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


class LiveBytes(TorchDispatchMode):
    """The most bytes held at once by the tensors the ops inside `with LiveBytes(*given):` make, the given tensors'
    storages (the inputs) not counted: a storage counts from the op that makes it until the last tensor on it is
    freed (CPython frees a tensor when its last name goes), the exact count an allocator would see."""

    def __init__(self, *given):
        super().__init__()
        self.given = {t.untyped_storage().data_ptr() for t in given}
        self.tensors, self.sizes, self.live, self.peak = {}, {}, 0, 0

    def _freed(self, key):
        self.tensors[key] -= 1
        if not self.tensors[key]:
            del self.tensors[key]
            self.live -= self.sizes.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and (key := t.untyped_storage().data_ptr()) not in self.given:
                if key not in self.tensors:
                    self.tensors[key], self.sizes[key] = 0, t.untyped_storage().nbytes()
                    self.live += self.sizes[key]
                    self.peak = max(self.peak, self.live)
                self.tensors[key] += 1
                weakref.finalize(t, self._freed, key)
        return out


@pytest.mark.parametrize("n, d_head, block", [(96, 8, 32), (100, 8, 32), (64, 16, 64), (50, 4, 7), (256, 64, 8),
                                              (40, 8, 1), (300, 16, 128)])
def test_the_formula_is_the_most_the_loop_holds(n, d_head, block):
    # blocks that divide n and do not, one block, blocks of one key, d_head above and below the block
    q, k, v = (torch.randn(n, d_head) for _ in range(3))
    with LiveBytes(q, k, v) as online:
        online_attention(q, k, v, block)
    with LiveBytes(q, k, v) as plain:
        torch.softmax((q @ k.T) * d_head ** -0.5, dim=-1) @ v                 # the textbook order, n × n held
    assert softmax_bytes(n, n, block, d_head) == {"plain": plain.peak, "online": online.peak}


def test_the_formula_at_the_measured_settings():
    # 8,192 tokens, blocks of 256, d_head 64: four [n, 256] blocks, the accumulator [n, 64] and 5 [n] vectors
    assert softmax_bytes(8192, 8192, 256, 64) == {"plain": 2 * 8192 ** 2 * 4,
                                                  "online": (4 * 8192 * 256 + 8192 * 64 + 5 * 8192) * 4}


# The measured ratio, plain / online, by each method's peak RSS in a fresh process (bench/variants/online_softmax.py,
# glibc's mmap threshold fixed at 128 KiB so that a freed tensor is handed back at once), against the formula's.
# At 2,048 tokens, block 256, d_head 64 the formula says 32 MiB against 8.5 MiB, 3.75×. The measured peaks also
# hold the output [n, d_head] (0.5 MiB in both), whole 4 KiB pages, BLAS's workspace and the small blocks the heap
# keeps: runs here gave 0.99–1.02 of the formula's ratio, so 0.85–1.15 is room for that and no more. The formula
# that counted one block of scores said 31×; glibc's moving threshold, which keeps freed blocks, gave 0.75 of it.
RATIO_RANGE = (0.85, 1.15)


@pytest.mark.slow
def test_the_measured_ratio_is_the_formulas():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from variants.online_softmax import measured
    n, block, d_head = 2048, 256, 64
    runs = measured([n], block, d_head, repeats=3, threads=1, methods=("plain", "online"), moving=())[n]
    ratio = statistics.median(runs["plain"]) / statistics.median(runs["online"])
    counted = softmax_bytes(n, n, block, d_head)
    low, high = (bound * counted["plain"] / counted["online"] for bound in RATIO_RANGE)
    assert low <= ratio <= high, (ratio, runs, counted)
