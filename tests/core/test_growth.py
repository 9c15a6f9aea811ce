"""core/machine/growth.py, the one fit of how a measurement grows with the length (k in value ∝ n^k): a known exponent is
recovered, points under the floor are left out and named, too few points give nan; and no other module of the
repository fits a log-log slope or writes the memory floor again."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from core.machine.growth import MEMORY_FLOOR, Growth, growth, memory_growth

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("k", [0.5, 1.0, 2.0, 2.37])
def test_a_known_exponent_is_recovered(k):
    lengths = [256, 512, 1024, 2048, 4096]
    fit = growth(lengths, [3e-6 * n ** k for n in lengths])
    assert fit.exponent == pytest.approx(k, abs=1e-12)
    assert fit.lengths == tuple(lengths) and fit.left_out == () and fit.fitted


def test_noise_leaves_the_least_squares_slope():
    rng = np.random.default_rng(0)
    lengths = np.array([64, 128, 256, 512, 1024, 2048])
    values = 1e-4 * lengths ** 1.8 * np.exp(rng.normal(0, 0.05, len(lengths)))
    slope = np.polyfit(np.log(lengths), np.log(values), 1)[0]      # the reference, written out here
    assert growth(lengths, values).exponent == pytest.approx(slope, abs=1e-12)
    assert 1.7 < slope < 1.9


def test_peaks_under_the_floor_are_left_out_and_named():
    lengths = [512, 1024, 2048, 4096, 8192]
    peaks = [0.05 * MEMORY_FLOOR, -4096, 2 * MEMORY_FLOOR, 4 * MEMORY_FLOOR, 8 * MEMORY_FLOOR]   # a noisy start
    fit = memory_growth(lengths, peaks)
    assert fit.exponent == pytest.approx(1.0, abs=1e-12)           # fitted over the last three only
    assert fit.lengths == (2048, 4096, 8192) and fit.left_out == (512, 1024) and fit.floor == MEMORY_FLOOR
    with_them = growth(lengths[:1] + lengths[2:], peaks[:1] + peaks[2:])   # no floor: the small one pulls the slope
    assert with_them.left_out == () and abs(with_them.exponent - 1.0) > 0.3


def test_too_few_points_above_the_floor_give_nan_and_say_which():
    fit = memory_growth([2048, 4096, 8192], [1000.0, 2000.0, 3 * MEMORY_FLOOR])
    assert math.isnan(fit.exponent) and not fit.fitted
    assert fit.lengths == (8192,) and fit.left_out == (2048, 4096)
    assert math.isnan(growth([256], [1.0]).exponent)
    with pytest.raises(ValueError, match="3 lengths for 2 values"):
        growth([1, 2, 3], [1.0, 2.0])


def test_a_fit_goes_to_json_and_back():
    fit = memory_growth([1024, 2048, 4096], [100.0, 2 * MEMORY_FLOOR, 4 * MEMORY_FLOOR])
    assert Growth.from_record(fit.record()) == fit and fit.left_out == (1024,)
    short = memory_growth([1024, 2048], [1.0, 2.0])
    assert short.record()["exponent"] is None                      # JSON has no nan
    back = Growth.from_record(short.record())
    assert math.isnan(back.exponent) and (back.lengths, back.left_out, back.floor) == ((), (1024, 2048), MEMORY_FLOOR)


# What a second fit would look like: np.polyfit (or a hand-written slope) on logarithms, or a comparison with, or a
# name for, 1 MiB as a floor. Formatting bytes as MiB (n / 2 ** 20) is not a floor.
LOG_FIT = re.compile(r"polyfit\([^)]*log|linregress\([^)]*log")
MIB = r"(?:2\s*\*\*\s*20|1\s*<<\s*20|1024\s*\*\s*1024|1_?048_?576)"
FLOOR = re.compile(rf"(?:[<>]=?\s*{MIB}\b.*(?:fit|expon|peak|floor)|(?:fit|expon|peak|floor).*[<>]=?\s*{MIB}\b"
                   rf"|floor\w*\s*=\s*{MIB}|under 1 MiB)", re.I)
SCANNED = ["core", "ui", "bench", "scripts", "app.py"]


def python_files():
    for name in SCANNED:
        path = ROOT / name
        yield from ([path] if path.is_file() else sorted(path.rglob("*.py")))


def test_no_other_module_fits_a_log_log_slope_or_writes_the_floor():
    found = []
    for path in python_files():
        if path == ROOT / "core" / "machine" / "growth.py":
            continue
        text = path.read_text(encoding="utf-8")
        logs = re.findall(r"\b(\w+)\s*(?:,\s*\w+\s*)?=\s*(?:np|math)\.log\(", text)   # x = np.log(...), x, y = ...
        for number, line in enumerate(text.splitlines(), 1):
            fit = LOG_FIT.search(line) or (
                "polyfit(" in line and any(re.search(rf"polyfit\(\s*{re.escape(v)}\b", line) for v in logs))
            if fit or FLOOR.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "a fit or a floor of its own (use core.machine.growth): " + "; ".join(found)


def test_the_scan_sees_a_second_fit(tmp_path):
    # the patterns above must catch the shapes a second fit has taken in this repository, else the test holds vacuously
    for line in ("return float(np.polyfit(np.log(n), np.log(t), 1)[0])", 'b = f"n^{k:.2f}" if min(peaks) >= 2 ** 20',
                 "FIT_FLOOR = 2 ** 20   # bytes", "slope = stats.linregress(np.log(x), np.log(y))",
                 '"– (a peak under 1 MiB)"'):
        assert LOG_FIT.search(line) or FLOOR.search(line), line
    for line in ('return f"{n_bytes / 2 ** 20:,.1f} MiB"', "per_token, fixed = np.polyfit(x, seconds, 1)",
                 'return f"{n / 2 ** 20:,.2f} MiB" if n >= 2 ** 20 else f"{n / 2 ** 10:,.1f} KiB"'):
        assert not (LOG_FIT.search(line) or FLOOR.search(line)), line
