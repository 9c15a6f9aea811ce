"""The course's lessons on generation and cost: the KV cache and its size under grouped-query attention
(eq. 6.9, eq. 6.11), and attention's quadratic term beside FlashAttention's online softmax (eq. 6.12, eq. 6.10).

Every number is read from the loaded model: the cache's bytes from the tensors the core allocates (beside the
formula), the attention weights' bytes from the maps one forward pass captures, the times from forward passes
timed here, and the online softmax from one real head's row (ui/services/inside.py online_row); its memory is the
shipped measurement (ui/services/inside.py), with the formula's count beside it and labelled as one."""

from __future__ import annotations

import numpy as np
import torch

from core import generate as generation
from core.analysis import anatomy
from core.attention import attention, softmax_bytes
from core.machine.growth import growth
from ui.services import inside
from ui.services.learn import cost as layer_cost
from ui.services.generation import generation_reason
from ui.services.generation.kv_cache import fmt_bytes, kv_bytes
from ui.services.learn import Lesson, Measured, ProgressFn, Question, generate_link, number
from ui.services.text import as_batch

KV_SAMPLE = "The keeper lit the lamp at dusk, and the ships found the harbour by its light all night long."
KV_QUESTION_TOKENS = 1024       # the length the question asks about (or the model's context, if shorter)
KV_LENGTHS = (64, 256, 1024)    # lengths whose cache is allocated and read back

COST_SAMPLE = ("Attention compares every token with every other token, so the work it does grows with the text's "
               "length.")
COST_LENGTHS = (32, 64, 128, 256)   # doubling lengths: timed passes and one recorded pass at each
COST_REPEATS = 3                    # timed passes per length; the fastest is kept (the least disturbed by others)
ONLINE_BLOCK = 8                    # keys per block in the online softmax of the real head's row
FORMULA_SETTINGS = (8192, 256)      # tokens and block of the formula's count where no measurement is shipped


def progress_to(progress: ProgressFn | None, fraction: float, what: str) -> None:
    if progress is not None:
        progress(fraction, what)


def no_generation(reason: str, values: dict | None = None) -> Measured:
    """An encoder in a generation lesson: the reason in words, as the answer, the alt line and the note."""
    return Measured(answer="this model keeps no cache", answer_text=reason,
                    why="A KV cache keeps the keys and values of the tokens written so far for the next step; a "
                        "model that writes no next token has no steps and keeps none.",
                    alt=f"Nothing to draw: {reason}", values=values or {}, link={"tab": "generate", "compute": False},
                    note=reason)


# ---- lesson 9: the KV cache, its size (eq. 6.9) and grouped-query attention (eq. 6.11) ----

def filled_bytes(model) -> tuple[int, int, int]:
    """A prefill of KV_SAMPLE into a cache of exactly its length (core.generate.filled_cache): (self-attention
    tokens, source tokens of a seq2seq model's cross-attention cache, the cache's allocated bytes)."""
    cfg = model.config
    ids = model.tokenizer(KV_SAMPLE)["input_ids"][:cfg.max_positions]
    if cfg.is_encoder_decoder:
        cache = generation.filled_cache(model, [cfg.decoder_start_token_id], ids)
        return 1, len(ids), cache.nbytes
    return len(ids), 0, generation.filled_cache(model, ids).nbytes


def measure_kv_cache(model, progress: ProgressFn | None = None) -> Measured:
    """The self-attention cache's bytes at a few lengths, read from the tensors model.new_cache allocates,
    beside eq. 6.9 for this model and for the same model without GQA (h_kv = h)."""
    reason = generation_reason(model)
    if reason:
        return no_generation(reason)
    cfg = model.config
    asked = min(KV_QUESTION_TOKENS, cfg.max_positions)
    lengths = sorted({min(n, cfg.max_positions) for n in KV_LENGTHS} | {asked})
    allocated, dtype = [], ""
    for i, n in enumerate(lengths):
        progress_to(progress, i / (len(lengths) + 1), f"allocating the cache of {n:,} tokens")
        cache = model.new_cache(1, n)
        allocated.append(cache.nbytes)
        bytes_per, dtype = cache.keys[0].element_size(), str(cache.keys[0].dtype).removeprefix("torch.")
        del cache
    progress_to(progress, len(lengths) / (len(lengths) + 1), "filling a cache with the sample's prefill")
    tokens, source, filled = filled_bytes(model)
    size = lambda n, heads: kv_bytes(cfg.n_layers, n, heads, cfg.head_dim, bytes_per)  # eq. 6.9
    formula = [size(n, cfg.n_kv_heads) for n in lengths]
    no_gqa = [size(n, cfg.n_heads) for n in lengths]
    filled_formula = size(tokens, cfg.n_kv_heads) + size(source, cfg.n_kv_heads)
    at = lengths.index(asked)
    mb = allocated[at] / 1e6
    group = cfg.kv_group
    per_token = size(1, cfg.n_kv_heads)
    matches = allocated == formula and filled == filled_formula
    cross = (f" (with the cross-attention keys and values of its {source} source tokens)" if source else "")
    answer_text = (
        f"At {asked:,} tokens the cache the core allocates holds {allocated[at]:,} bytes ({mb:.3g} MB, {dtype}): "
        f"2 · {cfg.n_layers} layers · {asked:,} tokens · {cfg.n_kv_heads} KV heads · {cfg.head_dim} · "
        f"{bytes_per} bytes, eq. 6.9, {per_token:,} bytes a token. "
        + ("The formula gives the same at every length measured"
           if matches else "The formula and the allocated tensors differ here")
        + f", and a prefill of the sample's {tokens} tokens filled a cache of {filled:,} bytes{cross}.")
    if group > 1:
        why = (f"This model's {cfg.n_heads} query heads share {cfg.n_kv_heads} key/value heads, {group} to each "
               f"(eq. 6.11), so its cache is {group}× smaller than with one KV head per query head: "
               f"{mb:.3g} MB against {no_gqa[at] / 1e6:.3g} MB at {asked:,} tokens.")
    else:
        why = (f"This model keeps one key/value head per query head ({cfg.n_heads}, no GQA), so nothing shrinks "
               f"its cache: it grows by {fmt_bytes(per_token)} with every token, {mb:.3g} MB at {asked:,}.")
    alt = (f"KV cache at {asked:,} tokens: {mb:.3g} MB allocated ({dtype}, h_kv = {cfg.n_kv_heads}); without GQA "
           f"(h_kv = {cfg.n_heads}) {no_gqa[at] / 1e6:.3g} MB.")
    progress_to(progress, 1.0, "done")
    return Measured(
        answer=mb, answer_text=answer_text, why=why, alt=alt,
        values={"lengths": lengths, "allocated": allocated, "formula": formula, "no_gqa": no_gqa, "asked": asked,
                "dtype": dtype, "bytes_per": bytes_per, "layers": cfg.n_layers, "heads": cfg.n_heads,
                "kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "filled_tokens": tokens,
                "filled_source": source, "filled_bytes": filled, "filled_formula": filled_formula},
        link=generate_link(model, KV_SAMPLE, "gen-kv-fig"))


# ---- lesson 10: the quadratic term (eq. 6.12) and the online softmax (eq. 6.10) ----

def filler(model, n: int) -> list[int]:
    """COST_SAMPLE's tokens repeated to exactly n tokens (no special tokens: only the length matters here)."""
    ids = model.tokenizer(COST_SAMPLE, add_special_tokens=False)["input_ids"]
    return (ids * (n // len(ids) + 1))[:n]


def first_layer_weights(model, ids: torch.Tensor) -> torch.Tensor:
    """Layer 0's attention weights [H, T, T] of the stack that reads the text, recorded in one pass (the other
    layers run the fused kernel, which keeps no weights)."""
    records, _ = anatomy.recorded(model, ids, ("pattern",), [0])
    return records["pattern"][0]


def fastest_pass(model, ids: torch.Tensor, repeats: int = COST_REPEATS) -> float:
    """Seconds of the fastest of `repeats` forward passes over ids, without a cache, by the fused kernel."""
    clock, best = generation.device_clock(model), float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            started = clock()
            model(ids, return_logits=False)
            best = min(best, clock() - started)
    return best


def line_fit(lengths, seconds) -> tuple[float, float]:
    """(fixed seconds a pass, seconds a token): seconds ≈ fixed + per_token · n, least squares."""
    per_token, fixed = np.polyfit(np.asarray(lengths, float), np.asarray(seconds, float), 1)
    return float(fixed), float(per_token)


def milliseconds(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:,.0f} ms" if ms >= 10 else f"{ms:.2g} ms"


def cost_words(lengths, seconds, exponent: float, fixed: float) -> str:
    """Why the time grows slower than n², in measured numbers."""
    first, last = lengths[0], lengths[-1]
    grew = seconds[-1] / seconds[0]
    head = (f"The weights grow as n² exactly, but a whole forward pass without a cache took {grew:.2g}× longer for "
            f"{last // first}× the tokens ({first} → {last}), time ∝ n^{exponent:.2f}, not n² and not even n:")
    if fixed > 0:
        share = fixed / seconds[0]
        return (f"{head} a straight line through the times starts at {milliseconds(fixed)} for no tokens at all, "
                f"{share:.0%} of the pass at {first} tokens, the fixed cost of reading every weight matrix and "
                f"running each layer, so at these lengths the n² term (eq. 6.12) is still hidden.")
    return (f"{head} at these lengths the projections and the feed-forward network, linear in n, outweigh the n² "
            "term of eq. 6.12.")


def layer_alone_now(model, n: int, heads: int, d_head: int, repeats: int = COST_REPEATS) -> dict:
    """One attention layer alone timed here and now as the shipped bench times it (random q, k, v
    [1, heads, n, d_head] float32, no mask: eq. 2.1 over all n² pairs), on the model's device: the fastest of
    `repeats` calls on the explicit path (every weight held: return_probs) and on the fused one, after a warm-up."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, d_head, generator=gen).to(model.device) for _ in range(3))
    clock, seconds = generation.device_clock(model), {}
    with torch.inference_mode():
        for method, probs in (("dense", True), ("fused", False)):
            attention(q, k, v, return_probs=probs)                                # warm-up, not kept
            best = float("inf")
            for _ in range(repeats):
                started = clock()
                attention(q, k, v, return_probs=probs)
                best = min(best, clock() - started)
            seconds[method] = best
    return {"n": n, "heads": heads, "d_head": d_head, "threads": torch.get_num_threads(),
            "device": model.device.type, "seconds": seconds}


def online_check(model) -> inside.OnlineRow:
    """The online softmax (eq. 6.10) of the last query row of a middle layer's first head on COST_SAMPLE,
    beside that head's own weights in the pass."""
    tokens = inside.encode_walk(model, COST_SAMPLE)
    stack = model.attention_stack()[0]
    return inside.online_row(model, tokens, len(stack.blocks) // 2, 0, -1, ONLINE_BLOCK)


def measure_cost(model, progress: ProgressFn | None = None) -> Measured:
    """One head's attention weights counted at doubling lengths (their bytes in a recorded pass), the forward
    pass timed at the same lengths with its exponent fitted, and one real row's online softmax."""
    lengths = [n for n in COST_LENGTHS if n <= model.config.max_positions]
    n_layers = len(model.attention_stack()[0].blocks)
    per_head, all_maps, seconds = [], [], []
    fastest_pass(model, as_batch(filler(model, lengths[0]), model.device), 1)   # warm-up, not kept
    for i, n in enumerate(lengths):
        progress_to(progress, i / (len(lengths) + 1), f"{n} tokens: capturing the weights, timing the pass")
        ids = as_batch(filler(model, n), model.device)
        weights = first_layer_weights(model, ids)                                  # [H, n, n]
        per_head.append(weights[0].numel() * weights.element_size())
        all_maps.append(n_layers * weights.numel() * weights.element_size())     # every layer holds as many
        del weights
        seconds.append(fastest_pass(model, ids))
    progress_to(progress, len(lengths) / (len(lengths) + 1), "the online softmax of one row")
    row = online_check(model)
    n, doubled = lengths[-2], lengths[-1]
    ratio = per_head[-1] / per_head[-2]
    exponent = growth(lengths, seconds).exponent
    fixed, per_token = line_fit(lengths, seconds)
    memory_words, memory_values = softmax_memory(row.d_head)
    stack_cfg = inside.stack_config(model)
    answer_text = (
        f"One head's weights at {doubled} tokens take {per_head[-1]:,} bytes against {per_head[-2]:,} at {n}: "
        f"{number(ratio)}× (eq. 6.12); {n_layers} layers of {stack_cfg.n_heads} heads like layer 0 would hold "
        f"{fmt_bytes(all_maps[-1])}. The online softmax (eq. 6.10) of L{row.layer} H{row.head}'s last "
        f"row, read {row.block} keys at a time, equals the pass's own weights to {row.probs_difference:.1e}. "
        + memory_words)
    progress_to(progress, 1.0, "done")
    return Measured(
        answer=ratio, answer_text=answer_text,
        why=cost_words(lengths, seconds, exponent, fixed) + " " + layer_cost_words(),
        alt=(f"From {n} to {doubled} tokens one head's weights grew {number(ratio)}× (n²); the forward pass's time "
             f"grew as n^{exponent:.2f}."),
        values={"lengths": lengths, "per_head_bytes": per_head, "all_maps_bytes": all_maps, "seconds": seconds,
                "exponent": exponent, "fixed_seconds": fixed, "seconds_per_token": per_token,
                "online_layer": row.layer, "online_head": row.head, "online_block": row.block,
                "online_max_error": row.probs_difference, "online_output_error": row.output_difference,
                **memory_values, "layer_cost": layer_cost_values(), "layer_now": layer_now(model, doubled)},
        link={"tab": "inside", "layer": row.layer, "head": row.head, "text": COST_SAMPLE,
              "show": "inside-online-figure"})


def layer_cost_words() -> str:
    """One attention layer timed alone at long lengths, where its n² term shows (the shipped measurement,
    ui/services/learn/cost.py), in words; or why it is not here."""
    cost = layer_cost.attention_cost()
    if cost is None:
        return ("One attention layer timed alone at long lengths, where its n² term would show, is not measured in "
                "this copy.")
    return "To see the n² term, take the layer apart from the rest and make the text long. " + \
        layer_cost.cost_sentence(cost, command=False)


def layer_cost_values() -> dict | None:
    """The shipped layer timings and their fitted exponents, as the words above state them."""
    cost = layer_cost.attention_cost()
    if cost is None:
        return None
    return {"fit_lengths": list(cost.fit_lengths), "threads": cost.threads, "repeats": cost.repeats,
            "heads": cost.heads, "d_head": cost.d_head, "date": cost.date,
            "methods": {m: {"lengths": list(c.lengths), "seconds": list(c.seconds), "fastest": list(c.fastest),
                            "peak": list(c.peak), "time_exponent": c.time_exponent,
                            "fastest_exponent": c.fastest_exponent, "peak_exponent": c.peak_exponent}
                        for m, c in cost.layer.items()},
            "model": None if cost.model is None else {"lengths": list(cost.model.lengths),
                                                      "seconds": list(cost.model.seconds),
                                                      "exponent": cost.model.exponent,
                                                      "attention_share": list(cost.model.attention_share)}}


def layer_now(model, n: int) -> dict | None:
    """The layer alone at the lesson's longest length, in the shipped run's shape (to stand beside it), or None
    where that run is not in this copy."""
    cost = layer_cost.attention_cost()
    return None if cost is None else layer_alone_now(model, n, cost.heads, cost.d_head)


def softmax_memory(d_head: int) -> tuple[str, dict]:
    """The online softmax's memory in words: the shipped measurement (ui/services/inside.py), then apart from it
    the formula (core.attention.softmax_bytes) at the measurement's largest size and settings (without one, at
    FORMULA_SETTINGS and this head's d_head); and both as values."""
    memory = inside.online_softmax_memory()
    n, block, d_head = (memory.rows[-1].n, memory.block, memory.d_head) if memory else (*FORMULA_SETTINGS, d_head)
    counted = softmax_bytes(n, n, block, d_head)
    measured = (f"Its memory, measured: {inside.measured_sentence(memory, command=False)} " if memory else
                f"Its memory is not measured in this copy (`{inside.BENCH} --publish` measures it). ")
    formula = (f"Apart from that, the formula `softmax_bytes` counts from the shapes, not measured, what each holds "
               f"at once beyond q, k, v and the output at {n:,} tokens, d_head {d_head}, blocks of {block}: the plain "
               f"scores and weights (2·n²), {inside.mib(counted['plain'])}; the online loop's previous block of scores and "
               f"weights beside the new block's (4·n·block), its output accumulator and running max and sum, "
               f"{inside.mib(counted['online'])} ({counted['plain'] / counted['online']:,.1f}× less).")
    values = {"softmax_bytes": {"n": n, "block": block, "d_head": d_head, **counted},
              "softmax_measured": None if memory is None else {
                  "date": memory.date, "method": memory.method,
                  "rows": [{"n": r.n, "plain": r.plain, "online": r.online, "fused": r.fused} for r in memory.rows]}}
    return measured + formula, values


LESSONS: tuple[Lesson, ...] = (
    Lesson(
        name="kv-cache",
        title="Generation: the KV cache, its size, grouped-query attention",
        text=(
            "A decoder writes one token at a time, and each new token's query must be scored against the keys of "
            "every earlier token. Those keys and values do not change once computed, so the model keeps them: the "
            "**KV cache**. A decode step then computes only the new token's query, key and value and reads the "
            "rest from the cache.\n\n"
            "The price is memory, linear in the length: **eq. 6.9**, bytes = 2 · L · n · h_kv · d_head · bytes per "
            "number (keys and values, for L layers and n tokens). Long generation runs short of exactly this, which "
            "is why many recent models use **grouped-query attention** (**eq. 6.11**): h query heads share h_kv < h "
            "key/value heads, and the cache shrinks by h / h_kv. Here the cache is allocated by the core for the "
            "loaded model and its bytes read back from the tensors."),
        question=Question(prompt=f"How many megabytes does this model's KV cache take at {KV_QUESTION_TOKENS:,} "
                                 "tokens, in the dtype it runs in?", unit="MB"),
        measure=measure_kv_cache,
        text_sample=KV_SAMPLE,
    ),
    Lesson(
        name="cost",
        title="Cost: the quadratic term, and FlashAttention's exact tiled softmax",
        text=(
            "Every head of every layer scores each of n queries against each of n keys, so the weights it holds "
            "are n × n: **eq. 6.12**, score memory L · H · n² · bytes, and as much work again to compute them. "
            "Everything else in a layer (the projections, the feed-forward network) grows only as n.\n\n"
            "FlashAttention avoids holding the n × n matrix with the **online softmax** (**eq. 6.10**): it reads "
            "the keys a block at a time and keeps, per query, only the running max m and sum ℓ, rescaling what it "
            "has summed whenever a block raises the max. The result is the softmax itself, not an approximation. "
            "Here the weights are counted at doubling lengths, the forward pass is timed at the same lengths, and "
            "one real head's row is read online. The answer adds one attention layer timed alone on much longer "
            "texts, three ways (every score held, the online softmax, torch's fused kernel), where the n² term is "
            "no longer hidden by the rest of the pass."),
        question=Question(prompt="When a text doubles in length, how many times more memory do one head's attention "
                                 "weights take?", unit="×"),
        measure=measure_cost,
        text_sample=COST_SAMPLE,
    ),
)
