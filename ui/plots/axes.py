"""Log axes that name whole numbers only. Left to itself plotly labels a log axis's minor ticks with their bare
first digit ("10, 2, 5, 100, 2, 5" or "8 9 1 2"), which reads as a wrong scale. Every log axis of the app is made
here: labelled at its decades (0.01, 1, 1,000 written out; an axis reaching past them in powers: 10⁻⁹, 10⁶), or at
given places such as the lengths a lesson measured, each written in full, with the range set so those labels show.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

MAX_DECADE_LABELS = 8      # a wider axis names every k-th decade, so its labels keep apart on a phone
PLAIN_POWERS = range(-3, 5)  # 0.001 … 10,000 are written out; further decades as powers of ten
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def decade_label(power: int, plain: bool = True) -> str:
    """10**power as a reader writes it: '0.01', '1', '1,000' (plain), or '10⁻⁹' (1 and 10 always plain)."""
    if (plain and power in PLAIN_POWERS) or power in (0, 1):
        return f"{10.0 ** power:,.{max(0, -power)}f}"
    return "10" + str(power).translate(SUPERSCRIPT)


def positive_span(values: Iterable) -> tuple[float, float]:
    """The smallest and largest finite positive value among arrays (a log axis shows nothing else)."""
    flat = [np.asarray(v, dtype=np.float64).ravel() for v in values]
    data = np.concatenate(flat) if flat else np.empty(0)
    data = data[np.isfinite(data) & (data > 0)]
    if data.size == 0:
        return 1.0, 10.0
    return float(data.min()), float(data.max())


def log_axis(*values, ticks: Sequence[float] | None = None, labels: Sequence[str] | None = None,
             low: float | None = None, high: float | None = None) -> dict:
    """A plotly log axis over `values` (arrays) or [low, high]: labelled at `ticks` (with `labels`, or the numbers
    written out) or else at the decades, and ranged to the whole decades around the data, so every label shows."""
    if low is None or high is None:
        low, high = positive_span(values if values else [ticks or []])
    if ticks is not None:
        ticks = [float(t) for t in ticks]
        shown = list(labels) if labels is not None else [f"{t:,g}" for t in ticks]
        if len(shown) != len(ticks):
            raise ValueError(f"log_axis: {len(shown)} labels for {len(ticks)} ticks")
        span = [math.log10(min(low, *ticks)) - 0.15, math.log10(max(high, *ticks)) + 0.15]
        return {"type": "log", "range": span, "tickvals": ticks, "ticktext": shown}
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    if last == first:
        last += 1
    step = max(1, math.ceil((last - first + 1) / MAX_DECADE_LABELS))
    powers = list(range(last, first - 1, -step))[::-1]   # counted down from the top, so 1 or the top is named
    return {"type": "log", "range": [first, last], "tickvals": [10.0 ** p for p in powers],
            "ticktext": [decade_label(p, plain=first in PLAIN_POWERS and last in PLAIN_POWERS) for p in powers]}


def linear_lengths(lengths: Sequence[int]) -> dict:
    """A linear axis of tokens from 0, labelled at the lengths measured: where a quantity grows linearly in n, a
    straight line through 0 says so (on a log axis of n it would bend)."""
    lengths = [int(n) for n in lengths]
    return {"type": "linear", "range": [0, lengths[-1] * 1.05], "tickvals": [0, *lengths],
            "ticktext": ["0", *(f"{n:,}" for n in lengths)]}
