"""Generation: a preallocated KV cache, one prefill step, then one-token decode steps; sampling; streaming.

Without the cache every new token would recompute keys and values for the whole prefix (quadratic work);
with it, a decode step computes one query, one key and one value per layer and reads the rest from memory.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor

from .attention import padding_or_none


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


class RowRecorder:
    """Observer that keeps the last query's attention row of every layer: what the model looked at while
    it computed the next token. rows[kind][layer] is [B, H, Tk], kind "self" or (seq2seq) "cross"."""

    def __init__(self):
        self.rows: dict[str, dict[int, Tensor]] = {"self": {}, "cross": {}}

    def __call__(self, kind: str, layer: int, probs: Tensor) -> None:
        self.rows[kind][layer] = probs[:, :, -1].to(torch.float16)

    def take(self, kind: str = "self") -> Tensor | None:
        """[B, L, H, Tk] of one kind, emptied for the next token; None when that kind was not computed."""
        found = self.rows[kind]
        if not found:
            return None
        rows = torch.stack([found[i] for i in sorted(found)], dim=1)
        self.rows[kind] = {}
        return rows


@dataclass
class Step:
    """One new token and what produced it, for a batch [B]: what stream(..., top_probs=k) yields (row 0 of it
    for a single sequence). Probabilities are the model's own, softmax of the logits at temperature 1, before
    any sampling filter, so they show where a sampled token ranked."""
    token: Tensor                    # [B] the token that was picked
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


def new_cache(model, batch: int, max_len: int, compile: bool):
    """A KV cache for one generation. The compiled step keeps one per model, its length rounded up to a multiple
    of 256, so that other prompt lengths reuse the same graph and the same addresses (a CUDA graph reads them)."""
    if not compile:
        return model.new_cache(batch, max_len)
    max_len = -(-max_len // 256) * 256
    cache = getattr(model, "_static_cache", None)
    if cache is None or cache.key_mask.shape != (batch, max_len) or cache.keys[0].dtype != model.dtype:
        cache = model._static_cache = model.new_cache(batch, max_len)
    cache.reset()
    return cache


def compiled_decode_step(model, cache):
    """decode_step through torch.compile (CUDA graphs on a GPU: mode "reduce-overhead"), built once per model.
    The cache's tensors are marked as fixed addresses, as a CUDA graph reads them in place. Compiling takes
    minutes on a small CPU, so it is asked for (compile=True), not the default."""
    for t in cache.keys + cache.values + [cache.key_mask, cache.slot, cache.next_position]:
        torch._dynamo.mark_static_address(t)
    if getattr(model, "_compiled_decode", None) is None:
        mode = "reduce-overhead" if model.device.type == "cuda" else None
        model._compiled_decode = torch.compile(decode_step, mode=mode, fullgraph=True)
    return model._compiled_decode


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
            cache = new_cache(model, batch, budget + 1, compile)
            tokens = torch.full((batch, 1), cfg.decoder_start_token_id, device=device)
            context = dict(memory=memory, memory_mask=attention_mask)
            prompt_mask = None
        else:
            cache = new_cache(model, batch, prompt_len + budget, compile)
            tokens, context, prompt_mask = input_ids, {}, attention_mask
        seen = None
        if sampling.repetition_penalty != 1.0:
            seen = torch.zeros(batch, cfg.vocab_size, dtype=torch.bool, device=device)
            seen.scatter_(1, tokens if cfg.is_encoder_decoder else input_ids, True)
    step_fn = compiled_decode_step(model, cache) if compile and recorder is None else decode_step
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
                    model._compiled_decode, step_fn = None, decode_step  # the same slot is written again
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
    compile=True runs the one-token decode step through torch.compile (for GPUs; see compiled_decode_step)."""
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
           capture_attention: bool = False, compile: bool = False, top_probs: int = 0) -> Iterator:
    """Yield each new token id (an int) as soon as it is made; a batch yields tensors [B].
    With capture_attention, yield (token, rows) where rows [L, H, Tk] float16 is the attention of the
    query that produced this token, per layer and head, over the context so far.
    With top_probs = k > 0, yield a Step instead (Step.row(0) of it for a single sequence, its token an int):
    the model's k most likely tokens and their probabilities, the picked token's probability and rank, and,
    with capture_attention too, its self-attention rows and (seq2seq) its cross-attention rows."""
    sampling = Sampling(temperature, top_k, top_p, repetition_penalty, seed)
    single = input_ids.shape[0] == 1
    for step in steps(model, input_ids, max_new_tokens, sampling, attention_mask, stop, capture_attention,
                      compile, top_probs):
        if top_probs > 0:
            if single:
                step = step.row(0)
                step.token = int(step.token)
            yield step
            continue
        out = int(step.token[0]) if single else step.token
        if capture_attention:
            yield out, (step.rows[0] if single else step.rows)
        else:
            yield out


def chat_ids(tokenizer, prompt: str | list[dict], system: str | None = None) -> Tensor:
    """Token ids [1, T] of a prompt wrapped in the tokenizer's chat template, ready for the assistant's turn."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("this model's tokenizer has no chat template; use plain text")
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if system:
        messages = [{"role": "system", "content": system}] + messages
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
