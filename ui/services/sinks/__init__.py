"""Attention sinks for the Heads tab, as plain values over core.analysis.sinks: each head's mean attention on the
text's first token (Gu et al.'s Sink^ε; an encoder's [CLS] and [SEP]), and the next-token loss of the text read
through a window of keys, with or without its first tokens kept (StreamingLLM's experiment), beside the same text
read with full attention."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from core.analysis import sinks
from ui.services.checks import UserError, check_choice, check_range
from ui.services.jobs import JobUpdate, stream_job
from ui.services.heads import MAX_HEADS_TOKENS, next_token_reason
from ui.services.text import Encoded, checked_text, encode, to_numpy, valid_unicode

EPSILON = sinks.EPSILON  # Gu et al.'s threshold on a head's mean attention on token 0
sink_heads = sinks.sink_heads  # the one rule that names a sink head: first-token mass above EPSILON
MAX_STREAMING_TOKENS = 1024  # positions="cache" reads the text one decode step per token
MAX_SINKS = 64
MAX_COMPARED = 6  # installed models compared at most, one loaded at a time
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
        layers, heads = np.nonzero(sink_heads(self.first, self.epsilon))
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


@dataclass
class WindowSettings:
    tokens: Encoded
    window: int
    sinks: int
    positions: str

    @property
    def steps(self) -> int:
        """The reading's progress steps: each token through the cache (or the one masked pass), then the full
        attention pass."""
        return (len(self.tokens.ids) - 1 if self.positions == "cache" else 1) + 1


def window_settings(model, text, window, sink_count, positions) -> WindowSettings:
    """Every setting of the window reading checked, each refusal in words, before anything runs."""
    reason = next_token_reason(model, "Streaming perplexity")
    if reason:
        raise UserError(reason)
    window = check_range("Window", window, 1, MAX_STREAMING_TOKENS)
    sink_count = check_range("Sinks", sink_count, 0, MAX_SINKS)
    positions = check_choice("Positions", positions, POSITION_WORDS)
    return WindowSettings(streaming_tokens(model, text), window, sink_count, positions)


def read_window(model, settings: WindowSettings, report=None) -> WindowRead:
    """core.analysis.sinks.streaming_perplexity on the whole text with these settings, and with full attention
    (one masked pass whose window covers the text); report(done, total) after each step (WindowSettings.steps)."""
    ids, total = torch.tensor(settings.tokens.ids), settings.steps
    started = time.perf_counter()
    try:
        windowed = sinks.streaming_perplexity(model, ids, settings.window, settings.sinks, settings.positions,
                                              None if report is None else lambda done, _: report(done, total))
        full = sinks.streaming_perplexity(model, ids, len(ids), 0, "text")
    except ValueError as exc:
        raise UserError(f"Streaming perplexity cannot read this: {exc}.") from exc
    if report is not None:
        report(total, total)
    return WindowRead(settings.tokens, windowed, full, time.perf_counter() - started)


def window_read(model, text, window, sink_count, positions) -> WindowRead:
    """The window reading at once, settings checked first (what the API's callers and the tests call)."""
    return read_window(model, window_settings(model, text, window, sink_count, positions))


def stream_window(model, settings: WindowSettings, max_seconds: float | None = None) -> Iterator[JobUpdate]:
    """The reading in a worker thread, an update after each step, then the WindowRead as the result; closing the
    iterator (the page's Stop) stops it at its next step, and so does passing max_seconds (the heavy jobs' time
    cap: the reader then gets a UserError, as for a refusal; a window without the full reading compares nothing)."""
    return stream_job(lambda report: read_window(model, settings, report), settings.steps, "streaming-perplexity",
                      max_seconds=max_seconds, smaller="a shorter text, or positions='text' (one pass)")


@dataclass
class Compared:
    """One installed model's sinks on the text: the share of heads above ε, and per layer the mean over its
    heads of their attention on the first token ([CLS] for an encoder); or why it was not measured."""
    name: str
    share: float | None
    per_layer: np.ndarray | None  # [L]
    heads: int
    tokens: int
    causal: bool
    why: str = ""
    cut: str = ""  # encode's note where the text was cut to the map's limit (or the model's context)


def installed(models, first: str) -> tuple[list[str], list[str]]:
    """(the names compared, the installed names left out past MAX_COMPARED): the picker's models that load without
    fetching (never a session's private run), `first` (the model on the page) leading."""
    ready = set(models.names_ready())
    names = [name for name in dict.fromkeys([first, *models.names()]) if name in ready]
    return names[:MAX_COMPARED], names[MAX_COMPARED:]


def compare(models, names: list[str], text, progress=None) -> list[Compared]:
    """sink_map on the same text for each model in `names`, one loaded at a time (each with its own tokenizer, so
    the token counts differ); a model that cannot be measured says why in its row. The text is checked first, before
    any model is loaded for it."""
    text = checked_text(text)
    rows = []
    for i, name in enumerate(names):
        if progress is not None:
            progress(i / len(names), f"{name}: loading and one pass")
        try:
            result = sink_map(models.get(name), text)
        except UserError as error:
            rows.append(Compared(name, None, None, 0, 0, False, str(error)))
            continue
        rows.append(Compared(name, result.share, result.first.mean(axis=1), result.first.size,
                             len(result.tokens.ids), result.causal, cut=result.tokens.note))
    return rows
