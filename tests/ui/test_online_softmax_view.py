"""The online softmax beside the Inside walk (ui/services/inside.py online_row, ui/plots/online.py): on a tiny model
of every family, the followed row read a block at a time equals the pass's own weights and output, the steps are
the recurrence of eq. 6.10, the bytes rows are the formula, and the figure draws the steps and both softmaxes; the
table shows the shipped measurement (assets/measured/online_softmax.json) and, apart and labelled, the formula."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import tiny
from ui.plots.online import online_softmax_figure
from core.attention import softmax_bytes
from ui.services import inside as service
from ui.services.checks import UserError
from ui.services.text import Encoded
from ui.views.online import bytes_table

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
    assert row.bytes == [(n, *softmax_bytes(n, n, 4, row.d_head).values()) for n in service.ONLINE_LENGTHS]
    assert all(plain == 8 * n * n for n, plain, _ in row.bytes)
    assert row.measured == service.online_softmax_memory()
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


def test_the_shipped_measurement_is_read_as_written():
    memory = service.online_softmax_memory()
    assert memory is not None, f"{service.MEASURED} is shipped: {service.BENCH} --publish writes it"
    raw = json.loads(service.MEASURED.read_text())
    assert [r.n for r in memory.rows] == [r["n"] for r in raw["rows"]] == list(service.ONLINE_LENGTHS)
    for row, written in zip(memory.rows, raw["rows"]):
        assert (row.plain, row.online, row.fused) == tuple(written[m]["median"] for m in ("plain", "online", "fused"))
        assert row.fused < row.online < row.plain or row.n <= 1024     # the fused kernel holds no n × n, nor blocks
    assert "VmHWM" in memory.method and memory.threads == 1 and memory.date == raw["date"]
    assert memory.command.endswith("bench/variants/online_softmax.py --publish")


def test_the_table_shows_the_measurement_and_apart_the_formula():
    _, model = tiny.family_pair("bloom")
    row = service.online_row(model, encoded(), 0, 0, -1, 4)
    memory = service.online_softmax_memory()
    table = bytes_table(row)
    measured_part, formula_part = table.split("**Formula, not a measurement**")
    assert "**Measured**" in measured_part and memory.date in measured_part and "VmHWM" in measured_part
    top = memory.rows[-1]
    assert (f"| {top.n:,} | {top.plain / 2 ** 20:,.2f} MiB | {top.online / 2 ** 20:,.2f} MiB | "
            f"{top.fused / 2 ** 20:,.2f} MiB | {top.plain / top.online:,.1f}× |") in measured_part
    plain, online = softmax_bytes(8192, 8192, 4, row.d_head).values()
    formula_row = f"| 8,192 | {plain / 2 ** 20:,.2f} MiB | {online / 2 ** 20:,.2f} MiB | {plain / online:,.1f}× |"
    assert formula_row in formula_part
    assert "64×" not in table
    missing = bytes_table(dataclasses.replace(row, measured=None))
    assert "not shipped with this copy" in missing and service.BENCH in missing and "**Formula" in missing


def test_a_damaged_measurement_is_named(tmp_path):
    assert service.online_softmax_memory(tmp_path / "none.json") is None
    damaged = tmp_path / "online_softmax.json"
    damaged.write_text('{"rows": [{"n": 512}]}')
    with pytest.raises(ValueError, match="online_softmax.json is not the measurement .* --publish writes"):
        service.online_softmax_memory(damaged)
