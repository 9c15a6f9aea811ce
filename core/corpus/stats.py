"""The summary of one measurement over N items: its mean, a 95 % confidence interval that stays inside the
quantity's range, and every item's own value. Pure statistics: it imports nothing else of the project."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

CONFIDENCE = 0.95          # the interval's coverage


# ---- the summary: mean and Student's t interval over items ----

@dataclass
class Over:
    """A measurement over N items: mean, the 95 % confidence interval of the mean [low, high] (Student's t over
    items: mean ± t_{0.975, n−1} · s/√n, s the sample standard deviation), and every item's value."""
    mean: Tensor                # [...]
    low: Tensor                 # [...]: NaN where n < 2
    high: Tensor                # [...]
    per_item: Tensor            # [N, ...]
    n: int
    note: str = ""              # what the summary leaves out and why: n < 2, skipped items, a stopped job
    items: tuple[int, ...] = ()     # the index in the input of each row of per_item
    left_out: dict[int, str] = field(default_factory=dict)   # index in the input → why it has no row (as the note)


def summarise(per_item: Tensor, note: str = "", items: Sequence[int] | None = None,
              left_out: Mapping[int, str] | None = None) -> Over:
    """The Over of per_item [N, ...]; note: what the caller left out (joined with the n < 2 note here), and
    left_out the same items by index with their reasons."""
    n = per_item.shape[0]
    values = per_item.double()
    mean = values.mean(0) if n else values.new_full(values.shape[1:], math.nan)
    notes = [note] if note else []
    if n < 2:
        low = high = torch.full_like(mean, math.nan)
        notes.append(f"n = {n}: a confidence interval needs at least two items, so low and high are NaN")
    else:
        half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * values.std(0, correction=1) / math.sqrt(n)
        low, high = mean - half, mean + half
    kind = per_item.dtype if per_item.is_floating_point() else torch.float32
    return Over(mean.to(kind), low.to(kind), high.to(kind), per_item, n, "; ".join(notes),
                tuple(range(n)) if items is None else tuple(items), dict(left_out or {}))


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz), taken on
    the side of x where it converges fast: I_x(a, b) = 1 − I_{1−x}(b, a)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 10_000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def student_t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with df degrees of freedom: 1 − ½ I_{df/(df+t²)}(df/2, ½) for t ≥ 0."""
    tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The t with P(T ≤ t) = p, for ½ ≤ p < 1: bisection on student_t_cdf (it increases with t)."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"t_quantile needs ½ ≤ p < 1 and df ≥ 1, got p = {p}, df = {df}")
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        low, high = high, 2 * high
    for _ in range(200):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        low, high = (middle, high) if student_t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2
