"""Small helpers that write weight-name table rows; a family file uses them to stay short."""
from __future__ import annotations

from ..config import ConfigError


def require(raw: dict, *keys: str):
    """Read the first of `keys` present in config.json, or say which key is missing."""
    for key in keys:
        if raw.get(key) is not None:
            return raw[key]
    raise ConfigError(f"config.json has no {' or '.join(repr(k) for k in keys)} (model_type {raw.get('model_type')!r})")


def rows(ours: str, *theirs, bias: bool = True) -> dict[str, list]:
    """weight (and bias) rows for one of our modules. Each of `theirs` is a checkpoint module name, or a tuple
    of names whose tensors are concatenated; several are alternatives tried in order."""
    def named(alt, leaf):
        return tuple(f"{n}.{leaf}" for n in alt) if isinstance(alt, tuple) else f"{alt}.{leaf}"
    out = {f"{ours}.weight": [named(alt, "weight") for alt in theirs]}
    if bias:
        out[f"{ours}.bias"] = [named(alt, "bias") for alt in theirs]
    return out
