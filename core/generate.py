"""Generation: a preallocated KV cache, one prefill step, then one-token decode steps; sampling; streaming.

Without the cache every new token would recompute keys and values for the whole prefix (quadratic work);
with it, a decode step computes one query, one key and one value per layer and reads the rest from memory.
greedy, filled_cache and step_times show that difference on one sequence: the same tokens either way, the
bytes the cache takes, the seconds a step takes.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import Tensor

from .attention import padding_or_none
from .kv_cache import KVCache, RollingKVCache
from .attention import RowRecorder


@dataclass
class Sampling:
    temperature: float = 0.0          # 0: greedy (argmax)
    top_k: int | None = None          # keep the k most likely tokens
    top_p: float | None = None        # keep the smallest set whose probability reaches p (nucleus)
    repetition_penalty: float = 1.0   # > 1 makes tokens already in the text less likely
    seed: int | None = None

    def check(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be ≥ 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be ≥ 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


def penalise_repeats(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """Divide positive (multiply negative) logits of tokens already seen by `penalty`. seen: [B, V] bool."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def filter_top_k(logits: Tensor, k: int) -> Tensor:
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: Tensor, p: float) -> Tensor:
    """Keep the most likely tokens until their probability reaches p; the first one always stays."""
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(-1) - probs
    drop_sorted = mass_before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def next_token(logits: Tensor, sampling: Sampling, seen: Tensor | None, generator: torch.Generator | None) -> Tensor:
    """logits [B, V] → token ids [B]."""
    logits = logits.float()
    if seen is not None:
        logits = penalise_repeats(logits, seen, sampling.repetition_penalty)
    if sampling.temperature == 0:
        return logits.argmax(-1)
    logits = logits / sampling.temperature
    if sampling.top_k is not None:
        logits = filter_top_k(logits, sampling.top_k)
    if sampling.top_p is not None and sampling.top_p < 1:
        logits = filter_top_p(logits, sampling.top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@dataclass
class Step:
    """One new token and what produced it, for a batch [B]: what stream yields (row 0 of it for a single
    sequence, its token an int). Probabilities are the model's own, softmax of the logits at temperature 1,
    before any sampling filter, so they show where a sampled token ranked."""
    token: Tensor | int              # [B] the token that was picked
    rows: Tensor | None              # [B, L, H, Tk] float16: self-attention of the query that produced it
    cross_rows: Tensor | None        # [B, L, H, S] float16: its cross-attention over the source (seq2seq)
    top_ids: Tensor | None           # [B, k] the k most likely next tokens, most likely first
    top_probs: Tensor | None         # [B, k] their probabilities
    chosen_prob: Tensor | None       # [B] the picked token's probability
    chosen_rank: Tensor | None       # [B] its rank: 1 = the most likely

    def row(self, index: int) -> "Step":
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return Step(*(pick(t) for t in (self.token, self.rows, self.cross_rows, self.top_ids, self.top_probs,
                                        self.chosen_prob, self.chosen_rank)))


def rank_of(logits: Tensor, token: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The model's top-k next tokens and probabilities [B, k], the picked token's probability and rank [B]
    (1 + how many tokens are strictly more likely). All on the device: nothing is read back to the host."""
    probs = torch.softmax(logits.float(), dim=-1)                      # [B, V]
    top = torch.topk(probs, min(k, probs.shape[-1]), dim=-1)
    chosen = probs.gather(-1, token[:, None])                           # [B, 1]
    rank = (probs > chosen).sum(-1) + 1
    return top.indices, top.values, chosen[:, 0], rank


def token_budget(model, prompt_len: int, max_new_tokens: int) -> int:
    """How many new tokens fit in the model's positions after a prompt of prompt_len."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    room = model.config.max_positions - prompt_len
    if room <= 0 and not model.config.is_encoder_decoder:
        raise ValueError(f"the prompt has {prompt_len} tokens but the model has only {model.config.max_positions} "
                         "positions; shorten the prompt")
    return max_new_tokens if model.config.is_encoder_decoder else min(max_new_tokens, room)


def prefill(model, tokens: Tensor, mask: Tensor | None, cache, observer=None, **context) -> Tensor:
    """The prompt [B, T] through the decoder, written to the cache → logits of the last position [B, vocab]."""
    hidden = model.run_stack(model.stack, tokens, mask, kind="self", causal=model.config.causal, cache=cache,
                             observer=observer, **context)
    return model.logits(hidden[:, -1:])[:, -1]


def decode_step(model, tokens: Tensor, cache, observer=None, **context) -> Tensor:
    """One new token per row [B, 1] at cache.slot → logits [B, vocab]. Every shape is fixed and nothing is
    read back to the host, so torch.compile makes it one graph (CUDA graphs on a GPU); the caller advances
    the cache afterwards."""
    hidden = model.run_stack(model.stack, tokens, None, kind="self", cache=cache, static=True, observer=observer,
                             **context)
    return model.logits(hidden)[:, -1]


class CompiledDecoding:
    """The model's compiled one-token step and the cache it reads, built on first use (compile=True) and kept
    between generations. The cache's length is rounded up to a multiple of 256, so that other prompt lengths
    reuse the same graph and the same addresses (a CUDA graph reads them)."""

    def __init__(self):
        self.cache: KVCache | None = None
        self.step: Callable | None = None   # decode_step through torch.compile

    def cache_for(self, model, batch: int, max_len: int) -> KVCache:
        """The kept cache, emptied, or a new one when the batch, the rounded length or the dtype changed."""
        max_len = -(-max_len // 256) * 256
        cache = self.cache
        if cache is None or cache.key_mask.shape != (batch, max_len) or cache.keys[0].dtype != model.dtype:
            cache = self.cache = model.new_cache(batch, max_len)
        cache.reset()
        return cache

    def step_for(self, model, cache: KVCache) -> Callable:
        """decode_step through torch.compile (CUDA graphs on a GPU: mode "reduce-overhead"), built once. The
        cache's tensors are marked as fixed addresses, as a CUDA graph reads them in place. Compiling takes
        minutes on a small CPU, so it is asked for (compile=True), not the default."""
        for t in cache.keys + cache.values + [cache.key_mask, cache.slot, cache.next_position]:
            torch._dynamo.mark_static_address(t)
        if self.step is None:
            mode = "reduce-overhead" if model.device.type == "cuda" else None
            self.step = torch.compile(decode_step, mode=mode, fullgraph=True)
        return self.step


def generation_cache(model, batch: int, max_len: int, compile: bool) -> KVCache:
    """A KV cache for one generation: the compiled step's kept one (see CompiledDecoding), else a new one."""
    return model.decoding.cache_for(model, batch, max_len) if compile else model.new_cache(batch, max_len)


def steps(model, input_ids: Tensor, max_new_tokens: int, sampling: Sampling, attention_mask: Tensor | None = None,
          stop: list[str] | str | None = None, capture_attention: bool = False,
          compile: bool = False, top_probs: int = 0) -> Iterator[Step]:
    """Yield a Step for each new token, until every row has produced an end-of-sequence token, a stop string
    appeared, or the budget is spent. capture_attention fills its rows (and cross_rows for seq2seq);
    top_probs > 0 its probabilities, computed outside the decode step and left on the device."""
    sampling.check()
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [batch, tokens] with at least one token, got shape {list(input_ids.shape)}")
    cfg, device = model.config, model.device
    input_ids = input_ids.to(device)
    attention_mask = padding_or_none(attention_mask.to(device) if attention_mask is not None else None)
    batch, prompt_len = input_ids.shape
    budget = token_budget(model, prompt_len, max_new_tokens)
    if budget == 0:
        return
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if stops and model.tokenizer is None:
        raise ValueError("stop strings need a tokenizer; this model folder has none")
    generator = None
    if sampling.seed is not None:
        generator = torch.Generator(device=device).manual_seed(sampling.seed)
    eos = torch.tensor(cfg.eos_ids or [-1], device=device)
    recorder = RowRecorder() if capture_attention else None
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    generated: list[Tensor] = []
    with torch.inference_mode():
        if cfg.is_encoder_decoder:
            # the encoder runs once; each decoder layer caches its cross-attention keys/values on the first step
            memory = model.run_stack(model.encoder, input_ids, attention_mask, kind="encoder", causal=False)
            cache = generation_cache(model, batch, budget + 1, compile)
            tokens = torch.full((batch, 1), cfg.decoder_start_token_id, device=device)
            context = dict(memory=memory, memory_mask=attention_mask)
            prompt_mask = None
        else:
            cache = generation_cache(model, batch, prompt_len + budget, compile)
            tokens, context, prompt_mask = input_ids, {}, attention_mask
        seen = None
        if sampling.repetition_penalty != 1.0:
            seen = torch.zeros(batch, cfg.vocab_size, dtype=torch.bool, device=device)
            seen.scatter_(1, tokens if cfg.is_encoder_decoder else input_ids, True)
    step_fn = model.decoding.step_for(model, cache) if compile and recorder is None else decode_step
    for index in range(budget):
        with torch.inference_mode():
            if index == 0:
                logits = prefill(model, tokens, prompt_mask, cache, recorder, **context)
            else:
                try:
                    logits = step_fn(model, tokens, cache, recorder, **context)
                except Exception as err:  # the compiler failed: fall back to the eager step, once
                    if step_fn is decode_step:
                        raise
                    warnings.warn(f"compiled decode step failed ({type(err).__name__}: {err}); continuing uncompiled")
                    model.decoding.step, step_fn = None, decode_step  # the same slot is written again
                    logits = decode_step(model, tokens, cache, recorder, **context)
                cache.advance(1)
            token = next_token(logits, sampling, seen, generator)
            if cfg.eos_ids:
                token = torch.where(done, eos[0], token)  # finished rows keep emitting end-of-sequence
            if seen is not None:
                seen.scatter_(1, token[:, None], True)
            rows = cross_rows = None
            if recorder is not None:
                rows = recorder.take("self")[..., :cache.length]
                cross_rows = recorder.take("cross")
            ranked = rank_of(logits, token, top_probs) if top_probs > 0 else (None,) * 4
            tokens = token[:, None]
            generated.append(token)
            done |= torch.isin(token, eos)
        yield Step(token, rows, cross_rows, *ranked)
        if bool(done.all()):
            return
        if stops and any(s in model.tokenizer.decode(torch.stack(generated, 1)[0, -64:]) for s in stops):
            return


def generate(model, input_ids: Tensor, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, repetition_penalty: float = 1.0, seed: int | None = None,
             stop: list[str] | str | None = None, attention_mask: Tensor | None = None, compile: bool = False) -> Tensor:
    """The prompt followed by the new tokens: [B, T + new] (for seq2seq: decoder start token + new tokens).
    compile=True runs the one-token decode step through torch.compile (for GPUs; see CompiledDecoding)."""
    sampling = Sampling(temperature, top_k, top_p, repetition_penalty, seed)
    new = [step.token for step in steps(model, input_ids, max_new_tokens, sampling, attention_mask, stop,
                                        compile=compile)]
    device = model.device
    if model.config.is_encoder_decoder:
        start = torch.full((input_ids.shape[0], 1), model.config.decoder_start_token_id, device=device)
        return torch.cat([start] + [t[:, None] for t in new], dim=1)
    return torch.cat([input_ids.to(device)] + [t[:, None] for t in new], dim=1)


def stream(model, input_ids: Tensor, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, repetition_penalty: float = 1.0, seed: int | None = None,
           stop: list[str] | str | None = None, attention_mask: Tensor | None = None,
           capture_attention: bool = False, compile: bool = False, top_probs: int = 0) -> Iterator[Step]:
    """Yield a Step for each new token as soon as it is made: for one sequence (input_ids [1, T]) row 0 of it,
    its token an int; for a batch the whole Step, token [B].
    capture_attention fills rows, the attention of the query that produced the token per layer and head over
    the context so far ([L, H, Tk] float16 for one sequence), and for seq2seq cross_rows over the source.
    top_probs = k > 0 fills the model's k most likely tokens and their probabilities and the picked token's
    probability and rank. Fields not asked for are None."""
    sampling = Sampling(temperature, top_k, top_p, repetition_penalty, seed)
    single = input_ids.shape[0] == 1
    for step in steps(model, input_ids, max_new_tokens, sampling, attention_mask, stop, capture_attention,
                      compile, top_probs):
        if single:
            step = step.row(0)
            step.token = int(step.token)
        yield step


# ---- one sequence with and without the cache: the same tokens, the bytes it takes, the time a step takes ----

def device_clock(model) -> Callable[[], float]:
    """perf_counter read once the model's device has finished its queued work (a GPU runs asynchronously)."""
    def clock() -> float:
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        return time.perf_counter()
    return clock


def one_sequence(ids: list[int], device) -> Tensor:
    """Token ids as input_ids [1, T] on the model's device."""
    return torch.tensor([ids], dtype=torch.long, device=device)


def encoder_context(model, source_ids: list[int] | None) -> dict:
    """The decoder's cross-attention context: a seq2seq model's encoder output over source_ids, computed once
    ({} for a decoder-only model, which takes no source)."""
    if not model.config.is_encoder_decoder:
        if source_ids:
            raise ValueError(f"source_ids are for encoder-decoder models; {model.config.family} here is "
                             "decoder-only: pass the prompt as decoder_ids")
        return {}
    if source_ids is None:
        raise ValueError("an encoder-decoder model needs source_ids, the text its encoder reads")
    with torch.inference_mode():
        memory = model.run_stack(model.encoder, one_sequence(source_ids, model.device), None, kind="encoder",
                                 causal=False)
    return dict(memory=memory, memory_mask=None)


def greedy(model, decoder_ids: list[int], n_new: int, cached: bool, source_ids: list[int] | None = None,
           clock: Callable[[], float] | None = None) -> tuple[list[int], list[float]]:
    """Greedy continuation of decoder_ids by up to n_new tokens, stopping after an end-of-sequence token: with
    the KV cache (a prefill, then one-token decode steps) or without (every step runs all tokens so far through
    the model). For seq2seq, source_ids is encoded once (not timed) and the decoder starts from decoder_ids.
    Returns the new tokens and the seconds each step took, read from `clock` (default: device_clock)."""
    clock = clock or device_clock(model)
    context = encoder_context(model, source_ids)
    eos = set(model.config.eos_ids or [])
    tokens, seconds = list(decoder_ids), []
    cache = model.new_cache(1, len(decoder_ids) + n_new) if cached else None
    with torch.inference_mode():
        for i in range(n_new):
            started = clock()
            if cache is None or i == 0:
                logits = prefill(model, one_sequence(tokens, model.device), None, cache, **context)
            else:
                logits = decode_step(model, one_sequence(tokens[-1:], model.device), cache, None, **context)
                cache.advance(1)
            token = int(logits.argmax(-1)[0])
            seconds.append(clock() - started)
            tokens.append(token)
            if token in eos:
                break
    return tokens[len(decoder_ids):], seconds


# ---- a rolling cache for windowed layers: a ring of `sinks + window` entries instead of one per token ----

def rolling_cache(model, batch: int, max_len: int, window: int | None = None, sinks: int = 0) -> RollingKVCache:
    """A RollingKVCache for a decoder: its own sliding-window layers roll (window must then be theirs, or None);
    a model without them rolls every layer over `window` tokens, keeping the first `sinks` (StreamingLLM's
    attention sinks) on top of the window."""
    cfg = model.config
    if cfg.is_encoder_decoder or not cfg.causal:
        raise ValueError(f"a rolling cache is for decoder-only causal models; {cfg.family} is not one")
    if model.stack.score_bias is not None:
        raise ValueError(f"{cfg.family} adds a position bias to the scores (ALiBi or T5 buckets), which is built over "
                         "every cached position; a rolling cache does not keep them: use the full cache")
    if sinks < 0 or (window is not None and window < 1):
        raise ValueError(f"window={window}, sinks={sinks}: the window needs w ≥ 1 and the sinks s ≥ 0")
    if "sliding" in cfg.layer_types and cfg.sliding_window:
        if window not in (None, cfg.sliding_window):
            raise ValueError(f"{cfg.family}'s sliding layers have their own window of {cfg.sliding_window} tokens; "
                             f"pass window=None or {cfg.sliding_window}, not {window}")
        window, windowed = cfg.sliding_window, tuple(t == "sliding" for t in cfg.layer_types)
    elif window is None:
        raise ValueError(f"{cfg.family} has no sliding-window layers: give window=w to roll every layer over w tokens")
    else:
        windowed = (True,) * cfg.n_layers
    return RollingKVCache(cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim, model.dtype, model.device,
                          windowed, window, sinks)


def rolling_decode_step(model, tokens: Tensor, cache: RollingKVCache) -> Tensor:
    """decode_step over a RollingKVCache: one new token per row [B, 1] at cache.slot → logits [B, vocab]. The
    full layers read the whole cache under the static step's mask; the rolling layers read their ring under
    cache.ring_allowed(), with their own rotation (Gemma's local RoPE base). The caller advances the cache."""
    stack = model.stack
    setup, position_ids = model.ring_setup(stack, cache)
    x = stack.embed(tokens, position_ids, None, True)
    return model.logits(stack(x, setup))[:, -1]


def feed_rolling(model, ids: list[int], cache: RollingKVCache) -> Tensor:
    """Read a prompt into an empty rolling cache → logits of its last token [1, vocab]. Within the window, a prefill
    straight into it; past it, a prefill into a full cache under the same masks (the model's own windows, or the
    window and sinks given to a model without them), whose sinks and last window positions the ring takes over.
    Sinks on a model's own sliding layers are a mask its prefill cannot draw: the prompt past the window is then
    read one decode step at a time."""
    own_window = "sliding" in model.config.layer_types
    with torch.inference_mode():
        if len(ids) <= cache.window or (own_window and cache.sinks):
            logits = prefill(model, one_sequence(ids[:cache.window], model.device), None, cache)
            for token in ids[cache.window:]:
                logits = rolling_decode_step(model, one_sequence([token], model.device), cache)
                cache.advance(1)
            return logits
        full = model.new_cache(1, len(ids))
        window = None if own_window else (cache.window, cache.sinks)
        hidden = model.run_stack(model.stack, one_sequence(ids, model.device), None, kind="self", cache=full,
                                 window=window)
        cache.take_prefill(full)
        return model.logits(hidden[:, -1:])[:, -1]


def greedy_rolling(model, decoder_ids: list[int], n_new: int, window: int | None = None,
                   sinks: int = 0) -> list[int]:
    """Greedy continuation by up to n_new tokens with a rolling cache (see rolling_cache), stopping after an
    end-of-sequence token; the same tokens as greedy(cached=True) when the windows are the model's own."""
    if not decoder_ids:
        raise ValueError("decoder_ids is empty: give at least one prompt token")
    cache = rolling_cache(model, 1, len(decoder_ids) + n_new, window, sinks)
    eos, new = set(model.config.eos_ids or []), []
    logits = feed_rolling(model, decoder_ids, cache)
    with torch.inference_mode():
        for i in range(n_new):
            if i:
                logits = rolling_decode_step(model, one_sequence(new[-1:], model.device), cache)
                cache.advance(1)
            new.append(int(logits.argmax(-1)[0]))
            if new[-1] in eos:
                break
    return new


def filled_cache(model, decoder_ids: list[int], source_ids: list[int] | None = None) -> KVCache:
    """The KV cache of exactly len(decoder_ids) tokens, filled by a prefill; for seq2seq it also holds the
    cross-attention keys and values of the source. Its nbytes is what the cache costs at that length."""
    context = encoder_context(model, source_ids)
    cache = model.new_cache(1, len(decoder_ids))
    with torch.inference_mode():
        prefill(model, one_sequence(decoder_ids, model.device), None, cache, **context)
    return cache


def step_times(model, tokens: list[int], repeats: int, source_ids: list[int] | None = None,
               clock: Callable[[], float] | None = None) -> tuple[float, list[float]]:
    """What one step costs at len(tokens) tokens of context: the seconds of one pass over all of them without a
    cache, and of each of `repeats` one-token decode steps after a cached prefill of the same tokens (each
    step feeds the last token again; the prefill is not timed)."""
    clock = clock or device_clock(model)
    context = encoder_context(model, source_ids)
    with torch.inference_mode():
        started = clock()
        prefill(model, one_sequence(tokens, model.device), None, None, **context)
        uncached = clock() - started
        cache = model.new_cache(1, len(tokens) + repeats)
        prefill(model, one_sequence(tokens, model.device), None, cache, **context)
        cached = []
        for _ in range(repeats):
            started = clock()
            decode_step(model, one_sequence(tokens[-1:], model.device), cache, None, **context)
            cache.advance(1)
            cached.append(clock() - started)
    return uncached, cached


def chat_ids(tokenizer, prompt: str | list[dict], system: str | None = None) -> Tensor:
    """Token ids [1, T] of a prompt wrapped in the tokenizer's chat template, ready for the assistant's turn."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("this model's tokenizer has no chat template; use plain text")
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if system:
        messages = [{"role": "system", "content": system}] + messages
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
