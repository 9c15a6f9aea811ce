"""Generation for the Generate tab: the text as the model writes it, and the trace of one generation (its step
views are in trace.py beside this, the KV-cache panel in kv_cache.py).

A generation is recorded as it streams: for every new token the core hands over a Step (core.generate) with the
model's top-10 next-token probabilities, the picked token's rank, and the attention row of the query that
produced it, per layer and head (float16; seq2seq models also their cross-attention row over the source). A
trace and its rows live in the server-wide KeptStore under the session's ticket, counted with their real size, the
rows capped at MAX_TRACE_BYTES per session (later tokens keep their probabilities only); the session's State holds
a TraceRef: the ticket, the model's name and the token ids.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from core.generate import Step
from ui import memory
from ui.services.checks import UserError, check_float, check_range, check_seed
from ui.services.jobs import Turns
from ui.services.kept import KeptRef, KeptStore, nbytes_of, new_ticket
from ui.services.text import as_batch, valid_unicode

MAX_GENERATE_TOKENS = 512
MAX_TEMPERATURE = 2.0  # the slider's end; the API holds to the same
MAX_PROMPT_TOKENS = 2048  # longer prompts keep their end: prefill of 8k tokens takes too long on a small CPU
TOP_PROBS = 10  # next-token probabilities kept per step
MAX_TRACE_BYTES = 32 * 2**20  # float16 attention rows kept per session; later tokens keep probabilities only


def chat_prompt(model, prompt: str) -> str:
    """The instruct model's chat template around one user message, ready for generation."""
    tok = model.tokenizer
    if not getattr(tok, "chat_template", None):
        raise UserError("This model has no chat template; switch chat mode off.")
    return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)


@dataclass
class GenerationUpdate:
    prompt_text: str  # what the model read (chat template included)
    new_text: str  # what it has written so far
    n_new: int
    seconds: float
    done: bool
    stop_reason: str = ""
    note: str = ""  # e.g. how much of a long prompt was cut

    @property
    def tokens_per_second(self) -> float:
        return self.n_new / self.seconds if self.seconds > 0 else 0.0


def generation_reason(model) -> str | None:
    """Why this model cannot generate here (an encoder), or None when it can."""
    if not model.config.causal and not model.config.is_encoder_decoder:
        return (f"This model ({model.config.family}) is an encoder: it reads the whole text in both directions, so "
                "it fills in and encodes text but does not generate (it writes no next token). Pick a decoder model "
                "(e.g. smollm2-135m-instruct) to generate.")
    return None


def stream_generation(
    model,
    prompt: str,
    chat: bool,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    writer: TraceWriter | None = None,
    turns: Turns | None = None,
) -> Iterator[GenerationUpdate]:
    """Yield the text as the model writes it, one update per token. Closing the iterator stops the model.
    With a writer, each step's probabilities and attention rows go to its trace as well. With turns, each token
    is computed in a turn shared with the other generations (ui.services.jobs.Turns). However it ends, the
    allocator's free pages go back to the system (memory.trim), as after any long job."""
    reason = generation_reason(model)
    if reason:
        raise UserError(reason)
    if prompt is None or (isinstance(prompt, str) and not prompt.strip()):
        raise UserError("The prompt is empty.")
    prompt = valid_unicode(prompt)
    max_new_tokens = check_range("Max new tokens", max_new_tokens, 1, MAX_GENERATE_TOKENS)
    temperature = check_float("Temperature", temperature, 0.0, MAX_TEMPERATURE)
    top_p = None if top_p is None else check_float("Top-p", top_p, 0.0, 1.0, low_open=True)
    top_k = None if top_k in (None, "", 0) else check_range("Top-k", top_k, 0, model.config.vocab_size) or None
    seed = check_seed(seed)
    text = chat_prompt(model, prompt) if chat else prompt
    tok = model.tokenizer
    ids = tok(text, add_special_tokens=not chat)["input_ids"]
    room = min(model.config.max_positions - max_new_tokens, MAX_PROMPT_TOKENS)
    if room < 1:
        raise UserError(f"Max new tokens must be below the model's context of {model.config.max_positions}.")
    note = ""
    if len(ids) > room:
        note = (
            f"The prompt has {len(ids):,} tokens; only its last {room:,} are used "
            f"({len(ids) - room:,} dropped from the start)."
        )
        ids = ids[-room:]  # keep the end of a long prompt: it is what the continuation follows
        text = tok.decode(ids)
    if writer is not None:
        writer.begin(ids)
    stream = model.stream(
        as_batch(ids, model.device),
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p if top_p is not None and top_p < 1.0 else None,
        seed=seed,
        capture_attention=writer is not None,
        top_probs=TOP_PROBS if writer is not None else 0,
    )
    new: list[int] = []
    started = time.perf_counter()
    try:
        while True:
            with turns.turn() if turns is not None else contextlib.nullcontext():
                step = next(stream, None)
            if step is None:
                break
            if writer is not None:
                writer.record(step)
            new.append(int(step.token))
            yield GenerationUpdate(
                text,
                tok.decode(new, skip_special_tokens=True),
                len(new),
                time.perf_counter() - started,
                False,
                note=note,
            )
    finally:
        stream.close()
        memory.trim()
    reason = "token budget reached" if len(new) >= max_new_tokens else "end of text"
    yield GenerationUpdate(
        text, tok.decode(new, skip_special_tokens=True), len(new), time.perf_counter() - started, True, reason, note
    )


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
    ticket: str = field(default_factory=new_ticket)  # the session's: the rows live in the KeptStore under it
    trace_id: str = field(default_factory=new_ticket)  # which trace the kept rows belong to
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

    def _kept(self, kept: KeptStore, name: str) -> list[np.ndarray | None]:
        """Per token its rows ([L, H, Tk] self, [L, H, S] cross; float16), None where not kept: past the
        session's cap, or everywhere once the server-wide budget dropped them."""
        bank = kept.get(self.ticket, self._kept_key)
        found = [] if bank is None else bank[name]
        return found + [None] * (len(self.tokens) - len(found))

    def rows(self, kept: KeptStore) -> list[np.ndarray | None]:
        return self._kept(kept, "rows")

    def cross_rows(self, kept: KeptStore) -> list[np.ndarray | None]:
        return self._kept(kept, "cross")

    def rows_kept(self, kept: KeptStore) -> int:
        return sum(r is not None for r in self.rows(kept))

    def rows_dropped(self, kept: KeptStore) -> bool:
        """The server-wide budget dropped this trace's rows (the per-session cap is another matter)."""
        return self.row_bytes > 0 and kept.get(self.ticket, self._kept_key) is None

    def context_ids(self, step: int) -> list[int]:
        """The decoder tokens the query of `step` could see: the prompt (or start token) and earlier tokens."""
        return self.prompt_ids + self.tokens[:step]

    def ref(self) -> TraceRef:
        """What the session's State holds for this trace."""
        return TraceRef(self.ticket, self._kept_key, (len(self.tokens), self.done), self.model_name,
                        tuple(self.tokens))


@dataclass(frozen=True)
class TraceRef(KeptRef):
    """A session's last generation as its State holds it: where the trace lives in the KeptStore, the model that
    wrote it (a backend runs the step view there) and its token ids (the strip's labels): at most
    MAX_GENERATE_TOKENS ints."""

    model_name: str = ""
    tokens: tuple[int, ...] = ()


def find_trace(kept: KeptStore, ref: TraceRef | None) -> GenerationTrace | None:
    """The trace `ref` names, or None: no generation yet, or the server's budget dropped it."""
    bank = kept.find(ref) if isinstance(ref, TraceRef) else None
    return None if bank is None else bank["trace"]


def kept_trace(kept: KeptStore, ref: TraceRef | None) -> GenerationTrace | None:
    """The trace `ref` names; None before any generation, a UserError when the server's budget dropped it."""
    trace = find_trace(kept, ref)
    if trace is None and isinstance(ref, TraceRef) and ref.tokens:
        raise UserError("This session's last generation was dropped to keep the server's memory within its budget "
                        "(the least recently used go first). Generate again to look at its steps.")
    return trace



class TraceWriter:
    """Writes a generation's steps into its trace: ids and probabilities in the trace, rows in the KeptStore."""

    def __init__(self, trace: GenerationTrace, kept: KeptStore, decoder_start: int | None):
        self.trace, self.kept, self.decoder_start = trace, kept, decoder_start

    def begin(self, ids: list[int]) -> None:
        """The prompt as the model reads it (seq2seq: the source, and the decoder starts from its start token); the
        trace takes the session's entry in the KeptStore, replacing the previous trace and its rows."""
        trace = self.trace
        if trace.seq2seq:
            trace.source_ids, trace.prompt_ids = ids, [self.decoder_start]
        else:
            trace.prompt_ids = ids
        bank = {"rows": [], "cross": [], "trace": trace}
        self.kept.put(trace.ticket, trace._kept_key, bank, nbytes_of(bank))

    def record(self, step: Step) -> None:
        trace, kept, key = self.trace, self.kept, self.trace._kept_key
        trace.tokens.append(int(step.token))
        trace.top_ids.append(step.top_ids.cpu().numpy())
        trace.top_probs.append(step.top_probs.float().cpu().numpy())
        trace.chosen_prob.append(float(step.chosen_prob))
        trace.chosen_rank.append(int(step.chosen_rank))
        rows = [step.rows] + ([step.cross_rows] if trace.seq2seq else [])
        size = sum(r.numel() * 2 for r in rows if r is not None)
        bank = kept.get(trace.ticket, key)
        if bank is None:  # the budget dropped this trace: it goes on without rows, and its session recomputes it
            return
        # rows are kept from the first token on, while the session's cap allows; the step's probabilities always
        fits = (step.rows is not None and len(bank["rows"]) == len(trace.tokens) - 1
                and trace.row_bytes + size <= MAX_TRACE_BYTES)
        extra = trace.top_ids[-1].nbytes + trace.top_probs[-1].nbytes + (size if fits else 0)
        if kept.grow(trace.ticket, key, extra) and fits:
            trace.row_bytes += size
            # a copy of its own: the step's rows are a view [..., :Tk] of the whole cache's width, and a kept view
            # would hold all of it (prompt + max new tokens wide), not the size counted against the budgets
            as_numpy = lambda r: None if r is None else r.to(torch.float16).contiguous().cpu().numpy()  # noqa: E731
            bank["rows"].append(as_numpy(step.rows))
            bank["cross"].append(as_numpy(step.cross_rows))


def text_bytes(trace: GenerationTrace) -> int:
    """The trace's texts as nbytes_of counts them, so the KeptStore counts what a stream adds to them."""
    return len(trace.prompt_text) + len(trace.new_text) + len(trace.note) + len(trace.stop_reason)


def settings_key(prompt, chat, max_new_tokens, temperature, top_k, top_p, seed) -> tuple:
    return (prompt, bool(chat), max_new_tokens, temperature, top_k, top_p, seed)


def stream_trace(model, model_name: str, prompt, chat, max_new_tokens, temperature, top_k, top_p,
                 seed, kept: KeptStore, previous: GenerationTrace | None = None, turns: Turns | None = None,
                 ticket: str | None = None) -> Iterator[tuple[GenerationUpdate, GenerationTrace]]:
    """stream_generation's updates, each with the trace so far (the same object, growing). The new trace takes
    over the session's ticket (the previous trace's, or `ticket` when that one was dropped), so it replaces the
    previous trace and its rows in the KeptStore."""
    cfg = model.config
    ticket = previous.ticket if previous is not None else ticket
    trace = GenerationTrace(model_name, settings_key(prompt, chat, max_new_tokens, temperature, top_k, top_p, seed),
                            cfg.is_encoder_decoder, cfg.n_layers, cfg.n_heads, **({"ticket": ticket} if ticket else {}))
    writer = TraceWriter(trace, kept, cfg.decoder_start_token_id)
    for update in stream_generation(model, prompt, chat, max_new_tokens, temperature, top_k, top_p, seed, writer,
                                    turns):
        before = text_bytes(trace)
        trace.prompt_text, trace.new_text, trace.note = update.prompt_text, update.new_text, update.note
        trace.done, trace.stop_reason = update.done, update.stop_reason
        kept.grow(trace.ticket, trace._kept_key, text_bytes(trace) - before)  # the rest as the writer records it
        yield update, trace


def run_trace(model, model_name: str, previous: GenerationTrace | None, prompt, chat, max_new_tokens, temperature,
              top_k, top_p, seed, kept: KeptStore, turns: Turns | None = None, ticket: str | None = None
              ) -> GenerationTrace:
    """The finished trace for these settings: the session's own when it already has it, else a new run, the
    streamed one read to its end, so its tokens take the same turns as every other generation."""
    key = settings_key(prompt, chat, max_new_tokens, temperature, top_k, top_p, seed)
    if previous is not None and previous.done and previous.model_name == model_name and previous.settings == key:
        return previous
    trace = None
    for _, trace in stream_trace(model, model_name, prompt, chat, max_new_tokens, temperature, top_k, top_p, seed,
                                 kept, previous, turns, ticket):
        pass
    return trace


def cap_note(trace: GenerationTrace, kept: KeptStore) -> str:
    rows_kept = trace.rows_kept(kept)
    if rows_kept == len(trace.tokens):
        return ""
    if trace.rows_dropped(kept):
        return ("This trace's attention rows were dropped to keep the server's memory within its budget (the least "
                "recently used go first); its probabilities remain. Generate again to see the rows.")
    return (f"Attention rows are kept for the first {rows_kept} of {len(trace.tokens)} tokens (at most "
            f"{MAX_TRACE_BYTES // 2**20} MB of float16 rows per session); later tokens keep their probabilities.")
