"""What the course's tests ask of a figure before Reveal (tests/ui/test_learn_reveal.py on the service's figures,
tests/browser/test_browser_learn.py on plotly's own data in the page): whether numbers state the lesson's answer
as the page shows it."""

from __future__ import annotations

import math

import numpy as np

from ui.services import learn


def numbers(value) -> list[float]:
    """Every finite number in a value (a number, a list, nested lists, an array), flattened."""
    found = []
    for item in np.asarray(value if value is not None else [], dtype=object).ravel():
        if isinstance(item, (list, tuple, np.ndarray)):
            found += numbers(item)
        elif isinstance(item, (int, float, np.number)) and not isinstance(item, bool) and math.isfinite(item):
            found.append(float(item))
    return found


def carries(values, answer: float) -> bool:
    """Whether any of `values` is the answer as the page shows it (learn.number, 3 significant figures), as it is
    or as a share × 100 (an answer in %); an answer of 0 only by an exact 0."""
    shown = learn.number(answer)
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    for value in numbers(values):
        for scaled in (value, 100 * value):
            if (scaled == 0) if answer == 0 else f"{scaled:,.{decimals}f}" == shown:
                return True
    return False
