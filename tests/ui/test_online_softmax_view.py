"""The online softmax beside the Inside walk (ui/services/inside.py online_row, ui/plots/online.py): on a tiny model
of every family, the followed row read a block at a time equals the pass's own weights and output, the steps are
the recurrence of eq. 6.10, the bytes rows are the formula, and the figure draws the steps and both softmaxes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny
from ui.plots.online import online_softmax_figure
from ui.services import inside as service
from ui.services.checks import UserError
from ui.services.text import Encoded

NAMES = [*tiny.FAMILY_DECODERS, *tiny.FAMILY_SEQ2SEQ]
N = 13


def encoded() -> Encoded:
    ids = torch.randint(3, tiny.VOCAB - 1, (N,), generator=torch.Generator().manual_seed(0)).tolist()
    return Encoded(ids, [f"{i} t" for i in range(N)], [False] * N)


@pytest.mark.parametrize("name", NAMES)
def test_the_row_read_online_is_the_passes_own(name):
    _, model = tiny.family_pair(name)
    layers = len(model.attention_stack()[0].blocks)
    row = service.online_row(model, encoded(), layers - 1, 0, 6, 4)         # 4 does not divide 13
    assert row.probs_difference <= 1e-6 and row.output_difference <= 1e-5
    assert list(row.starts) == [0, 4, 8, 12] and list(row.stops) == [4, 8, 12, 13]
    np.testing.assert_allclose(row.online.sum(), 1.0, atol=1e-9)
    finite = row.scores[np.isfinite(row.scores)]
    assert row.running_max[-1] == pytest.approx(finite.max())
    assert row.running_sum[-1] == pytest.approx(np.exp(finite - finite.max()).sum())
    assert np.all(np.diff(row.running_max[np.isfinite(row.running_max)]) >= 0)
    assert [n for n, _, _ in row.bytes] == list(service.ONLINE_LENGTHS)
    assert all(plain == 8 * n * n and online == 4 * (4 * n + 2 * n) for n, plain, online in row.bytes)
    fig = online_softmax_figure(row.starts, row.stops, row.block_max, row.running_max, row.rescale,
                                row.running_sum, row.plain, row.online, [str(i) for i in range(N)], "t")
    scatter = {t.name: t for t in fig.data}
    np.testing.assert_allclose(np.asarray(scatter["running sum ℓ"].y, float), row.running_sum, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(scatter["online softmax"].y, float), row.online, atol=1e-7)
    np.testing.assert_allclose(np.asarray(scatter["plain softmax"].y, float), row.plain, atol=1e-7)


def test_bad_block_sizes_are_named():
    _, model = tiny.family_pair("bloom")
    for bad in (0, -3, 2.5, "four"):
        with pytest.raises(UserError, match="Block size"):
            service.online_row(model, encoded(), 0, 0, -1, bad)
