"""The KV cache, counted and timed: its size from the formula 2 · layers · tokens · kv_heads · d_head · bytes
beside the bytes the core allocates, and the same greedy continuation timed with and without the cache (core.generate's
greedy and step_times), with the growth of one step fitted as a power of the length (core.machine.growth, the one fit)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from core import generate as generation
from core.machine.growth import growth
from ui.services.checks import UserError
from ui.services.generation import generation_reason
from ui.services.text import valid_unicode

KV_TIMED_TOKENS = 16  # the continuation timed with and without the cache
KV_MAX_PROMPT = 256  # prompt tokens the KV panel reads (its end): the uncached loop reruns them per token
KV_LENGTHS = (32, 64, 128, 256)  # context lengths at which one step is timed with and without the cache
KV_DECODE_REPEATS = 3  # decode steps timed per length (the median is kept)
KV_GRID_BUDGET_S = 8.0  # a slow or busy machine stops the grid early (it keeps at least two lengths)
def kv_bytes(n_layers: int, tokens: int, kv_heads: int, head_dim: int, bytes_per: int) -> int:
    """The KV cache's size: 2 (keys and values) · layers · tokens · kv_heads · d_head · bytes."""
    return 2 * n_layers * tokens * kv_heads * head_dim * bytes_per


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


@dataclass
class KVSizes:
    tokens: int  # the current length: prompt + the timed continuation (seq2seq: start token + continuation)
    source_tokens: int  # seq2seq: the source the cross-attention cache holds; 0 for decoders
    context: int
    allocated: int  # bytes of the core's KVCache for the current length, read from its tensors
    allocated_dtype: str
    formula_allocated: int  # the formula in that dtype, for the same length: equal to `allocated`
    rows: list[list[str]]  # the table shown in the page
    numbers: dict  # the same in bytes


def encode_prompt(model, prompt) -> list[int]:
    """The prompt's last KV_MAX_PROMPT tokens: the uncached loop reruns all of them for every timed token."""
    if prompt is None or (isinstance(prompt, str) and not prompt.strip()):
        raise UserError("The prompt is empty.")
    ids = model.tokenizer(valid_unicode(prompt))["input_ids"]
    room = min(model.config.max_positions - KV_TIMED_TOKENS, KV_MAX_PROMPT)
    return ids[-room:] if len(ids) > room else ids


def check_generator(model) -> None:
    """A model that generates, so keeps a KV cache, or a UserError in the words of Generate (generation_reason)."""
    reason = generation_reason(model)
    if reason:
        raise UserError(reason)


def kv_sizes(model, source: list[int], decoder: list[int]) -> KVSizes:
    """The formula for this model, for the same model without GQA (one KV head per query head) and with one
    KV head (MQA), in float32 and bfloat16, at the current length and the full context; beside the bytes of
    the cache the core allocates for the current length."""
    cfg = model.config
    seq2seq = cfg.is_encoder_decoder
    n, s = len(decoder), (len(source) if seq2seq else 0)
    cache = generation.filled_cache(model, decoder, source or None)
    dtype_bytes = cache.keys[0].element_size()

    def size(tokens: int, kv_heads: int, bytes_per: int) -> int:  # self-attention + (seq2seq) cross-attention
        return kv_bytes(cfg.n_layers, tokens, kv_heads, cfg.head_dim, bytes_per) + kv_bytes(
            cfg.n_layers, s, kv_heads, cfg.head_dim, bytes_per)

    variants = ((f"this model (H_kv = {cfg.n_kv_heads})", cfg.n_kv_heads),
                (f"no GQA (H_kv = H = {cfg.n_heads})", cfg.n_heads), ("MQA (H_kv = 1)", 1))
    numbers: dict = {"layers": cfg.n_layers, "heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads,
                     "head_dim": cfg.head_dim, "source_tokens": s, "allocated_dtype": str(cache.keys[0].dtype),
                     "lengths": {}}
    rows = []
    for name, tokens in (("current", n), ("full context", cfg.max_positions)):
        entry = {label: {"float32": size(tokens, heads, 4), "bfloat16": size(tokens, heads, 2)}
                 for label, heads in (("model", cfg.n_kv_heads), ("no_gqa", cfg.n_heads), ("mqa", 1))}
        entry["tokens"] = tokens
        entry["allocated"] = cache.nbytes if name == "current" else None
        numbers["lengths"][name] = entry
        row = [f"{name}: {tokens:,} tokens"]
        for label, _ in (("model", 0), ("no_gqa", 0), ("mqa", 0)):
            row += [fmt_bytes(entry[label]["float32"]), fmt_bytes(entry[label]["bfloat16"])]
        row.append(f"{fmt_bytes(cache.nbytes)} ({cache.nbytes:,} B)" if name == "current" else "not allocated here")
        rows.append(row)
    numbers["variants"] = [name for name, _ in variants]
    return KVSizes(n, s, cfg.max_positions, cache.nbytes, str(cache.keys[0].dtype), size(n, cfg.n_kv_heads,
                   dtype_bytes), rows, numbers)


def kv_headers(model) -> list[str]:
    cfg = model.config
    headers = ["length"]
    for name in (f"this model, H_kv = {cfg.n_kv_heads}", f"no GQA, H_kv = {cfg.n_heads}", "MQA, H_kv = 1"):
        headers += [f"{name}: float32", f"{name}: bfloat16"]
    return headers + ["allocated by the core"]


@dataclass
class KVTiming:
    new_tokens: int
    continuation: list[int]  # the tokens written with the cache
    same_tokens: bool  # the cached and uncached loops wrote the same continuation
    cached_seconds: float
    uncached_seconds: float
    step_lengths: list[int]  # context length at each step of the continuation
    cached_steps: list[float]  # seconds per step
    uncached_steps: list[float]
    lengths: list[int]  # the grid
    cached_at: list[float]  # one decode step with the cache, at each grid length (median)
    uncached_at: list[float]  # one pass over all tokens, at each grid length
    cached_exponent: float  # fitted: step time ∝ length^k
    uncached_exponent: float

    @property
    def cached_rate(self) -> float:
        return self.new_tokens / self.cached_seconds if self.cached_seconds > 0 else 0.0

    @property
    def uncached_rate(self) -> float:
        return self.new_tokens / self.uncached_seconds if self.uncached_seconds > 0 else 0.0


def time_kv(model, source: list[int], decoder: list[int], n_new: int = KV_TIMED_TOKENS,
            lengths=KV_LENGTHS) -> KVTiming:
    """The same greedy continuation with and without the cache, then one step of each at growing lengths
    (the context is the prompt's tokens repeated): with the cache a step reads the cached keys, without it a
    step runs every token again."""
    source_ids = source or None
    cached_tokens, cached_steps = generation.greedy(model, decoder, n_new, cached=True, source_ids=source_ids)
    uncached_tokens, uncached_steps = generation.greedy(model, decoder, len(cached_tokens), cached=False,
                                                        source_ids=source_ids)
    grid = [n for n in lengths if n + KV_DECODE_REPEATS <= model.config.max_positions]
    cached_at, uncached_at = [], []
    filler = decoder + cached_tokens
    grid_started = time.perf_counter()
    for index, n in enumerate(grid):
        if index >= 2 and time.perf_counter() - grid_started > KV_GRID_BUDGET_S:
            grid = grid[:index]
            break
        tokens = (filler * (n // len(filler) + 1))[:n]
        uncached, step_times = generation.step_times(model, tokens, KV_DECODE_REPEATS, source_ids=source_ids)
        uncached_at.append(uncached)
        cached_at.append(float(np.median(step_times)))
    start = len(decoder)
    return KVTiming(
        new_tokens=len(cached_tokens),
        continuation=cached_tokens,
        same_tokens=cached_tokens == uncached_tokens,
        cached_seconds=sum(cached_steps),
        uncached_seconds=sum(uncached_steps),
        step_lengths=list(range(start, start + len(cached_tokens))),
        cached_steps=cached_steps,
        uncached_steps=uncached_steps,
        lengths=grid,
        cached_at=cached_at,
        uncached_at=uncached_at,
        cached_exponent=growth(grid, cached_at).exponent,
        uncached_exponent=growth(grid, uncached_at).exponent,
    )


@dataclass
class KVReport:
    sizes: KVSizes
    timing: KVTiming
    note: str

    def numbers(self) -> dict:
        t = self.timing
        return {
            "sizes": self.sizes.numbers,
            "formula_bytes_current": self.sizes.formula_allocated,
            "allocated_bytes_current": self.sizes.allocated,
            "timing": {
                "new_tokens": t.new_tokens, "same_tokens": t.same_tokens,
                "with_cache_seconds": t.cached_seconds, "without_cache_seconds": t.uncached_seconds,
                "with_cache_tokens_per_s": t.cached_rate, "without_cache_tokens_per_s": t.uncached_rate,
                "lengths": t.lengths, "with_cache_step_seconds": t.cached_at,
                "without_cache_step_seconds": t.uncached_at,
                "with_cache_exponent": t.cached_exponent, "without_cache_exponent": t.uncached_exponent,
            },
        }


def window_note(cfg) -> str:
    """What a sliding window changes in the cache: which layers read only their last w keys, though all are kept."""
    sliding = [i for i in range(cfg.n_layers) if cfg.layer_type(i) == "sliding"]
    if not sliding or cfg.sliding_window is None:
        return ""
    where = "Every layer" if len(sliding) == cfg.n_layers else f"Layers {', '.join(map(str, sliding))}"
    return (f"  \n{where} read only the last {cfg.sliding_window} keys (a sliding window in the mask); the core's "
            "cache still keeps every token for them, so the size above counts every token in every layer.")


def kv_report(model, prompt) -> KVReport:
    """The KV panel for one prompt: sizes (formula and allocation) and the timing with and without the cache."""
    check_generator(model)
    ids = encode_prompt(model, prompt)
    cut = len(model.tokenizer(valid_unicode(prompt))["input_ids"]) > len(ids)
    cfg = model.config
    source, decoder = (ids, [cfg.decoder_start_token_id]) if cfg.is_encoder_decoder else ([], ids)
    timing = time_kv(model, source, decoder)
    sizes = kv_sizes(model, source, decoder + timing.continuation)
    d = cfg.head_dim
    cross = (f" + the cross-attention cache of the {sizes.source_tokens} source tokens, 2 · L · S · H_kv · d_head "
             "· bytes" if cfg.is_encoder_decoder else "")
    k = timing.uncached_exponent
    note = (
        f"**Size** = 2 · layers · tokens · kv_heads · d_head · bytes = 2 · {cfg.n_layers} · {sizes.tokens} · "
        f"{cfg.n_kv_heads} · {d} · bytes{cross}. The core allocated **{sizes.allocated:,} bytes** "
        f"({sizes.allocated_dtype}) for {sizes.tokens} tokens; the formula gives {sizes.formula_allocated:,}.  \n"
        f"**Speed**, the same {timing.new_tokens} greedy tokens"
        f"{'' if timing.same_tokens else ' (the two loops disagreed on a token: float rounding)'}: "
        f"**{timing.cached_rate:.1f} tokens/s** with the cache, **{timing.uncached_rate:.1f} tokens/s** without "
        f"({timing.uncached_seconds / max(timing.cached_seconds, 1e-9):.1f}× slower).  \n"
        f"**Growth**: one step without the cache runs all n tokens again; measured at n = "
        f"{', '.join(map(str, timing.lengths))}, its time grows as n^{k:.2f}, so writing n tokens costs the sum of "
        f"those steps, about n^{k + 1:.2f} (k ≈ 1 gives the quadratic cost); with the cache a step grows as "
        f"n^{timing.cached_exponent:.2f}."
        + (f"  \nThe prompt is read up to its last {len(ids)} tokens here." if cut else "")
        + window_note(cfg)
    )
    return KVReport(sizes, timing, note)
