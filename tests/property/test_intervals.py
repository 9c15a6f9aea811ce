"""Every interval stays inside its quantity's range and around its mean, whatever the items: random per-item values
inside the bounds of each bounded measure the project summarises (attention shares, counts and costs, ρ), with
all-equal values, the fewest items that get an interval, and values at the extremes."""
from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.analysis import heads, shortcuts
from core.corpus import stats

# every range a bounded measure is summarised in: the head scores', the shortcuts table's, the sinks' (SHARE)
RANGES = sorted({r for r in (*heads.SCORE_BOUNDS.values(), *shortcuts.BOUNDS.values(), stats.SHARE)
                 if r is not None}, key=str)
TOP = 1e6       # the largest value drawn for a range open above (a cost in forward passes, a count)


def values_in(bounds, n_min: int = stats.MIN_ITEMS, n_max: int = 12):
    low, high = bounds
    finite = st.floats(low if low is not None else -TOP, high if high is not None else TOP,
                       allow_nan=False, allow_infinity=False)
    edges = [end for end in bounds if end is not None]
    pick = st.one_of(finite, st.sampled_from(edges)) if edges else finite
    return st.lists(pick, min_size=n_min, max_size=n_max)


def check_inside(over: stats.Over, bounds) -> None:
    low, high = bounds
    mean, lo, hi = float(over.mean), float(over.low), float(over.high)
    assert over.interval == stats.BOOTSTRAP and not math.isnan(lo) and not math.isnan(hi)
    assert lo <= mean + 1e-9 * max(1, abs(mean)) and mean <= hi + 1e-9 * max(1, abs(mean)), (lo, mean, hi)
    assert low is None or lo >= low
    assert high is None or hi <= high


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_bounded_interval_stays_in_its_range_and_around_its_mean(data):
    bounds = data.draw(st.sampled_from(RANGES))
    values = data.draw(values_in(bounds))
    over = stats.summarise(torch.tensor(values, dtype=torch.float64), bounds=bounds)
    check_inside(over, bounds)


def test_fixed_cases_all_equal_extremes_and_the_fewest_items():
    for bounds in RANGES:
        low, high = bounds
        edges = [end for end in (low, high if high is not None else TOP) if end is not None]
        cases = [[edges[0]] * stats.MIN_ITEMS, [edges[-1]] * stats.MIN_ITEMS,        # all equal, at an end
                 [0.3] * 7, [edges[0]] * 4 + [edges[-1]],                          # one extreme among the rest
                 [edges[-1]] * 4 + [edges[0]]]
        for values in cases:
            over = stats.summarise(torch.tensor(values, dtype=torch.float64), bounds=bounds)
            check_inside(over, bounds)
            if len(set(values)) == 1:
                assert float(over.low) == float(over.high) == values[0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=stats.MIN_ITEMS, max_size=30))
def test_rho_intervals_stay_in_minus_one_to_one(rhos):
    over = stats.summarise(torch.tensor(rhos, dtype=torch.float64), bounds=shortcuts.BOUNDS["rho"])
    check_inside(over, (-1.0, 1.0))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=0, max_size=stats.MIN_ITEMS - 1))
def test_fewer_than_five_items_get_no_interval_and_say_so(values):
    over = stats.summarise(torch.tensor(values, dtype=torch.float64).reshape(-1), bounds=stats.SHARE)
    assert over.interval == "" and over.low.isnan().all() and over.high.isnan().all()
    assert f"too few items for an interval (n = {len(values)}" in over.note


@settings(max_examples=25, deadline=None)
@given(st.integers(stats.MIN_ITEMS, 9), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_a_map_of_shares_stays_in_zero_to_one_cell_by_cell(n, rows, cols, seed):
    gen = torch.Generator().manual_seed(seed)
    per_item = torch.rand(n, rows, cols, generator=gen)
    per_item[:, 0, 0] = 1.0                               # a cell at the top of the range in every item
    over = stats.summarise(per_item, bounds=stats.SHARE)
    assert (over.low >= 0).all() and (over.high <= 1).all()
    assert (over.low <= over.mean + 1e-6).all() and (over.mean <= over.high + 1e-6).all()
    assert float(over.low[0, 0]) == float(over.high[0, 0]) == 1.0
