"""The Generate tab's step-by-step view and its KV-cache panel: plain Python over core, no gradio.

A generation is recorded as it streams (`stream_trace`): for every new token the core hands over the model's
top-10 next-token probabilities, the picked token's rank, and the attention row of the query that produced it,
per layer and head (float16; seq2seq models also their cross-attention row over the source). The rows of one
session's trace are capped at MAX_TRACE_BYTES; later tokens keep their probabilities only. The KV panel
computes the cache's size from its formula, reads what the core allocates, and times decoding with and
without the cache.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from core import generate as generation
from core.model import KVCache
from ui import export, service
from ui.service import UserError, check_range

TOP_PROBS = 10  # next-token probabilities kept per step
MAX_TRACE_BYTES = 32 * 2**20  # float16 attention rows kept per session; later tokens keep probabilities only
MAX_EXPORT_BYTES = 50_000_000  # the JSON download stays below this
OVERVIEW_KEYS = 256  # the layers × heads overview of one row pools its keys into at most this many blocks
KV_TIMED_TOKENS = 16  # the continuation timed with and without the cache
KV_MAX_PROMPT = 256  # prompt tokens the KV panel reads (its end): the uncached loop reruns them per token
KV_LENGTHS = (32, 64, 128, 256)  # context lengths at which one step is timed with and without the cache
KV_DECODE_REPEATS = 3  # decode steps timed per length (the median is kept)
KV_GRID_BUDGET_S = 8.0  # a slow or busy machine stops the grid early (it keeps at least two lengths)


# ---------------------------------------------------------------- the trace of one generation


@dataclass(eq=False)
class GenerationTrace:
    """One session's last generation, token by token. For a decoder the context of step i is the prompt and
    tokens[:i]; for seq2seq it is the decoder start token and tokens[:i], and the source is `source_ids`."""

    model_name: str
    settings: tuple  # (prompt, chat, max new tokens, temperature, top-k, top-p, seed) as given
    seq2seq: bool
    n_layers: int
    n_heads: int
    prompt_ids: list[int] = field(default_factory=list)  # decoder: the prompt as read; seq2seq: [start token]
    source_ids: list[int] = field(default_factory=list)  # seq2seq: the source the encoder read
    tokens: list[int] = field(default_factory=list)
    ticket: str = field(default_factory=service.new_ticket)  # the session's: the rows live in service.KEPT under it
    trace_id: str = field(default_factory=service.new_ticket)  # which trace the kept rows belong to
    top_ids: list[np.ndarray] = field(default_factory=list)  # per token [10]
    top_probs: list[np.ndarray] = field(default_factory=list)  # per token [10]
    chosen_prob: list[float] = field(default_factory=list)
    chosen_rank: list[int] = field(default_factory=list)
    row_bytes: int = 0
    prompt_text: str = ""
    new_text: str = ""
    done: bool = False
    stop_reason: str = ""
    note: str = ""

    def __hash__(self) -> int:
        # Gradio notices a changed State by its hash: a trace that grew is a new value for the page
        return hash((id(self), len(self.tokens), self.done))

    @property
    def _kept_key(self) -> tuple:
        return ("generation", self.trace_id)

    def _kept(self, name: str) -> list[np.ndarray | None]:
        """Per token its rows ([L, H, Tk] self, [L, H, S] cross; float16), None where not kept: past the
        session's cap, or everywhere once the server-wide budget dropped them."""
        bank = service.KEPT.get(self.ticket, self._kept_key)
        kept = [] if bank is None else bank[name]
        return kept + [None] * (len(self.tokens) - len(kept))

    @property
    def rows(self) -> list[np.ndarray | None]:
        return self._kept("rows")

    @property
    def cross_rows(self) -> list[np.ndarray | None]:
        return self._kept("cross")

    @property
    def rows_kept(self) -> int:
        return sum(r is not None for r in self.rows)

    @property
    def rows_dropped(self) -> bool:
        """The server-wide budget dropped this trace's rows (the per-session cap is another matter)."""
        return self.row_bytes > 0 and service.KEPT.get(self.ticket, self._kept_key) is None

    def context_ids(self, step: int) -> list[int]:
        """The decoder tokens the query of `step` could see: the prompt (or start token) and earlier tokens."""
        return self.prompt_ids + self.tokens[:step]

    def record(self, step: generation.Step) -> None:
        self.tokens.append(int(step.token))
        self.top_ids.append(step.top_ids.cpu().numpy())
        self.top_probs.append(step.top_probs.float().cpu().numpy())
        self.chosen_prob.append(float(step.chosen_prob))
        self.chosen_rank.append(int(step.chosen_rank))
        rows = [step.rows] + ([step.cross_rows] if self.seq2seq else [])
        size = sum(r.numel() * 2 for r in rows if r is not None)
        if len(self.tokens) == 1:  # the first token: the session's earlier rows give way to this trace's
            service.KEPT.put(self.ticket, self._kept_key, {"rows": [], "cross": []}, 0)
        bank = service.KEPT.get(self.ticket, self._kept_key)
        # rows are kept from the first token on, while the session's cap and the server's budget allow
        keep = (step.rows is not None and bank is not None and len(bank["rows"]) == len(self.tokens) - 1
                and self.row_bytes + size <= MAX_TRACE_BYTES and service.KEPT.grow(self.ticket, self._kept_key, size))
        if keep:
            self.row_bytes += size
            as_numpy = lambda r: None if r is None else r.to(torch.float16).cpu().numpy()  # noqa: E731
            bank["rows"].append(as_numpy(step.rows))
            bank["cross"].append(as_numpy(step.cross_rows))


class _RecordingModel:
    """Stands in for the model inside service.stream_generation, which keeps doing the checks, the prompt's
    cut and the timing: its stream asks the core for each step's attention rows and probabilities, records
    them in the trace, and passes the token on."""

    def __init__(self, model, trace: GenerationTrace):
        self._model, self._trace = model, trace

    def __getattr__(self, name):
        return getattr(self._model, name)

    def stream(self, input_ids, max_new_tokens, **options):
        ids = input_ids[0].tolist()
        if self._trace.seq2seq:
            self._trace.source_ids, self._trace.prompt_ids = ids, [self._model.config.decoder_start_token_id]
        else:
            self._trace.prompt_ids = ids
        inner = self._model.stream(input_ids, max_new_tokens, capture_attention=True, top_probs=TOP_PROBS, **options)
        try:
            for step in inner:
                self._trace.record(step)
                yield step.token
        finally:
            close = getattr(inner, "close", None)
            if close:
                close()


def settings_key(prompt, chat, max_new_tokens, temperature, top_k, top_p, seed) -> tuple:
    return (prompt, bool(chat), max_new_tokens, temperature, top_k, top_p, seed)


def stream_trace(model, model_name: str, prompt, chat, max_new_tokens, temperature, top_k, top_p,
                 seed, previous: GenerationTrace | None = None,
                 ) -> Iterator[tuple[service.GenerationUpdate, GenerationTrace]]:
    """service.stream_generation's updates, each with the trace so far (the same object, growing). The new trace
    takes over the session's ticket, so its rows replace the previous trace's in service.KEPT."""
    cfg = model.config
    ticket = {} if previous is None else {"ticket": previous.ticket}
    trace = GenerationTrace(model_name, settings_key(prompt, chat, max_new_tokens, temperature, top_k, top_p, seed),
                            cfg.is_encoder_decoder, cfg.n_layers, cfg.n_heads, **ticket)
    for update in service.stream_generation(_RecordingModel(model, trace), prompt, chat, max_new_tokens,
                                            temperature, top_k, top_p, seed):
        trace.prompt_text, trace.new_text, trace.note = update.prompt_text, update.new_text, update.note
        trace.done, trace.stop_reason = update.done, update.stop_reason
        yield update, trace


def run_trace(model, model_name: str, previous: GenerationTrace | None, prompt, chat, max_new_tokens, temperature,
              top_k, top_p, seed) -> GenerationTrace:
    """The finished trace for these settings: the session's own when it already has it, else a new run."""
    key = settings_key(prompt, chat, max_new_tokens, temperature, top_k, top_p, seed)
    if previous is not None and previous.done and previous.model_name == model_name and previous.settings == key:
        return previous
    trace = None
    for _, trace in stream_trace(model, model_name, prompt, chat, max_new_tokens, temperature, top_k, top_p, seed,
                                 previous):
        pass
    return trace


def cap_note(trace: GenerationTrace) -> str:
    if trace.rows_kept == len(trace.tokens):
        return ""
    if trace.rows_dropped:
        return ("This trace's attention rows were dropped to keep the server's memory within its budget (the least "
                "recently used go first); its probabilities remain. Generate again to see the rows.")
    return (f"Attention rows are kept for the first {trace.rows_kept} of {len(trace.tokens)} tokens (at most "
            f"{MAX_TRACE_BYTES // 2**20} MB of float16 rows per session); later tokens keep their probabilities.")


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def pick_sentence(model, trace: GenerationTrace, step: int) -> str:
    token = service.token_texts(model, [trace.tokens[step]])[0]
    rank, p = trace.chosen_rank[step], trace.chosen_prob[step]
    where = "the most likely" if rank == 1 else f"the {ordinal(rank)} most likely"
    return f"The picked token {token!r} was {where}, p = {p:.3g}."


def trace_summary(model, trace: GenerationTrace) -> dict:
    """Per generated token: its text, the model's top-10 next tokens with probabilities, the picked one's rank."""
    steps = []
    for i, token in enumerate(trace.tokens):
        names = service.token_texts(model, trace.top_ids[i].tolist())
        steps.append({
            "step": i,
            "token": service.token_texts(model, [token])[0],
            "token_id": token,
            "probability": round(trace.chosen_prob[i], 6),
            "rank": trace.chosen_rank[i],
            "top": [{"token": n, "id": int(t), "p": round(float(p), 6)}
                    for n, t, p in zip(names, trace.top_ids[i], trace.top_probs[i])],
        })
    return {
        "model": trace.model_name,
        "prompt": trace.prompt_text,
        "continuation": trace.new_text,
        "n_tokens": len(trace.tokens),
        "stop_reason": trace.stop_reason,
        "attention_rows_kept": trace.rows_kept,
        "attention_rows_cap_bytes": MAX_TRACE_BYTES,
        "steps": steps,
    }


# ---------------------------------------------------------------- one step


@dataclass
class StepView:
    step: int
    layer: int
    head: int
    token: str
    sentence: str  # where the picked token ranked
    top_tokens: list[str]
    top_probs: np.ndarray  # [10]
    chosen_in_top: int | None  # its index among the top 10, None when it ranked lower
    keys: list[str]  # unique labels of the context tokens ("12 the")
    rows: np.ndarray | None  # [L, H, Tk] float32, None past the cap
    pieces: list[str]  # the decoder sequence's own text: prompt (or start) + every generated token
    source_keys: list[str] = field(default_factory=list)  # seq2seq
    cross_rows: np.ndarray | None = None  # [L, H, S]
    source_pieces: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def head_row(self) -> np.ndarray | None:
        return None if self.rows is None else self.rows[self.layer, self.head]

    @property
    def mean_row(self) -> np.ndarray | None:
        return None if self.rows is None else self.rows[self.layer].mean(0)

    def numbers(self) -> dict:
        """The rows of the chosen layer as plain lists, for the API."""
        out = {"step": self.step, "token": self.token, "layer": self.layer, "head": self.head,
               "keys": self.keys, "head_row": None, "mean_row": None, "note": self.note}
        if self.rows is not None:
            out["head_row"] = self.head_row.tolist()
            out["mean_row"] = self.mean_row.tolist()
        if self.cross_rows is not None:
            out["source_keys"] = self.source_keys
            out["cross_head_row"] = self.cross_rows[self.layer, self.head].tolist()
            out["cross_mean_row"] = self.cross_rows[self.layer].mean(0).tolist()
        return out


def check_trace(trace: GenerationTrace | None) -> GenerationTrace:
    if trace is None or not trace.tokens:
        raise UserError("Generate something first: the step view reads this session's last generation.")
    return trace


def position_labels(model, ids: list[int], start: int = 0) -> list[str]:
    return [f"{start + i} {t}" for i, t in enumerate(service.token_texts(model, ids))]


def step_view(model, trace: GenerationTrace | None, step, layer, head) -> StepView:
    """The chosen token's attention over its context (and source), its probabilities, for one layer and head."""
    trace = check_trace(trace)
    step = check_range("Step", step, 0, len(trace.tokens) - 1)
    layer = check_range("Layer", layer, 0, trace.n_layers - 1)
    head = check_range("Head", head, 0, trace.n_heads - 1)
    top = trace.top_ids[step].tolist()
    chosen = trace.tokens[step]
    decoder_ids = trace.prompt_ids + trace.tokens
    rows = trace.rows[step]
    view = StepView(
        step=step, layer=layer, head=head,
        token=service.token_texts(model, [chosen])[0],
        sentence=pick_sentence(model, trace, step),
        top_tokens=service.token_texts(model, top),
        top_probs=trace.top_probs[step].astype(np.float32),
        chosen_in_top=top.index(chosen) if chosen in top else None,
        keys=position_labels(model, trace.context_ids(step)),
        rows=None if rows is None else rows.astype(np.float32),
        pieces=service.token_pieces(model, decoder_ids),
    )
    if trace.seq2seq:
        view.source_keys = position_labels(model, trace.source_ids)
        view.source_pieces = service.token_pieces(model, trace.source_ids)
        cross = trace.cross_rows[step]
        view.cross_rows = None if cross is None else cross.astype(np.float32)
    if rows is None:
        view.note = cap_note(trace)
    return view


def pooled_overview(rows: np.ndarray, keys: list[str]) -> tuple[np.ndarray, list[str]]:
    """[L, H, Tk] → [L·H, Sk] with keys pooled to at most OVERVIEW_KEYS blocks (each a block's summed weight),
    and the keys' labels ("12 the", or "0–15" for a block)."""
    flat = rows.reshape(-1, rows.shape[-1])
    if rows.shape[-1] <= OVERVIEW_KEYS:
        return flat, keys
    edges = service.pool_edges(rows.shape[-1], OVERVIEW_KEYS)
    pooled = np.add.reduceat(flat, edges[:-1], axis=-1)
    return pooled, [f"{a}–{b - 1}" for a, b in zip(edges[:-1], edges[1:])]


# ---------------------------------------------------------------- the JSON download


def export_trace(model, trace: GenerationTrace | None, folder: str | Path | None = None) -> tuple[Path, str]:
    """The trace as a JSON file (tokens, probabilities, attention rows) under MAX_EXPORT_BYTES, and a note
    saying what was pooled to fit. Rows go per head when they fit, else the mean over heads, else that mean
    with keys pooled into blocks, else none."""
    trace = check_trace(trace)
    data = trace_summary(model, trace)
    data["context_tokens"] = service.token_texts(model, trace.prompt_ids)
    if trace.seq2seq:
        data["source_tokens"] = service.token_texts(model, trace.source_ids)
    levels = (("per head", "nothing"), ("mean over heads", "each layer's heads averaged"),
              ("mean over heads, keys pooled", f"heads averaged and keys pooled into at most {OVERVIEW_KEYS} blocks"),
              ("none", "attention rows left out: even pooled they exceed the limit"))
    for layout, pooled in levels:
        data["attention"] = {"layout": layout, "pooled": pooled, "kept_for_steps": trace.rows_kept,
                             "dims": attention_dims(layout, trace.seq2seq),
                             "self": [export_rows(r, layout) for r in trace.rows]}
        if trace.seq2seq:
            data["attention"]["cross"] = [export_rows(r, layout) for r in trace.cross_rows]
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        if len(text.encode("utf-8")) < MAX_EXPORT_BYTES:
            break
    name = export.filename(trace.model_name, f"generation-trace-{time.strftime('%Y%m%d-%H%M%S')}") + ".json"
    path = export.write(text, name, root=Path(folder) if folder else None)  # removed with the other exports
    size = path.stat().st_size
    note = (f"**{path.name}**: {len(trace.tokens)} tokens, {size / 1e6:.2f} MB; attention rows {layout}"
            + ("" if pooled == "nothing" else f" (pooled: {pooled})") + ".")
    if trace.rows_kept < len(trace.tokens):
        note += " " + cap_note(trace)
    return path, note


def attention_dims(layout: str, seq2seq: bool) -> str:
    keys = "keys: the context (prompt, or start token, and earlier tokens)" + ("; cross: the source" if seq2seq else "")
    return {"per head": f"[layer][head][key]; {keys}", "mean over heads": f"[layer][key]; {keys}",
            "mean over heads, keys pooled": f"[layer][block of keys]; {keys}", "none": ""}[layout]


def export_rows(rows: np.ndarray | None, layout: str):
    if rows is None or layout == "none":
        return None
    rows = rows.astype(np.float32)
    if layout != "per head":
        rows = rows.mean(1)  # [L, Tk]
        if layout.endswith("pooled") and rows.shape[-1] > OVERVIEW_KEYS:
            edges = service.pool_edges(rows.shape[-1], OVERVIEW_KEYS)
            rows = np.add.reduceat(rows, edges[:-1], axis=-1)
    return np.round(rows, 5).tolist()


# ---------------------------------------------------------------- the KV cache


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
    ids = model.tokenizer(service.valid_unicode(prompt))["input_ids"]
    room = min(model.config.max_positions - KV_TIMED_TOKENS, KV_MAX_PROMPT)
    return ids[-room:] if len(ids) > room else ids


def check_generator(model) -> None:
    if not model.config.causal and not model.config.is_encoder_decoder:
        raise UserError(f"{model.config.family} here is an encoder: it keeps no KV cache because it does not "
                        "generate. Pick a decoder model.")


def allocated_cache(model, source: list[int], decoder: list[int]) -> KVCache:
    """The core's own KVCache for this many decoder tokens, filled by a prefill (a seq2seq model's
    cross-attention keys and values of the source included)."""
    memory, ctx = encoder_memory(model, source)
    cache = model.new_cache(1, len(decoder))
    with torch.inference_mode():
        generation.prefill(model, service.as_batch(decoder, model.device), None, cache, **ctx)
    return cache


def encoder_memory(model, source: list[int]):
    if not model.config.is_encoder_decoder:
        return None, {}
    with torch.inference_mode():
        memory = model.run_stack(model.encoder, service.as_batch(source, model.device), None, kind="encoder",
                                 causal=False)
    return memory, dict(memory=memory, memory_mask=None)


def kv_sizes(model, source: list[int], decoder: list[int]) -> KVSizes:
    """The formula for this model, for the same model without GQA (one KV head per query head) and with one
    KV head (MQA), in float32 and bfloat16, at the current length and the full context; beside the bytes of
    the cache the core allocates for the current length."""
    cfg = model.config
    seq2seq = cfg.is_encoder_decoder
    n, s = len(decoder), (len(source) if seq2seq else 0)
    cache = allocated_cache(model, source, decoder)
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


def _clock(model) -> float:
    """perf_counter once the device has finished its queued work (a GPU runs asynchronously)."""
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return time.perf_counter()


def _last_logits(model, tokens: list[int], cache, ctx: dict) -> torch.Tensor:
    return generation.prefill(model, service.as_batch(tokens, model.device), None, cache, **ctx)


def _continue(model, decoder: list[int], n_new: int, ctx: dict, cached: bool) -> tuple[list[int], list[float]]:
    """Greedy continuation of `decoder` by n_new tokens, with the core's KV cache (prefill, then one-token
    decode steps) or without (every step runs all tokens so far through the model). Seconds per step."""
    eos = set(model.config.eos_ids or [])
    tokens, times = list(decoder), []
    cache = model.new_cache(1, len(decoder) + n_new) if cached else None
    with torch.inference_mode():
        for i in range(n_new):
            started = _clock(model)
            if not cached or i == 0:
                logits = _last_logits(model, tokens, cache, ctx)
            else:
                logits = generation.decode_step(model, service.as_batch(tokens[-1:], model.device), cache, None,
                                                **ctx)
                cache.advance(1)
            token = int(logits.argmax(-1)[0])
            times.append(_clock(model) - started)
            tokens.append(token)
            if token in eos:
                break
    return tokens[len(decoder):], times


def fitted_exponent(lengths, seconds) -> float:
    """k in seconds ∝ length^k, least squares on log-log."""
    x, y = np.log(np.asarray(lengths, float)), np.log(np.maximum(np.asarray(seconds, float), 1e-9))
    return float(np.polyfit(x, y, 1)[0]) if len(x) >= 2 else math.nan


def time_kv(model, source: list[int], decoder: list[int], n_new: int = KV_TIMED_TOKENS,
            lengths=KV_LENGTHS) -> KVTiming:
    """The same greedy continuation with and without the cache, then one step of each at growing lengths
    (the context is the prompt's tokens repeated): with the cache a step reads the cached keys, without it a
    step runs every token again."""
    _, ctx = encoder_memory(model, source)
    cached_tokens, cached_steps = _continue(model, decoder, n_new, ctx, cached=True)
    uncached_tokens, uncached_steps = _continue(model, decoder, len(cached_tokens), ctx, cached=False)
    grid = [n for n in lengths if n + KV_DECODE_REPEATS <= model.config.max_positions]
    cached_at, uncached_at = [], []
    filler = decoder + cached_tokens
    grid_started = time.perf_counter()
    for index, n in enumerate(grid):
        if index >= 2 and time.perf_counter() - grid_started > KV_GRID_BUDGET_S:
            grid = grid[:index]
            break
        tokens = (filler * (n // len(filler) + 1))[:n]
        with torch.inference_mode():
            started = _clock(model)
            _last_logits(model, tokens, None, ctx)
            uncached_at.append(_clock(model) - started)
            cache = model.new_cache(1, n + KV_DECODE_REPEATS)
            _last_logits(model, tokens, cache, ctx)
            step_times = []
            for _ in range(KV_DECODE_REPEATS):
                started = _clock(model)
                generation.decode_step(model, service.as_batch(tokens[-1:], model.device), cache, None, **ctx)
                cache.advance(1)
                step_times.append(_clock(model) - started)
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
        cached_exponent=fitted_exponent(grid, cached_at),
        uncached_exponent=fitted_exponent(grid, uncached_at),
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


def kv_report(model, prompt) -> KVReport:
    """The KV panel for one prompt: sizes (formula and allocation) and the timing with and without the cache."""
    check_generator(model)
    ids = encode_prompt(model, prompt)
    cut = len(model.tokenizer(service.valid_unicode(prompt))["input_ids"]) > len(ids)
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
    )
    return KVReport(sizes, timing, note)
