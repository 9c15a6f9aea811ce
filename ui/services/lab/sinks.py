"""Attention sinks, softmax against a learned sink, as the Lab runs it (core/lab/sinks): the saved result its first screen shows,
the finding in words (every number read from the result), and a live run in a worker thread. Never imports gradio.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

from core.lab import sinks as engine
from core.analysis.sinks import EPSILON, sink_heads
from core.lab.sinks import READS, SinksLab, SinksLabConfig
from ui.services.checks import check_range
from ui.services.jobs import JobUpdate, stream_job
from ui.services.lab.saved import read_result

SAVED = Path(__file__).resolve().parents[3] / "assets" / "sinks_lab"
SAVED_COMMAND = "python -m core.lab.sinks --threads 2 --out assets/sinks_lab"
MIN_STEPS = 50
TASK_WORDS = (f"after <bos>, letters drawn uniformly at random, except after the triggers {', '.join(engine.TRIGGERS)}, "
              "where the next letter copies the letter before the trigger (after Guo et al.'s bigram-backcopy task, "
              "2024): a head that fetches that letter has nothing to fetch after any other")


@functools.lru_cache(maxsize=1)
def saved(folder: Path = SAVED) -> SinksLab | None:
    """The result the repository ships, made by SAVED_COMMAND; None when it is absent or unreadable."""
    return read_result(engine.load, folder, "sinks")


def make_config(steps, seed, window, max_steps: int) -> SinksLabConfig:
    """The config from the page's or the API's fields; what is wrong is named."""
    return SinksLabConfig(steps=check_range("Steps", steps, MIN_STEPS, max_steps),
                          seed=check_range("Seed", seed, 0, 2**31 - 1),
                          window=check_range("Window", window, 1, SinksLabConfig().context - 2))


def run(config: SinksLabConfig, max_seconds: float | None = None) -> Iterator[JobUpdate]:
    """Both kinds trained and measured in a worker thread: an update after every step (done of 2 × steps), then
    the SinksLab as the result. Closing the iterator (Stop, or the page went away) stops it at its next step;
    past max_seconds the reader gets a UserError (one kind alone compares nothing, so no partial result)."""
    def work(report):
        def step(kind: str, done: int, steps: int) -> None:
            report(engine.KINDS.index(kind) * steps + done, 2 * steps)
        return engine.run_all(config, progress=step)

    return stream_job(work, 2 * config.steps, "sinks-lab", max_seconds=max_seconds)


def heads_above(values: list[list[float]], epsilon: float = EPSILON) -> list[tuple[int, int, float]]:
    """(layer, head, value) of every head above epsilon, strongest first."""
    return sorted(((layer, head, v) for layer, row in enumerate(values) for head, v in enumerate(row)
                   if sink_heads(v, epsilon)), key=lambda x: -x[2])


def strongest(values: list[list[float]]) -> tuple[int, int, float]:
    return max(((layer, head, v) for layer, row in enumerate(values) for head, v in enumerate(row)),
               key=lambda x: x[2])


def finding(result: SinksLab) -> str:
    """The result in words, every number read from it."""
    c = result.config
    soft, sink = result.kind("softmax"), result.kind("sink")
    if soft is None or sink is None:
        return "The run stopped before both kinds were trained: nothing to compare."
    heads = c.n_layers * c.n_heads
    layer, head, top = strongest(soft.first)
    s_layer, s_head, s_top = strongest(sink.learned or [[0.0]])
    b_layer, b_head, b_top = strongest(sink.first)
    above = len(heads_above(soft.first))
    ppl = lambda k, read: k.past_window[read]   # noqa: E731
    return (
        f"With softmax, **{above} of {heads} heads** put more than ε = {EPSILON:g} of their attention on <bos> "
        f"(the most, L{layer} H{head}: {top:.0%}). With a learned sink, {len(heads_above(sink.first))} of {heads} "
        f"do; the sink itself takes up to {s_top:.0%} (L{s_layer} H{s_head}) and <bos> gets at most {b_top:.0%} "
        f"(L{b_layer} H{b_head}). Then every query reads only its last {c.window} keys: on the predictions whose "
        f"window hides something (queries {c.window - 1} on), the softmax model's perplexity goes from "
        f"{ppl(soft, 'full'):.2f} with full attention to **{ppl(soft, 'window'):.2f}** with the window alone and "
        f"{ppl(soft, 'window + <bos>'):.2f} with <bos> kept; the sink model's from {ppl(sink, 'full'):.2f} to "
        f"**{ppl(sink, 'window'):.2f}** and {ppl(sink, 'window + <bos>'):.2f}. {verdict(result)}")


def verdict(result: SinksLab) -> str:
    """What the window's cost says, in words: whether the learned sink spared the sink model most of it (the
    rise in perplexity from full attention to the window alone, past the window), and whether <bos> restores it."""
    soft, sink = result.kind("softmax"), result.kind("sink")
    rise = lambda k: k.past_window["window"] / k.past_window["full"] - 1   # noqa: E731
    restored = all(k.past_window["window + <bos>"] <= k.past_window["full"] * 1.01 for k in (soft, sink))
    if rise(sink) <= rise(soft) / 2:
        words = (f"The learned sink spared the sink model most of the window's cost (+{rise(sink):.0%} against "
                 f"+{rise(soft):.0%}).")
    else:
        moved = strongest(sink.first)[2] < strongest(soft.first)[2]
        words = (f"Here the learned sink {'moved weight off <bos> but ' if moved else ''}did not spare the model the "
                 f"window's cost (+{rise(sink):.0%} against +{rise(soft):.0%}).")
    return words + (" Keeping <bos> in the window restores both models." if restored else "")


def caveat(result: SinksLab) -> str:
    c = result.config
    threads = f"{result.threads} thread{'s' if result.threads != 1 else ''}"
    return (f"One seed ({c.seed}) on one task ({TASK_WORDS}); {c.steps:,} steps of {c.batch} sequences of "
            f"{c.context} tokens for each kind, {c.n_layers} layers of {c.n_heads} heads, {threads}, {result.date}; "
            f"measured on {c.test_texts} held-out sequences. Another seed or task moves the numbers.")


def perplexity_rows(result: SinksLab) -> list[list[str]]:
    """[kind, then each read's perplexity over all predictions and over those past the window]."""
    return [[k.kind, *[f"{k.perplexity[r]:.2f}" for r in READS], *[f"{k.past_window[r]:.2f}" for r in READS]]
            for k in result.kinds]
