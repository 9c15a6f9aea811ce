"""The quadratic term, measured: one attention layer alone (scores, softmax, weighted sum) timed from 256 to 8,192
tokens three ways, dense, online and fused, beside the whole model's pass, as bench/variants/attention_cost.py
measured and shipped it (assets/measured/attention_cost.json), with the exponents the bench fitted (core.machine.growth) and
wrote into it: the cost lesson and the Inside tab state the bench's numbers with what they were measured on, never a fit
of their own. Nothing is timed at request time: the longest layer alone takes seconds, more than a page may spend.
Never imports gradio."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from core.machine.growth import Growth
from ui.services.inside import mib

COST_MEASURED = Path(__file__).resolve().parents[3] / "assets" / "measured" / "attention_cost.json"
COST_BENCH = "bench/variants/attention_cost.py"   # writes COST_MEASURED with --publish
COST_METHODS = ("dense", "online", "fused")
COST_METHOD_WORDS = {
    "dense": "the explicit path, every n × n score and weight held",
    "online": "the online softmax, a block of keys at a time (eq. 6.10)",
    "fused": "torch's fused kernel (what the core's fast path calls)",
}


@dataclass(frozen=True)
class LayerCost:
    """One method's medians at every length, and its exponents over the longest lengths as the bench fitted them."""
    method: str
    lengths: tuple[int, ...]
    seconds: tuple[float, ...]     # median seconds of one call
    fastest: tuple[float, ...]     # the fastest run's seconds at each length (what fastest_exponent is fitted on)
    peak: tuple[float, ...]        # median bytes one call added to the peak resident memory
    time_exponent: float           # over fit_lengths, on the medians
    fastest_exponent: float        # over fit_lengths, on the fastest run at each length (the least disturbed)
    peak_exponent: float           # nan where too few peaks lay above the floor (peak_fit says which)
    peak_fit: Growth


@dataclass(frozen=True)
class ModelCost:
    name: str
    layers: int
    lengths: tuple[int, ...]
    seconds: tuple[float, ...]     # median seconds of one forward pass without a cache
    exponent: float                # over all its lengths
    attention_share: tuple[float, ...]   # one layer's causal kernel × layers / the pass, timed alternating with it


@dataclass(frozen=True)
class AttentionCost:
    date: str
    machine: str
    command: str
    threads: int
    heads: int
    d_head: int
    block: int
    repeats: int
    fit_lengths: tuple[int, ...]   # the longest lengths, where the exponents are fitted
    load: str                      # the machine's load average at the run's start and end
    layer: dict[str, LayerCost]
    model: ModelCost | None


def _medians(rows, method: str, field: str) -> tuple[float, ...]:
    return tuple(float(statistics.median(r[method][field])) for r in rows)


def _fastest(rows, method: str) -> tuple[float, ...]:
    return tuple(float(min(r[method]["seconds"])) for r in rows)


def attention_cost(path: Path = COST_MEASURED) -> AttentionCost | None:
    """The shipped measurement with the exponents the bench fitted, or None where it was never made; a damaged file
    is an error that names it and the command that remakes it."""
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        rows = sorted(raw["layer"], key=lambda r: r["n"])
        lengths = tuple(int(r["n"]) for r in rows)
        top = lengths[-int(raw["fit_top"]):]
        layer = {}
        for m in COST_METHODS:
            time, fastest, peak_fit = (Growth.from_record(raw["fits"]["layer"][m][kind])
                                       for kind in ("time", "fastest", "peak"))
            layer[m] = LayerCost(m, lengths, _medians(rows, m, "seconds"), _fastest(rows, m),
                                 _medians(rows, m, "added"),
                                 time.exponent, fastest.exponent, peak_fit.exponent, peak_fit)
        model = None
        if raw.get("model"):
            given = raw["model"]
            m_rows = sorted(given["rows"], key=lambda r: r["n"])
            m_lengths = tuple(int(r["n"]) for r in m_rows)
            m_seconds = tuple(float(statistics.median(r["seconds"])) for r in m_rows)
            share = tuple(float(statistics.median(r["attention_seconds"])) * int(given["layers"]) / s
                          for r, s in zip(m_rows, m_seconds))
            model = ModelCost(str(given["name"]), int(given["layers"]), m_lengths, m_seconds,
                              Growth.from_record(raw["fits"]["model"]["pass"]).exponent, share)
        return AttentionCost(str(raw["date"]), str(raw["machine"]), str(raw["command"]), int(raw["threads"]),
                             int(raw["heads"]), int(raw["d_head"]), int(raw["block"]), int(raw["repeats"]), top,
                             str(raw.get("load", "")), layer, model)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        raise ValueError(f"{path} is not the measurement {COST_BENCH} --publish writes ({type(err).__name__}: {err}); "
                         f"run that command again to remake it") from err


def cost_source(cost: AttentionCost, command: bool = True) -> str:
    """What was measured, in words: the layer's shape, the lengths, one thread or more, the repeats, when and
    where, and (command) the command. A lesson leaves the command out: a student reads the page."""
    threads = "one thread" if cost.threads == 1 else f"{cost.threads} threads"
    lengths = cost.layer["dense"].lengths
    return (f"one attention layer alone, {cost.heads} heads of {cost.d_head} dimensions, float32, every query "
            f"reading every key, {lengths[0]:,}–{lengths[-1]:,} tokens, {threads}, median of {cost.repeats} runs "
            f"with the three alternating; {cost.date}, {cost.machine}"
            + (f"; {cost.load}, so the times carry the noise of a shared machine" if cost.load else "")
            + (f"; `{cost.command}`" if command else ""))


def cost_sentence(cost: AttentionCost, command: bool = True) -> str:
    """The fitted exponents of the layer alone at long lengths, then the whole model's at short ones, in words."""
    top = f"{cost.fit_lengths[0]:,}–{cost.fit_lengths[-1]:,} tokens"
    dense, online, fused = (cost.layer[m] for m in COST_METHODS)
    words = (f"Timed alone at {top}, one attention layer's time grows as n^{dense.fastest_exponent:.2f} on the "
             f"dense path, n^{online.fastest_exponent:.2f} with the online softmax and n^{fused.fastest_exponent:.2f} "
             f"in torch's fused kernel, fitted on the fastest of the {cost.repeats} runs at each length, the least "
             f"disturbed by the machine's other work (on the medians n^{dense.time_exponent:.2f}, "
             f"n^{online.time_exponent:.2f} and n^{fused.time_exponent:.2f}): all three compute every one of the n² "
             "scores, whatever they keep. The memory is "
             f"where they part: the dense path's peak grows "
             f"{growth(dense)} (the n × n weights), the online one's {growth(online)} and the fused kernel's "
             f"{growth(fused)}; at {dense.lengths[-1]:,} tokens the dense "
             f"path added {mib(dense.peak[-1])}, the online one {mib(online.peak[-1])}, the fused kernel "
             f"{mib(fused.peak[-1])}.")
    if cost.model is not None:
        words += " " + model_words(cost.model)
    return f"{words} (Measured: {cost_source(cost, command)}.)"


def model_words(model: ModelCost) -> str:
    """The whole pass: the attention layers' share of it at its shortest and longest length (a ratio of two times
    taken alternately, so the machine's load falls on both), and its growth over all its lengths."""
    first, last = model.attention_share[0], model.attention_share[-1]
    return (f"In the whole model ({model.name}, one pass without a cache) its {model.layers} attention layers took "
            f"{first:.0%} of the pass at {model.lengths[0]:,} tokens and {last:.0%} at {model.lengths[-1]:,}"
            + (": at short lengths the projections and the feed-forward network, linear in n, are most of the work"
               if first < 0.5 else "")
            + (", and the n² part's share grows with the text" if last > first else "")
            + f"; the pass's time grew as n^{model.exponent:.2f} over those lengths.")


def growth(layer: LayerCost) -> str:
    """'as n^1.02', or what stands in for a growth too small to fit, naming the lengths the fit left out."""
    fit = layer.peak_fit
    if not fit.fitted:
        return f"too little to fit a growth to (a peak under {mib(fit.floor)})"
    if fit.left_out:
        return (f"as n^{fit.exponent:.2f} (at {', '.join(f'{n:,}' for n in fit.left_out)} tokens a peak under "
                f"{mib(fit.floor)}, left out)")
    return f"as n^{fit.exponent:.2f}"
