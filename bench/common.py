"""Shared by the benchmark scripts: loading both implementations on the same weights, timing, printing."""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import load_model  # noqa: E402
from core.store import ensure  # noqa: E402

TEXT = (Path(__file__).resolve().parent.parent / "assets" / "examples" / "attention.txt")


def load_both(name: str, device: str, dtype: torch.dtype, attn_implementation: str = "sdpa"):
    from transformers import AutoModelForCausalLM
    folder = ensure(name)
    ours = load_model(folder, device=device, dtype=dtype)
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation)
    return ours, theirs.to(device).eval(), folder


def long_ids(tokenizer, n: int) -> torch.Tensor:
    """n real tokens of English text (the example text repeated), [1, n]."""
    text = TEXT.read_text(encoding="utf-8") if TEXT.is_file() else "Attention lets every token look at every other token. "
    ids = tokenizer(text, add_special_tokens=False).input_ids
    while len(ids) < n:
        ids = ids + ids
    return torch.tensor([ids[:n]])


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str) -> tuple[float, object]:
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return time.perf_counter() - start, result


def median(values) -> float:
    return statistics.median(values)


def row(*cells, widths=(34, 16, 16, 10)) -> str:
    return "".join(str(c).ljust(w) for c, w in zip(cells, widths))
