"""Checks of what a user sends: numbers in range, whole numbers, seeds, and the messages they get.

`UserError` is bad input: its message is shown in the page (through `public_text`, which hides server paths).
Every check names the field and what would be right.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

import core.store as weight_store

class UserError(ValueError):
    """Bad input from the user: the message is shown in the page (through public_text)."""
REPO_ROOT = Path(__file__).resolve().parents[2]
# an absolute path of at least two parts (/tmp/x, /home/alice/...): a lone "/x" is left as typed, as is the
# slash of a closing tag ("</b>") or of a fraction
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~<])/(?:[^\s/'\"<>]+/)+[^\s/'\",;)<>]+")


def public_text(text: str) -> str:
    """A message as a user may see it: no absolute server paths. Files in the weight store read weights/NAME,
    the repository's read as relative paths, and any other absolute path keeps only its last two parts."""
    roots = {str(weight_store.WeightStore.default().root.resolve()): "weights", str(REPO_ROOT): "."}
    for root, shown in sorted(roots.items(), key=lambda item: -len(item[0])):
        text = text.replace(root + "/", "" if shown == "." else shown + "/").replace(root, shown)

    def shorten(match: re.Match) -> str:
        parts = [p for p in match.group(0).split("/") if p]
        return "…/" + "/".join(parts[-2:])

    return ABSOLUTE_PATH.sub(shorten, text)
MAX_SEED = 2**63 - 1  # torch.manual_seed's range, kept to what every generator accepts


def _shown(value: int | float) -> str:
    """1024 and 20,000 for ints, 0.05 for floats, 1.84e+19 for what no one types digit by digit."""
    if isinstance(value, int) and value.bit_length() > 1000:  # beyond a float: say how long it is
        return f"a {len(str(abs(value))):,}-digit number"
    if abs(value) >= 10**15:
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    return f"{value:g}"


def _number(name: str, value, low, high) -> int | float:
    """A finite int or float from a field's value (numbers, numeric strings, numpy scalars), or a UserError
    naming the field: missing, not a number, NaN or infinite."""
    expected = f"a number from {_shown(low)} to {_shown(high)}"
    if value is None or (isinstance(value, str) and not value.strip()):
        raise UserError(f"{name} is missing; choose {expected}.")
    if isinstance(value, bool) or not isinstance(value, (int, float, str, np.integer, np.floating)):
        raise UserError(f"{name} must be {expected}, got a {type(value).__name__}.")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise UserError(f"{name} must be {expected}, got {text[:40]!r}.") from None
    value = value.item() if isinstance(value, (np.integer, np.floating)) else value
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{name} must be {expected}, got {value} (it must be finite).")
    return value


def check_range(name: str, value, low: int, high: int) -> int:
    """A whole number within [low, high], or a UserError naming the setting and its range."""
    value = _number(name, value, low, high)
    if isinstance(value, float):
        if not value.is_integer():
            raise UserError(f"{name} must be a whole number from {low} to {high}, got {value:g}.")
        value = int(value)
    if not low <= value <= high:
        raise UserError(f"{name} must be between {_shown(low)} and {_shown(high)}, got {_shown(value)}.")
    return value


def check_float(name: str, value, low: float, high: float, low_open: bool = False) -> float:
    """A finite number within [low, high] ((low, high] when low_open), or a UserError naming the setting."""
    number = _number(name, value, low, high)
    try:
        value = float(number)
    except OverflowError:  # an int past float's range
        raise UserError(f"{name} must be in [{low:g}, {high:g}], got {_shown(number)}.") from None
    if not (low < value if low_open else low <= value) or value > high:
        bracket = "(" if low_open else "["
        raise UserError(f"{name} must be in {bracket}{low:g}, {high:g}], got {_shown(value)}.")
    return value


def check_choice(name: str, value, choices, hint: str = ""):
    """`value` when it is one of `choices` (a sequence, or a mapping's keys), else a UserError that names the
    setting, every choice (quoted where one holds a space, so each reads as one name), `hint` and what came."""
    try:
        if value in choices:
            return value
    except TypeError:  # an unhashable value (a list) asked of a mapping's keys
        pass
    names = [str(c) for c in choices]
    listed = ", ".join(repr(n) for n in names) if any(" " in n for n in names) else ", ".join(names)
    raise UserError(f"{name} must be one of {listed}{hint}, got {str(value)[:40]!r}.")


def index_of(value) -> int | None:
    """A checked field's value as an index for file names and labels ("0.0", 3.0, np.int64(3) → 0, 3, 3), or None
    when it is not a whole number (the handler's own checks give the message)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(number) if math.isfinite(number) and number.is_integer() else None


def check_seed(value) -> int | None:
    """An empty seed means unseeded; otherwise a whole number from 0 to MAX_SEED."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return check_range("Seed", value, 0, MAX_SEED)


MEAN_OF_HEADS = ("mean", "mean of heads")  # what a head field takes for the mean of a layer's heads


def parse_head(value, n_heads: int, allow_mean: bool = True) -> int | None:
    """'mean of heads' → None (when allowed), else an index in range, or a UserError."""
    if value in MEAN_OF_HEADS and allow_mean:
        return None
    return check_range("Head", value, 0, n_heads - 1)


def stack_shape(model) -> tuple[int, int]:
    """(layers, heads) of the stack a head index names: the main one, or a seq2seq model's encoder."""
    cfg = model.attention_stack()[0].cfg
    return cfg.n_layers, cfg.n_heads


def check_head(model, layer, head) -> tuple[int, int]:
    """A layer and a head of the model's stack (stack_shape), each in range, or a UserError naming the range."""
    n_layers, n_heads = stack_shape(model)
    return check_range("Layer", layer, 0, n_layers - 1), check_range("Head", head, 0, n_heads - 1)


def kept_index(value, size: int) -> int:
    """A layer or head index kept across a change of model when the new model has it, else 0."""
    index = index_of(value)
    return index if index is not None and 0 <= index < size else 0
