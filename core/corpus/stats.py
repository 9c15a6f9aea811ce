"""The summary of one measurement over N items: its mean, a 95 % confidence interval of the mean that stays inside
the quantity's range, and every item's own value; and Spearman's ρ. The statistics are scipy.stats's; this module
imports nothing else of the project.

Which interval a summary gets follows from the range its caller gives (`bounds`):
- None, an unbounded quantity (a logit difference, a loss increase, a signed error): Student's t,
  mean ± t_{0.975, n−1} · s/√n (scipy.stats.t.ppf), s the sample standard deviation.
- (low, high) with either end set (a share in [0, 1], a count or a cost ≥ 0, ρ in [−1, 1]): the percentile
  bootstrap over items (scipy.stats.bootstrap, method="percentile", BOOTSTRAP_RESAMPLES resamples, seed
  BOOTSTRAP_SEED): every resample's mean lies between the smallest and largest item, so the interval never leaves
  the range. It is used for ρ too, not Fisher's z: a per-item ρ of exactly ±1 (a small map ranked identically)
  has no z, and Fisher's interval is centred on tanh(mean z), which can miss the mean of ρ the summary shows. It is
  used for shares too, not Wilson's interval: a share here is each item's own fraction (k of 10 cells, the heads
  above a threshold), and the cells of one item are not independent trials, which Wilson's interval assumes.
Fewer than MIN_ITEMS items give no interval (low and high NaN) and a note that says so."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import stats as scipy_stats
from torch import Tensor

CONFIDENCE = 0.95          # the interval's coverage
MIN_ITEMS = 5              # fewer items than this get no interval
BOOTSTRAP_RESAMPLES = 9999     # scipy.stats.bootstrap's default
BOOTSTRAP_SEED = 0             # a summary of the same values is the same summary, run after run
BOOTSTRAP_BYTES = 32 * 2**20   # resampled values held at once: a batch is this / (8 bytes · items · cells)
ROUNDING = 1e-4                # how far past its range a value may lie and still be the quantity's (float sums)

Bounds = tuple[float | None, float | None] | None     # a quantity's range: None unbounded, else (low, high)
UNBOUNDED: Bounds = None
SHARE: Bounds = (0.0, 1.0)                 # a share, an attention weight, a top-k overlap
NONNEGATIVE: Bounds = (0.0, None)          # a count, a cost, an entropy
CORRELATION: Bounds = (-1.0, 1.0)          # Spearman's or Pearson's ρ

STUDENT = "Student's t"
BOOTSTRAP = "percentile bootstrap"
NO_INTERVAL = ""


# ---- the summary: mean and a 95 % interval over items ----

@dataclass
class Over:
    """A measurement over N items: mean, the 95 % confidence interval of the mean [low, high] (by `interval`, the
    method the bounds chose: see the module's docstring), and every item's value."""
    mean: Tensor                # [...]
    low: Tensor                 # [...]: NaN where n < MIN_ITEMS, or where an item's value is NaN
    high: Tensor                # [...]
    per_item: Tensor            # [N, ...]
    n: int
    note: str = ""              # what the summary leaves out and why: too few items, skipped items, a stopped job
    items: tuple[int, ...] = ()     # the index in the input of each row of per_item
    left_out: dict[int, str] = field(default_factory=dict)   # index in the input → why it has no row (as the note)
    interval: str = NO_INTERVAL     # STUDENT, BOOTSTRAP, or NO_INTERVAL where n < MIN_ITEMS
    bounds: Bounds = UNBOUNDED      # the quantity's range the interval stays in


def check_bounds(bounds: Bounds) -> Bounds:
    if bounds is None:
        return None
    ok = (isinstance(bounds, tuple) and len(bounds) == 2
          and all(end is None or (isinstance(end, (int, float)) and math.isfinite(end)) for end in bounds))
    if not ok or (None not in bounds and bounds[0] >= bounds[1]):
        raise ValueError(f"bounds is a quantity's range: None (unbounded) or (low, high) with low < high, either "
                         f"end None for no limit, e.g. (0, 1) for a share; got {bounds!r}")
    if bounds == (None, None):
        return None
    return tuple(None if end is None else float(end) for end in bounds)


def too_few_note(n: int) -> str:
    return f"too few items for an interval (n = {n}; an interval needs at least {MIN_ITEMS})"


def summarise(per_item: Tensor, note: str = "", items: Sequence[int] | None = None,
              left_out: Mapping[int, str] | None = None, *, bounds: Bounds) -> Over:
    """The Over of per_item [N, ...] of a quantity whose range is `bounds` (UNBOUNDED, SHARE, NONNEGATIVE,
    CORRELATION or any (low, high)); note: what the caller left out (joined with the too-few note here), and
    left_out the same items by index with their reasons. A value further than ROUNDING outside the bounds is
    refused: the range is then not the quantity's."""
    bounds = check_bounds(bounds)
    n = per_item.shape[0]
    values = per_item.double()
    outside = outside_bounds(values, bounds)
    if outside:
        raise ValueError(f"summarise was told the values lie in {bounds}, but {outside}: give the quantity's own "
                         "range (None where it has none)")
    mean = values.mean(0) if n else values.new_full(values.shape[1:], math.nan)
    notes = [note] if note else []
    if n < MIN_ITEMS:
        low = high = torch.full_like(mean, math.nan)
        notes.append(too_few_note(n))
        interval = NO_INTERVAL
    elif bounds is None:
        low, high = student_interval(values, mean)
        interval = STUDENT
    else:
        low, high = bootstrap_interval(values, mean, bounds)
        interval = BOOTSTRAP
    kind = per_item.dtype if per_item.is_floating_point() else torch.float32
    return Over(mean.to(kind), low.to(kind), high.to(kind), per_item, n, "; ".join(notes),
                tuple(range(n)) if items is None else tuple(items), dict(left_out or {}), interval, bounds)


def outside_bounds(values: Tensor, bounds: Bounds) -> str:
    """'' if every finite value lies in bounds, else which one does not."""
    if bounds is None:
        return ""
    finite = values[values.isfinite()]
    low, high = bounds
    for end, beyond in ((low, finite < (low or 0) - ROUNDING * max(1, abs(low or 0))),
                        (high, finite > (high or 0) + ROUNDING * max(1, abs(high or 0)))):
        if end is not None and beyond.any():
            return f"{float(finite[beyond][0])!r} lies outside it"
    return ""


def student_interval(values: Tensor, mean: Tensor) -> tuple[Tensor, Tensor]:
    """mean ± t_{0.975, n−1} · s/√n over items (dim 0)."""
    n = values.shape[0]
    half = scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * values.std(0, correction=1) / math.sqrt(n)
    return mean - half, mean + half


def bootstrap_interval(values: Tensor, mean: Tensor, bounds: tuple) -> tuple[Tensor, Tensor]:
    """The seeded percentile bootstrap of the mean over items (dim 0), cell by cell, in batches of resamples that
    hold about BOOTSTRAP_BYTES; cells with a non-finite item get NaN. Clamped into [bounds] and around the mean
    against rounding (a resample mean of equal values may differ from their mean in the last bit)."""
    n = values.shape[0]
    flat = values.reshape(n, -1).numpy()
    low, high = np.full(flat.shape[1], np.nan), np.full(flat.shape[1], np.nan)
    finite = np.isfinite(flat).all(0)
    if finite.any():
        data = flat[:, finite]
        batch = max(1, BOOTSTRAP_BYTES // (8 * n * data.shape[1]))
        result = scipy_stats.bootstrap((data,), np.mean, n_resamples=BOOTSTRAP_RESAMPLES, batch=batch,
                                       vectorized=True, axis=0, confidence_level=CONFIDENCE, method="percentile",
                                       rng=np.random.default_rng(BOOTSTRAP_SEED))
        low[finite], high[finite] = result.confidence_interval.low, result.confidence_interval.high
    centre = mean.reshape(-1).numpy()
    low, high = np.minimum(low, centre), np.maximum(high, centre)
    low, high = np.clip(low, bounds[0], bounds[1]), np.clip(high, bounds[0], bounds[1])
    shape = values.shape[1:]
    return torch.from_numpy(low).reshape(shape), torch.from_numpy(high).reshape(shape)


# ---- Spearman's ρ ----

def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's ρ of two tensors of one shape, over all their cells (scipy.stats.spearmanr: Pearson's
    correlation of their ranks, ties given their average rank); NaN if either is constant."""
    if a.shape != b.shape:
        raise ValueError(f"Spearman's ρ compares two tensors of one shape, got {list(a.shape)} and {list(b.shape)}")
    x, y = a.detach().flatten().double().cpu().numpy(), b.detach().flatten().double().cpu().numpy()
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    return float(scipy_stats.spearmanr(x, y).statistic)
