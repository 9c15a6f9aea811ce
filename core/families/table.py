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


def per_head_qkv(w, cfg):
    """Fused q/k/v rows stored per head, [H, 3, d_k, ...] (GPT-NeoX, BLOOM), → ours, [3, H, d_k, ...]."""
    return w.reshape(cfg.n_heads, 3, cfg.head_dim, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


def qkv_per_head(w, cfg):
    """The inverse of per_head_qkv, for saving in the checkpoint's layout."""
    return w.reshape(3, cfg.n_heads, cfg.head_dim, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


def rope_parameters(raw: dict, layer_type: str | None = None) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from the top level (transformers 4) or rope_parameters (transformers 5,
    possibly one dict per layer type). Only the default RoPE is implemented: a scaled one is refused by name."""
    params = raw.get("rope_parameters") or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    scaling = raw.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ConfigError(f"{raw.get('model_type')}: rope type {rope_type!r} is not supported; only the default "
                          "RoPE is (no scaled or extended variant)")
    theta = params.get("rope_theta") or raw.get("rope_theta") or raw.get("rotary_emb_base") or 10000.0
    partial = params.get("partial_rotary_factor") or raw.get("partial_rotary_factor") or raw.get("rotary_pct") or 1.0
    return float(theta), float(partial)


def rotary_dim(head_dim: int, partial: float) -> int:
    """How many of a head's dims RoPE rotates (all, or the first partial · d_k)."""
    return 0 if partial >= 1.0 else int(head_dim * partial)


def activation(raw: dict, key: str, known: dict[str, str], default: str) -> str:
    """Our activation name for config.json's `key`, or a refusal that names the supported ones."""
    name = raw.get(key) or default
    if name not in known:
        raise ConfigError(f"{raw.get('model_type')}: {key} {name!r} is not supported; expected one of {sorted(known)}")
    return known[name]
