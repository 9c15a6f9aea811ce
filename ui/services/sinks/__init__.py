"""Attention sinks for the Heads tab, as plain values over core.analysis.sinks: each head's mean attention on the
text's first token (Gu et al.'s Sink^ε; an encoder's [CLS] and [SEP]), and the next-token loss of the text read
through a window of keys, with or without its first tokens kept (StreamingLLM's experiment), beside the same text
read with full attention."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from core.analysis import sinks
from ui.services.checks import UserError, check_choice, check_range
from ui.services.heads import MAX_HEADS_TOKENS, next_token_reason
from ui.services.text import Encoded, encode, to_numpy, valid_unicode

EPSILON = sinks.EPSILON  # Gu et al.'s threshold on a head's mean attention on token 0
MAX_STREAMING_TOKENS = 1024  # positions="cache" reads the text one decode step per token
MAX_SINKS = 64
POSITION_WORDS = {
    "text": "each token keeps its place in the text (the mask-only view, one pass)",
    "cache": "positions renumbered inside the cache, as StreamingLLM does (one decode step per token)",
}


@dataclass
class SinkMap:
    """Each head's mean attention on the text's first token, [L, H], over the queries `queries` names."""
    tokens: Encoded
    first: np.ndarray  # [L, H]
    share: float  # Sink^ε: the fraction of heads whose `first` exceeds epsilon
    epsilon: float
    causal: bool
    queries: str  # the core's words for the queries averaged
    last: np.ndarray | None  # [L, H], encoders: the mean attention on the text's last token ([SEP])
    special: tuple[bool, bool]  # whether the first and the last token are the tokenizer's [CLS] / [SEP]
    seconds: float

    @property
    def above(self) -> list[tuple[int, int, float]]:
        """(layer, head, score) of every head above epsilon, strongest first."""
        layers, heads = np.nonzero(self.first > self.epsilon)
        found = [(int(layer), int(head), float(self.first[layer, head])) for layer, head in zip(layers, heads)]
        return sorted(found, key=lambda row: -row[2])


def sink_map(model, text) -> SinkMap:
    """core.analysis.sinks.sink_scores on the tab's text (its first MAX_HEADS_TOKENS tokens, as one text of the
    corpus the core function takes), with its refusals (an encoder-decoder, a text of one token) in words."""
    tokens = encode(model, text, MAX_HEADS_TOKENS)
    if len(tokens.ids) < 2:
        raise UserError("The sink map needs at least 2 tokens: a head's attention on the first token is read from "
                        "the queries after it (an encoder's [SEP] from a token after [CLS]).")
    started = time.perf_counter()
    try:
        result = sinks.sink_scores(model, [torch.tensor(tokens.ids)], epsilon=EPSILON)
    except ValueError as exc:
        raise UserError(f"The sink map cannot be measured here: {exc}.") from exc
    seconds = time.perf_counter() - started
    tok = model.tokenizer
    special = (tokens.ids[0] == tok.cls_token_id, tokens.ids[-1] == tok.sep_token_id) if result.sep is not None \
        else (False, False)
    return SinkMap(tokens, to_numpy(result.first.mean), float(result.share.mean), result.epsilon,
                   result.sep is None, result.queries, None if result.sep is None else to_numpy(result.sep.mean),
                   special, seconds)


@dataclass
class WindowRead:
    """The text's next-token loss read through the window (with its sinks) and with full attention."""
    tokens: Encoded
    windowed: sinks.StreamingPerplexity
    full: sinks.StreamingPerplexity
    seconds: float

    @property
    def hides_from(self) -> int | None:
        """The first query whose window hides a key: query i reads keys j < sinks or j > i − window, so key
        `sinks` leaves it at i = window + sinks; None when no query of the text gets that far."""
        first = self.windowed.window + self.windowed.sinks
        return first if first < len(self.tokens.ids) - 1 else None


def streaming_tokens(model, text) -> Encoded:
    """The whole text's tokens, or a UserError naming the limit: a cut text would be another text's perplexity."""
    context = model.config.max_positions - model.config.position_offset
    limit = min(MAX_STREAMING_TOKENS, context)
    tokens = encode(model, text, limit)
    count = len(model.tokenizer(valid_unicode(text))["input_ids"])
    if count > limit:
        why = ("the model's learned position table" if limit == context else
               "this section's limit, since cache positions read one decode step per token")
        raise UserError(f"Streaming perplexity reads the whole text, at most {limit:,} tokens here ({why}); this "
                        f"text has {count:,}. Shorten it to {limit:,} tokens or fewer.")
    return tokens


def window_read(model, text, window, sink_count, positions) -> WindowRead:
    """core.analysis.sinks.streaming_perplexity on the whole text with these settings, and with full attention
    (one masked pass whose window covers the text), every setting checked first and each refusal in words."""
    reason = next_token_reason(model, "Streaming perplexity")
    if reason:
        raise UserError(reason)
    window = check_range("Window", window, 1, MAX_STREAMING_TOKENS)
    sink_count = check_range("Sinks", sink_count, 0, MAX_SINKS)
    positions = check_choice("Positions", positions, POSITION_WORDS)
    tokens = streaming_tokens(model, text)
    ids = torch.tensor(tokens.ids)
    started = time.perf_counter()
    try:
        windowed = sinks.streaming_perplexity(model, ids, window, sink_count, positions)
        full = sinks.streaming_perplexity(model, ids, len(ids), 0, "text")
    except ValueError as exc:
        raise UserError(f"Streaming perplexity cannot read this: {exc}.") from exc
    return WindowRead(tokens, windowed, full, time.perf_counter() - started)
