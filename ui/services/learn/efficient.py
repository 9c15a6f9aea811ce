"""The course's lesson on approximations of attention: did sparse and linear attention lose to exact attention?

Two measurements answer it. The speed is the published bench run (bench/variants/approx_cost.py writes
assets/measured/approx_cost.json): one attention layer alone at SmolLM2-135M's shape, timed from a few hundred to
many thousand tokens exactly (eager, fused, online) and approximately (core/approx.py's methods), with the length
from which each approximation is faster than the fused exact kernel. Nothing is timed at request time: the longest
lengths take minutes. The accuracy is measured here, on the loaded model, through its own switch
(core.analysis.approx.approximation): each approximation in turn on the lesson's text, its budget scaled to the text
so that it keeps the share of the keys it kept where it first won, and the model's change under it (perplexity for
a decoder, the sentence embedding's cosine for an encoder). Never imports gradio."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core.analysis.approx import approximation, reads_forwards
from core.approx import METHODS, NAMES, Approx
from ui.services.approx import cost as approx_cost
from ui.services.learn import Lesson, Measured, ProgressFn, Question, number
from ui.services.learn.generation import progress_to
from ui.services.text import as_batch

# the question's methods: those that change which keys a query reads or how its softmax is computed (the low-rank
# cache changes the keys' projection and is timed against another reference, the exact projection)
SPARSE_LINEAR = ("topk", "bigbird", "performer", "linformer")
# the curves the revealed figure draws: exact attention three ways, then each sparse or linear method; Linformer and
# its reference are bidirectional (Linformer has no causal form)
DRAWN = ("sdpa", "eager", "online", "topk", "bigbird", "performer", "sdpa_bi", "linformer")
LIVE = ("topk", "bigbird", "performer", "linformer", "lowrank_kv")   # measured on the loaded model, in this order
# budgets counted in keys (or rows along the sequence): scaled to the text's length; the others (features, rank of
# the projection) do not depend on it
SEQUENCE_BUDGETS = {"topk": "k", "bigbird": "block", "linformer": "rank"}
EXACT_WORDS = {"sdpa": "fused exact attention", "sdpa_bi": "fused exact attention without a mask",
               "eager": "exact attention holding every weight", "online": "exact attention by the online softmax",
               "sdpa_kv": "the exact projection, then fused exact attention"}

# where the reader goes on: the Masks tab's section runs one approximation at a time on any text
TRY_WORDS = ("Try it runs top-k on this text in the Masks tab's section **Approximate attention**, each head's "
             "error beside exact attention; there you can pick any method and budget, and its **Cost** button draws "
             "the timing run this lesson reads beside a live timing at short lengths.")

EFFICIENT_SAMPLE = (
    "The river rose slowly through the night. By morning the lower fields were under water, and the farmers who "
    "had planted late watched their rows of barley disappear one by one. The old bridge held, as it had held for "
    "a hundred years, but the road beyond it was gone, and the village could be reached only by boat. The "
    "schoolteacher rowed the children across each day and told them the names of the birds that came to feed on "
    "the flooded meadows: herons, egrets, a single white stork that stood on the roof of the mill. When the water "
    "went down a month later it left a layer of dark silt over everything, and the next year's harvest was the "
    "best anyone could remember.")


# ---- the published run (read by ui.services.approx.cost, which the Masks tab's section reads too) ----

def published():
    """The published run (ui.services.approx.cost.PublishedCost), or None where it was never published."""
    return approx_cost.published_cost(approx_cost.COST_MEASURED)


def crossing_length(crossing: dict) -> float | None:
    """The crossover length of one of the run's crossovers: interpolated on log-log where the run brackets it, else
    the shortest measured length where the method was faster; None where it never was."""
    return crossing["interpolated_n"] if crossing["interpolated_n"] is not None else crossing["n"]


def first_crossover(cost) -> dict | None:
    """The sparse or linear approximation that became faster than its exact reference at the shortest length, or
    None where none did at any length the run measured."""
    found = [c for c in cost.crossovers if c["method"] in SPARSE_LINEAR and crossing_length(c) is not None]
    return min(found, key=crossing_length) if found else None


def longest_compared(cost) -> int:
    """The longest length at which a sparse or linear method was timed beside its reference."""
    lengths = [c["up_to"] for c in cost.crossovers if c["method"] in SPARSE_LINEAR and c["up_to"] is not None]
    return max(lengths, default=max(n for m in cost.methods.values() for n in m.lengths))


def run_lengths(cost) -> list[int]:
    return sorted({n for m in cost.methods.values() for n in m.lengths})


def cost_source(cost) -> str:
    """What the run measured, on what, in words: the layer's shape, the inputs, threads, repeats, when and where.
    The command stands beside the run on the Masks tab and in docs/benchmarks.md; a student reads this page."""
    s, lengths = cost.shape, run_lengths(cost)
    threads = "one thread" if cost.threads == 1 else f"{cost.threads} threads"
    return (f"one attention layer alone in SmolLM2-135M's shape ({s['heads']} query heads, {s['kv_heads']} key/value "
            f"heads, d_head {s['d_head']}, {s.get('dtype', 'float32')}), causal (Linformer and its reference without "
            f"a mask), on random queries, keys and values, {lengths[0]:,}–{lengths[-1]:,} tokens, "
            f"{'on a GPU' if cost.on_gpu else 'on a CPU'} with {threads}, median of {cost.repeats} runs with the "
            f"methods alternating; {cost.date}, {cost.machine}"
            + (f"; {cost.load}, so the times carry the noise of a shared machine" if cost.load else ""))


def display_name(method: str) -> str:
    """'Performer' of 'Performer (FAVOR+)': the method's name as the lesson's sentences write it."""
    return NAMES.get(method, EXACT_WORDS.get(method, method)).split(" (")[0]


def budget_words(budget: dict) -> str:
    """'k = 256': a budget as the page writes it (a seed is not a budget)."""
    return ", ".join(f"{k} = {v}" for k, v in budget.items() if k != "seed")


def short_name(method: str, budget: dict) -> str:
    """'BigBird<br>block 4': the method and its first budget term, as a bar is labelled (two lines: a phone's
    width holds five of them side by side)."""
    name, value = next(iter(budget.items()))
    return f"{display_name(method)}<br>{name} {value:,}"


# ---- the lesson's live part: each approximation on the loaded model ----

def scaled_at(cost) -> dict[str, int]:
    """method → the run's length whose share of keys its live budget keeps: where it first ran faster than its exact
    reference, or, never faster, the longest length it was timed at beside it."""
    return {c["method"]: c["n"] if c["n"] is not None else c["up_to"] for c in cost.crossovers
            if c["method"] in SEQUENCE_BUDGETS and (c["n"] or c["up_to"])}


def live_budgets(cost, tokens: int) -> tuple[dict, str]:
    """Each live method's budget on a text of `tokens` tokens, and in words how it was chosen: the run's budgets,
    those counted in keys scaled by tokens / n (the share of the keys each kept at the run's length n, scaled_at);
    without the run, the core's defaults as they are."""
    if cost is None:
        budgets = {m: {k: v for k, v in METHODS[m].items() if k not in ("seed", "fit")} for m in LIVE}
        return budgets, "the approximations' default budgets, since no timing run says which share of keys wins"
    budgets = {m: {k: v for k, v in cost.budgets[m].items() if k != "seed"} for m in LIVE if m in cost.budgets}
    at = scaled_at(cost)
    for method, n in at.items():
        name = SEQUENCE_BUDGETS[method]
        budgets[method][name] = max(1, round(cost.budgets[method][name] * tokens / n))
    shown = ", ".join(f"{display_name(m)}'s {SEQUENCE_BUDGETS[m]} = {cost.budgets[m][SEQUENCE_BUDGETS[m]]:,} of "
                      f"{n:,}" for m, n in at.items())
    return budgets, ("each budget counted in keys scaled to keep the share of the text it kept in the timing run "
                     "where it first ran faster (or, never faster, where it was last timed): " + shown
                     + "; the others as the run had them")


@dataclass(frozen=True)
class LiveResult:
    """One approximation on the loaded model and the lesson's text: its budget, the model's measure with it (and
    without: exact), each approximated head's mean total variation (None without weights per key) and output error,
    or why the model refused it."""
    method: str
    described: str
    refused: str = ""
    measure: str = ""           # "perplexity" or "cosine"
    exact: float = math.nan
    approximate: float = math.nan
    tv: float | None = None
    z_error: float = math.nan

    @property
    def shown(self) -> float:
        """What the figure draws: perplexity approximate / exact, or the embedding's cosine with the exact one."""
        return self.approximate / self.exact if self.measure == "perplexity" else self.approximate


def live_one(model, ids: torch.Tensor, method: str, budget: dict) -> LiveResult:
    """approximation() of one method on every layer and head of the stack that reads the text, or its refusal in
    words (a decoder cannot take Linformer; a family's terms may refuse Performer; a rank above the projection's)."""
    described = f"{display_name(method)} ({budget_words(budget)})"
    if method == "linformer" and model.attention_stack()[0].cfg.causal:
        return LiveResult(method, described, refused="it mixes every position into each row, so a decoder would "
                                                     "read later tokens")
    try:
        result = approximation(model, ids, Approx(method, **budget))
    except ValueError as err:
        return LiveResult(method, described, refused=str(err))
    tv = None if result.tv is None else float(torch.nanmean(result.tv))
    return LiveResult(method, described, "", result.measure, result.exact, result.approximate, tv,
                      float(torch.nanmean(result.z_error)))


def sample_ids(model) -> torch.Tensor:
    """The lesson's text as the model reads it, cut to its context (a model of a shorter context than the text's
    tokens reads its first ones; the words give the count)."""
    ids = model.tokenizer(EFFICIENT_SAMPLE)["input_ids"][:model.config.max_positions]
    return as_batch(ids, model.device)


def sample_read(model, ids: torch.Tensor) -> str:
    """The text the lesson read, for its Try it: the whole sample, or where the model's context cut it, the words of
    the tokens it read."""
    whole = len(model.tokenizer(EFFICIENT_SAMPLE)["input_ids"])
    if ids.shape[1] == whole:
        return EFFICIENT_SAMPLE
    text = model.tokenizer.decode(ids[0].tolist(), skip_special_tokens=True)
    while len(model.tokenizer(text)["input_ids"]) > model.config.max_positions:   # decoding may re-split
        text = text.rsplit(" ", 1)[0]
    return text


def live_words(results: list[LiveResult], tokens: int, chosen: str) -> str:
    """What each approximation did to this model on the text, in its numbers."""
    done = [r for r in results if not r.refused]
    refused = "; ".join(f"{display_name(r.method)} was not run ({r.refused})" for r in results if r.refused)
    if not done:
        return f"On this model no approximation ran on the text's {tokens} tokens: {refused}."
    if done[0].measure == "perplexity":
        head = (f"On this model, with every layer and head approximated, the text's perplexity over its {tokens} "
                f"tokens, {number(done[0].exact)} with exact attention, became")
        parts = [f"{number(r.approximate)} with {r.described}, {number(r.shown)}× exact" for r in done]
    else:
        head = (f"On this model, with every layer and head approximated, the sentence embedding of the text's "
                f"{tokens} tokens kept a cosine with the exact one of")
        parts = [f"{r.approximate:.3f} with {r.described}" for r in done]
    return (f"{head} {'; '.join(parts)} ({chosen})." + (f" {refused[0].upper()}{refused[1:]}." if refused else "")
            + " The model was trained with exact attention and none of these was trained in (Linformer's projection "
              "is a random one here), so this is what switching one on afterwards costs.")


# ---- the lesson ----

def timing_words(cost, first: dict | None) -> str:
    """The answer in words from the run: the first crossover (measured and interpolated, its ratio, its error on the
    run's random inputs), then every other approximation's, as the run wrote it."""
    if first is None:
        head = (f"No sparse or linear approximation ran faster than exact attention at any length up to "
                f"{longest_compared(cost):,} tokens.")
    else:
        exact = EXACT_WORDS.get(first["reference"], first["reference"])
        at = f"at {first['n']:,} tokens it took {first['ratio']:.2f}× the time of {exact}"
        where = (f"its crossover length is ≈{number(crossing_length(first))} tokens (interpolated between the run's "
                 f"lengths; {at})" if first["interpolated_n"] is not None else
                 f"already at the shortest length measured ({at})")
        error = ("" if first["error"] is None else
                 f", its output's relative error there {first['error']:.2g} (‖ẑ − z‖ ÷ ‖z‖ on random inputs, whose "
                 "attention is more diffuse than a trained head's and its output smaller)")
        head = (f"{display_name(first['method'])} was the first to run faster than {exact}: {where}{error}"
                + ("" if first["stays_below"] else ", though not at every longer length") + ".")
    others = [f"{display_name(c['method'])}: {c['words']}" for c in cost.crossovers
              if first is None or c["method"] != first["method"]]
    return head + (" The crossover length of each other approximation (against its own exact reference): "
                   + "; ".join(others) + "." if others else "")


def longest_words(cost) -> str:
    """Why the crossover lies where it does: each method's time over fused exact attention's at the longest length
    where most of them ran."""
    if "sdpa" not in cost.methods:
        return ""
    timed = {m: dict(zip(t.lengths, t.seconds)) for m, t in cost.methods.items()
             if m in ("sdpa", "eager", "online", "topk", "bigbird", "performer")}
    top = max(timed["sdpa"], key=lambda n: (sum(n in t for t in timed.values()), n))
    ratios = [f"{display_name(m)} {t[top] / timed['sdpa'][top]:.2g}×" for m, t in timed.items()
              if m != "sdpa" and top in t]
    return (f"At {top:,} tokens each took, in fused exact attention's time: {', '.join(ratios)}. Exact attention "
            "does all n² of its work as dense matrix products, which the processor runs at its full speed; an "
            "approximation saves work but spends some on gathering blocks, random features or running sums, a cost "
            "per token that only a long text outgrows.")


def gpu_words(cost) -> str:
    if cost.on_gpu:
        return "The run was on a GPU."
    return ("What a GPU would change is not measured here: the run was on a CPU, and on a GPU the exact attention "
            "the texts say won is FlashAttention's fused kernel.")


def unpublished_words() -> str:
    return ("The timing this question asks about is not published in this copy of the project: the approximation "
            "bench measures it (it takes minutes, so the page never times it).")


def bench_values(cost, first: dict | None) -> dict:
    """The curves the revealed figure draws and the crossover it marks."""
    values = {"methods": {m: {"lengths": list(t.lengths), "seconds": list(t.seconds), "name": display_name(m)}
                          for m, t in cost.methods.items() if m in DRAWN},
              "lengths": run_lengths(cost), "repeats": cost.repeats, "date": cost.date, "on_gpu": cost.on_gpu,
              "threads": cost.threads, "crossover": None}
    if first is not None:
        times = cost.methods[first["method"]]
        values["crossover"] = {"method": first["method"], "name": display_name(first["method"]),
                               "reference": first["reference"], "n": first["n"], "length": crossing_length(first),
                               "ratio": first["ratio"], "error": first["error"],
                               "seconds": times.seconds[times.lengths.index(first["n"])]}
    return values


def measure_efficient(model, progress: ProgressFn | None = None) -> Measured:
    """The published run's first crossover (the answer), and each approximation on the loaded model at the share of
    the keys it kept there."""
    cost = published()
    first = None if cost is None else first_crossover(cost)
    ids = sample_ids(model)
    tokens = int(ids.shape[1])
    budgets, chosen = live_budgets(cost, tokens)
    results = []
    for i, method in enumerate(m for m in LIVE if m in budgets):
        progress_to(progress, i / (len(budgets) + 1), f"{display_name(method)} on the text's {tokens} tokens")
        results.append(live_one(model, ids, method, budgets[method]))
    values = {"tokens": tokens, "measure": "perplexity" if reads_forwards(model) else "cosine",
              "live": [{"method": r.method, "name": display_name(r.method),
                        "short": short_name(r.method, budgets[r.method]), "described": r.described,
                        "refused": r.refused, "exact": r.exact, "approximate": r.approximate, "shown": r.shown,
                        "tv": r.tv, "z_error": r.z_error} for r in results],
              "bench": None if cost is None else bench_values(cost, first)}
    answer, answer_text, why = answer_words(cost, first)
    live = live_words(results, tokens, chosen)
    # nothing to draw at all (no run, and this model refused every method): the note says why
    note = live if cost is None and all(r.refused for r in results) else ""
    progress_to(progress, 1.0, "done")
    return Measured(answer=answer, answer_text=f"{answer_text} {live} {TRY_WORDS}", why=why,
                    alt=alt_line(cost, first, results), values=values, note=note,
                    link={"tab": "masks", "settings": {"approx_text": sample_read(model, ids), "approx_method": "topk",
                                                       "k": budgets["topk"]["k"]}, "show": "approx-change"})


def answer_words(cost, first: dict | None) -> tuple[float | str, str, str]:
    """(the answer, its words, why), from the published run; without it, the answer says so."""
    if cost is None:
        return "not published", unpublished_words(), ("An approximation's speed against exact attention is a "
                                                      "measurement of a machine, which this copy has not made.")
    answer = crossing_length(first) if first is not None else f"none faster up to {longest_compared(cost):,} tokens"
    return answer, timing_words(cost, first), f"{longest_words(cost)} {gpu_words(cost)} " \
                                              f"(Measured: {cost_source(cost)}.)"


def alt_line(cost, first: dict | None, results: list[LiveResult]) -> str:
    """The figure's line: the crossover, then the first crossing method's change to this model (or the first that
    ran)."""
    done = [r for r in results if not r.refused]
    if cost is None:
        line = "The timing run is not published"
    elif first is None:
        line = (f"No sparse or linear approximation ran faster than exact attention up to "
                f"{longest_compared(cost):,} tokens")
    else:
        line = (f"{display_name(first['method'])} first ran faster than exact attention from "
                f"≈{number(crossing_length(first))} tokens")
    mine = shown_result(cost, done)
    if mine is not None:
        line += "; " if first is None or mine.method == first["method"] else \
            f"; {display_name(first['method'])} cannot run on this model, and "
        line += (f"{mine.described} made this text's perplexity {number(mine.shown)}× exact"
                 if mine.measure == "perplexity" else
                 f"{mine.described} left this text's sentence embedding at cosine {mine.approximate:.3f} with the "
                 "exact one")
    return line + "."


def shown_result(cost, done: list[LiveResult]) -> LiveResult | None:
    """The live result the figure's line states: the method that crossed over first among those this model ran (by
    the run's crossover lengths), else the first that ran."""
    by_method = {r.method: r for r in done}
    crossed = [] if cost is None else sorted((c for c in cost.crossovers if crossing_length(c) is not None
                                              and c["method"] in SPARSE_LINEAR), key=crossing_length)
    return next((by_method[c["method"]] for c in crossed if c["method"] in by_method), done[0] if done else None)


LESSON_TEXT = (
    "Exact attention (eq. 2.1) scores every query against every key, so its work grows as n² (eq. 6.12). Many "
    "methods cut that term by reading fewer keys or by never forming the scores at all:\n\n"
    "- **Top-k**: each query keeps only its k highest-scoring keys and gives the rest no weight. It still scores "
    "every key to find them, so it saves nothing unless something cheaper guesses which keys those are.\n"
    "- **BigBird** (sparse): the text is cut into blocks; a block of queries reads its own block and its two "
    "neighbours, a few global blocks that read and are read by everyone, and a few random blocks. The work grows "
    "as n.\n"
    "- **Performer** (linear): softmax's exp(q·k) is replaced by a product of random features φ(q)·φ(k), so the "
    "keys and values can be summed once into a small table that every query reads. Linear in n, but only an "
    "estimate of the softmax.\n"
    "- **Linformer** (linear): the keys and values are projected along the sequence onto a fixed number of mixed "
    "rows, and each query weighs those rows instead of the tokens. Mixing positions lets every row hold later "
    "tokens, so it suits an encoder, not a decoder.\n"
    "- **Low-rank KV cache**: the key and value projections are replaced by their best low-rank approximation, so "
    "the cache keeps a few numbers per token instead of every key and value; the attention itself stays exact.\n\n"
    "The texts say that sparse and linear attention (Longformer, BigBird, Performer, Linformer) cut the asymptotic "
    "cost but have largely lost, in practice, to dense attention computed exactly and fast (FlashAttention, "
    "eq. 6.10). Here that claim is put to a clock: one attention layer timed alone, exactly and with each "
    "approximation, at growing lengths on this machine's processor. The answer adds what each approximation does "
    "to the loaded model's output, run through the model's own attention on the text below.")


LESSONS: tuple[Lesson, ...] = (
    Lesson(
        name="approximations",
        title="Approximations: did sparse and linear attention lose?",
        text=LESSON_TEXT,
        question=Question(prompt="On this processor, from how many tokens does the first of the sparse and linear "
                                 "approximations (top-k, BigBird, Performer, Linformer) run faster than fused exact "
                                 "attention?", unit="tokens"),
        measure=measure_efficient,
        text_sample=EFFICIENT_SAMPLE,
    ),
)
