"""Attention sinks and what a window of keys costs: how much attention each head puts on a text's first tokens
(Gu et al.'s Sink^ε), and the perplexity of a long text read through a window of keys with or without the first
tokens kept (StreamingLLM's experiment).

sink_scores reads the probabilities of the explicit path (an observer, one layer at a time, never a kept n × n map
per layer), over texts batched as the corpus helpers batch them. streaming_perplexity reads the text in one masked
pass (positions="text") or token by token through the rolling KV cache (positions="cache").
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import padding_or_none
from ..corpus.stats import SHARE
from ..corpus.jobs import (BATCH_TOKENS, Done, Each, Job, Progress, Stop, check_ids, check_texts, length_batches,
                           one_text, pad_id, padded)
from ..corpus.stats import Over
from ..generate import rolling_cache, rolling_decode_step
from ..layers import rotate
from ..attention import Kind, Observer
from .heads import SINK_EPSILON as EPSILON, first_token_mass, sink_heads   # noqa: F401 - the one sink-head rule

LOSS_BLOCK = 256       # positions whose vocabulary logits are held at once (Gemma's vocabulary is 262,144 wide)
POSITIONS = ("cache", "text")


# ---- sink scores: attention on the first tokens, per head ----


@dataclass
class SinkScores:
    """Per head [L, H], each an Over of texts. Decoders: `first` averages the attention on token 0 over queries
    1..T−1 and `first_k` the attention on tokens 0..k−1 over queries k..T−1, since a query among the first k
    can attend nowhere else (query 0 puts all its attention on itself) and would only add a constant 1. Encoders
    see every key from every query, so every query counts: `first` is [CLS] (token 0), `sep` the text's last
    token ([SEP]). `share` (a scalar per text) is Sink^ε: the fraction of the L·H heads whose `first` exceeds ε.
    `learned`, for a model with a learned sink logit per head (config.attention_sinks): the weight the sink
    takes, 1 − Σ_j p_ij, averaged over the same queries as `first`."""
    first: Over
    first_k: Over
    share: Over
    sep: Over | None
    k: int
    epsilon: float
    queries: str            # which queries were averaged, in words
    learned: Over | None = None


class SinkObserver(Observer):
    """Reduces each layer's probabilities [B, H, T, T] at once to its rows' sink scores; keeps nothing n × n.
    lengths[b]: row b's real tokens (right padding after them)."""

    def __init__(self, kind: Kind, lengths: list[int], k: int, causal: bool, learned: bool = False):
        self.kind, self.lengths, self.k, self.causal, self.learned = kind, lengths, k, causal, learned
        self.layers: dict[int, list[dict[str, Tensor]]] = {}

    def wants(self, kind: Kind, layer: int) -> bool:
        return kind == self.kind

    def __call__(self, kind: Kind, layer: int, probs: Tensor, start: int = 0, n: int | None = None,
                 first_key: int = 0) -> None:
        rows = []
        for b, t in enumerate(self.lengths):
            p = probs[b, :, :t, :t].float()                                       # [H, T, T]
            skip_first, skip_k = (1, self.k) if self.causal else (0, 0)
            row = {"first": first_token_mass(p, self.causal),                     # [H]
                   "first_k": p[:, skip_k:, :self.k].sum(-1).mean(-1)}
            if not self.causal:
                row["sep"] = p[:, :, t - 1].mean(-1)
            if self.learned:   # what the rows' keys do not take, the sink does
                row["learned"] = (1 - p[:, skip_first:].sum(-1)).mean(-1)
            rows.append({name: value.cpu() for name, value in row.items()})
        self.layers[layer] = rows

    def rows(self) -> list[dict[str, Tensor]]:
        """Per row: name → [L, H]."""
        order = sorted(self.layers)
        return [{name: torch.stack([self.layers[i][b][name] for i in order]) for name in self.layers[order[0]][b]}
                for b in range(len(self.lengths))]


def check_sinks_input(model, texts, k: int, epsilon: float) -> tuple[list[Tensor], bool]:
    stack, _ = model.attention_stack()
    if model.encoder is not None:
        raise ValueError(f"sink_scores reads one self-attention stack; {model.config.family} is an encoder-decoder "
                         "model, whose decoder attends to its encoder as well")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}: the number of first tokens must be a whole number ≥ 1")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 <= epsilon < 1:
        raise ValueError(f"epsilon={epsilon!r}: the threshold on a head's attention must lie in [0, 1)")
    texts = check_texts(model, texts)
    causal = stack.cfg.causal
    short = [i for i, t in enumerate(texts) if len(t) <= k]
    if short:
        raise ValueError(f"texts {short[:20]} have at most {k} tokens: a decoder's score on the first {k} needs a "
                         f"query after them (and an encoder's [SEP] a token after [CLS]); give longer texts or a "
                         f"smaller k")
    return texts, causal


def sink_scores(model, texts: Sequence[Tensor], k: int = 1, epsilon: float = EPSILON,
                batch_tokens: int = BATCH_TOKENS, progress: Progress | None = None, stop: Stop | None = None,
                each: Each | None = None, done: Done | None = None) -> SinkScores:
    """Each head's attention on the first token (and the first k) of each text, summarised over texts, and the
    share of heads above epsilon (Sink^ε). Texts of similar length go through together, right-padded; each row is
    scored on its own tokens. progress / stop / each / done as in core/corpus/jobs.py."""
    texts, causal = check_sinks_input(model, texts, k, epsilon)
    stack, kind = model.attention_stack()
    job = Job(len(texts), "text", progress, stop, each).resume(done)
    todo = job.left()

    def measure(places: list[int]) -> None:
        batch = [todo[place] for place in places]
        ids, mask = padded([texts[i] for i in batch], pad_id(model))
        observer = SinkObserver(kind, [len(texts[i]) for i in batch], k, causal, stack.cfg.attention_sinks)
        with torch.inference_mode():
            model.run_stack(stack, ids.to(model.device), padding_or_none(mask.to(model.device)), kind=kind,
                            causal=causal, observer=observer)
        for i, row in zip(batch, observer.rows()):
            row["share"] = sink_heads(row["first"], epsilon).float().mean()
            job.finish(i, row)

    job.run(length_batches([len(texts[i]) for i in todo], batch_tokens), measure)
    shape = (stack.cfg.n_layers, stack.cfg.n_heads)
    queries = (f"decoder: token 0's score over queries 1..T−1, the first {k}'s over queries {k}..T−1"
               if causal else "encoder: every query")
    def share(name: str) -> Over:       # every score here is a share of attention, or of heads
        return job.over(shape if name != "share" else (), lambda v: v[name], bounds=SHARE)

    return SinkScores(first=share("first"), first_k=share("first_k"), share=share("share"),
                      sep=None if causal else share("sep"), k=k, epsilon=float(epsilon), queries=queries,
                      learned=share("learned") if stack.cfg.attention_sinks else None)


# ---- streaming perplexity: a window of keys, with or without sinks ----

@dataclass
class StreamingPerplexity:
    """loss [T−1]: loss[t − 1] = −log p(ids[t] | what query t − 1 reads), for t = 1..T−1; perplexity = exp(mean).
    Query i reads keys j ≤ i with j < sinks or j > i − window: a KV cache of at most sinks + window entries."""
    perplexity: float
    loss: Tensor
    window: int
    sinks: int
    positions: str
    method: str             # how it was computed, in words


def check_streaming(model, ids, window: int, sinks: int, positions: str) -> Tensor:
    cfg = model.config
    if cfg.is_encoder_decoder or not cfg.causal or model.lm_head is None:
        raise ValueError(f"streaming perplexity reads a text left to right and predicts each next token: it needs a "
                         f"decoder-only causal model with an LM head; {cfg.family} is not one")
    ids = check_ids(model, one_text(ids)[0], "ids")
    if len(ids) < 2:
        raise ValueError("ids has one token: a perplexity needs at least two (one to predict from, one predicted)")
    for name, value, least in (("window", window, 1), ("sinks", sinks, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name}={value!r}: it must be a whole number ≥ {least}")
    if sinks >= len(ids):
        raise ValueError(f"sinks={sinks} keeps the whole {len(ids)}-token text: give fewer sinks than tokens")
    if positions not in POSITIONS:
        raise ValueError(f"positions={positions!r}: choose 'cache' (renumbered inside the cache, as StreamingLLM "
                         f"does) or 'text' (each token keeps its place in the text)")
    table = cfg.max_positions - cfg.position_offset
    if cfg.positional in ("learned", "sinusoidal") and positions == "cache":
        raise ValueError(f"{cfg.family} adds {cfg.positional} positions to its embeddings, so a cached key's position "
                         "is baked into it and cannot be renumbered: use positions='text'")
    if cfg.positional == "learned" and len(ids) > table:
        raise ValueError(f"{cfg.family} has learned positions for {table} tokens; this text has {len(ids)}: give at "
                         f"most {table} tokens")
    if positions == "cache" and model.stack.score_bias is not None:
        raise ValueError(f"{cfg.family} adds a position bias to its scores (ALiBi or T5 buckets), which the rolling "
                         "cache does not keep: use positions='text'")
    if positions == "cache" and "sliding" in cfg.layer_types:
        raise ValueError(f"{cfg.family} has its own sliding-window layers, whose ring the rolling cache sizes to "
                         f"their own window of {cfg.sliding_window}: use positions='text' for other windows")
    return ids


def next_token_losses(model, hidden: Tensor, ids: Tensor) -> Tensor:
    """hidden [1, T, d] → −log p(ids[t] | hidden[t − 1]) for t = 1..T−1, LOSS_BLOCK positions of logits at a time."""
    losses = []
    for start in range(0, len(ids) - 1, LOSS_BLOCK):
        end = min(start + LOSS_BLOCK, len(ids) - 1)
        logits = model.logits(hidden[:, start:end])[0].float()                   # [block, vocab]
        losses.append(F.cross_entropy(logits, ids[start + 1:end + 1].to(logits.device), reduction="none"))
    return torch.cat(losses).cpu()


def masked_losses(model, ids: Tensor, window: int, sinks: int, local_windows: bool = True) -> Tensor:
    """positions="text": one pass under the local + global mask (forward's window, global_tokens); a window that
    covers the text is full attention (the family's own sliding layers keep theirs unless local_windows=False)."""
    local = {} if window >= len(ids) else dict(window=window, global_tokens=sinks)
    with torch.inference_mode():
        out = model(ids[None].to(model.device), return_logits=False, local_windows=local_windows, **local)
        return next_token_losses(model, out.hidden_states, ids)


def cache_losses(model, ids: Tensor, window: int, sinks: int, progress=None) -> Tensor:
    """positions="cache": token by token through a RollingKVCache of sinks + window entries per layer. The ring
    holds keys rotated at their text positions, so a window key sits at its text distance i − j from query i,
    which is also its distance inside StreamingLLM's renumbered cache; only the sinks differ: once the cache is
    full (i ≥ sinks + window − 1) the query sits at cache position sinks + window − 1, so sink j must be seen at
    distance sinks + window − 1 − j, i.e. rotated to text position j + shift, shift = i − (sinks + window − 1).
    RoPE rotations compose (R(a)R(b) = R(a + b)), so each step rotates the sinks' stored keys by `shift`."""
    cache = rolling_cache(model, 1, len(ids), window, sinks)
    kept = sinks + window - 1
    stored: list[Tensor] | None = None
    logits = []
    with torch.inference_mode():
        for i, token in enumerate(ids.tolist()[:-1]):
            shift = i - kept
            if sinks and shift > 0:
                if stored is None:
                    stored = [keys[:, :, :sinks].clone() for keys in cache.keys]
                turn = model.rope(model.stack, torch.tensor([[shift]], device=model.device), True)
                for keys, original in zip(cache.keys, stored):
                    keys[:, :, :sinks] = original if turn is None else rotate(original, *turn)
            step = torch.tensor([[token]], device=model.device)
            logits.append(rolling_decode_step(model, step, cache)[0].float().cpu())
            cache.advance(1)
            if progress is not None:
                progress(i + 1, len(ids) - 1)
    return F.cross_entropy(torch.stack(logits), ids[1:], reduction="none")


def streaming_perplexity(model, ids: Tensor, window: int, sinks: int = 0, positions: str = "cache",
                         progress=None, local_windows: bool = True) -> StreamingPerplexity:
    """The perplexity of ids [T] (or [1, T]) when query i reads only keys j ≤ i with j < sinks or j > i − window
    (StreamingLLM: window-only attention, and the same with the first `sinks` tokens kept as attention sinks).
    positions="text": every token keeps its place in the text (the mask-only view, one pass); "cache": positions
    are renumbered inside the cache as StreamingLLM does (RoPE models; read token by token, see cache_losses).
    progress(done, total): after each token read through the cache (total T − 1), or once after the pass.
    local_windows=False (positions="text"): a family's own sliding-window layers read every key, their rotation
    kept (Gemma 3's local layers widened), under the window given here as every other layer is."""
    ids = check_streaming(model, ids, window, sinks, positions)
    if not local_windows and "sliding" not in model.config.layer_types:
        raise ValueError(f"local_windows=False widens a family's own sliding-window layers; {model.config.family} "
                         "has none")
    if not local_windows and positions != "text":
        raise ValueError("local_windows=False reads the text in one masked pass: use positions='text'")
    if positions == "text":
        loss, method = masked_losses(model, ids, window, sinks, local_windows), "one pass under the local + global mask"
        if not local_windows:
            method += ", the sliding layers' own window removed"
        if progress is not None:
            progress(1, 1)
    else:
        loss, method = cache_losses(model, ids, window, sinks, progress), (
            f"token by token through a rolling KV cache of {sinks} + {window} entries, sinks re-rotated")
    return StreamingPerplexity(math.exp(float(loss.double().mean())), loss, window, sinks, positions, method)
