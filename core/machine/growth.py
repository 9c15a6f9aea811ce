"""How a measurement grows with the length: the exponent k in value ∝ n^k, fitted by least squares on log-log, the
one fit every bench, service and lesson uses (a time, a peak of memory, a decode step).

A peak of resident memory under MEMORY_FLOOR is within the kernel's slack in counting resident pages (it updates a
process's count in batches, so such a figure can even fall below zero): it is no size to fit a growth to. Such points
are left out of the fit, and the result says which."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MEMORY_FLOOR = 2 ** 20   # bytes: 1 MiB, the kernel's slack in a process's count of resident pages


@dataclass(frozen=True)
class Growth:
    """k in value ∝ n^k over `lengths`; nan where fewer than two points were fit to. `left_out`: the lengths whose
    value lay under `floor` (or was not positive, which no logarithm takes)."""
    exponent: float
    lengths: tuple[int, ...]       # the lengths fitted
    left_out: tuple[int, ...]      # the lengths left out, their value under the floor
    floor: float = 0.0

    @property
    def fitted(self) -> bool:
        return math.isfinite(self.exponent)

    def record(self) -> dict:
        """As JSON holds it (nan as null)."""
        return {"exponent": self.exponent if self.fitted else None, "lengths": list(self.lengths),
                "left_out": list(self.left_out), "floor": float(self.floor)}

    @classmethod
    def from_record(cls, record: dict) -> Growth:
        exponent = record["exponent"]
        return cls(math.nan if exponent is None else float(exponent), tuple(int(n) for n in record["lengths"]),
                   tuple(int(n) for n in record["left_out"]), float(record.get("floor", 0.0)))


def growth(lengths, values, floor: float = 0.0) -> Growth:
    """k in value ∝ n^k: the slope of log value on log n, least squares, over the points whose value is at least
    `floor` (and positive); the others are left out and named."""
    lengths = [int(n) for n in lengths]
    values = [float(v) for v in values]
    if len(lengths) != len(values):
        raise ValueError(f"{len(lengths)} lengths for {len(values)} values: one value per length")
    kept = [(n, v) for n, v in zip(lengths, values) if v > 0 and v >= floor]
    left_out = tuple(n for n, v in zip(lengths, values) if not (v > 0 and v >= floor))
    if len({n for n, _ in kept}) < 2:
        return Growth(math.nan, tuple(n for n, _ in kept), left_out, floor)
    x, y = np.log([n for n, _ in kept]), np.log([v for _, v in kept])
    return Growth(float(np.polyfit(x, y, 1)[0]), tuple(n for n, _ in kept), left_out, floor)


def memory_growth(lengths, peaks) -> Growth:
    """growth of peaks of resident memory, the points under MEMORY_FLOOR left out."""
    return growth(lengths, peaks, MEMORY_FLOOR)
