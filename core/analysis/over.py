"""Each single-text analysis over many texts (or prompt pairs), summarised: the mean, its confidence interval and
every item's own value. A summary runs the one measurement of core/analysis per item (or per padded batch of
items, where the measurement takes one) and merges; it never measures a second way. The loop over a job's items,
its checks and its hooks (progress, stop, each, done) are core/corpus/jobs.py's.

ANALYSES names the analyses a saved or chunked job runs (core/corpus/saved.py, core/corpus/chunks.py).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..approx import Approx
from ..attention import padding_or_none
from ..corpus import Pair
from ..corpus.jobs import (BATCH_TOKENS, NAMED, PAIR_TOKENS, PATCH_TOKENS, Analysis, Done, Each, Job, Progress, Stop,
                           ablation_cap_note, check_pairs, check_texts, length_batches, pad_id, padded)
from ..corpus.stats import CORRELATION, NONNEGATIVE, SHARE, UNBOUNDED, Over
from . import heads as head_analysis
from . import patching
from .approx import approx_from_words, approximation, reads_forwards
from .shortcuts import shortcuts_over

RELATIVE_CHANGE = (-1.0, None)     # a positive quantity's relative change, new / old − 1
ABLATION_TEXTS = 8         # ablation_over's default cap on texts: its sweep removes every head once per text

def head_scores_over(model, texts: Sequence[Tensor], batch_tokens: int = BATCH_TOKENS,
                     progress: Progress | None = None, stop: Stop | None = None,
                     each: Each | None = None, done: Done | None = None) -> dict[str, Over]:
    """The Heads tab's attention-pattern scores [L, H] (core/analysis/heads.py row_scores) per text, summarised:
    kind → Over. Texts of similar length go through together, right-padded with an attention mask, and each is
    scored on its own tokens alone (ScoreObserver), so a text scores as it does alone. Decoders also get
    "induction": measured on each text that repeats a span once, after an optional BOS (as the induction probe
    and induction_texts do); the other texts are left out of that kind and named in its note."""
    texts = check_texts(model, texts)
    cfg = model.config
    induction = cfg.causal and model.encoder is None and model.lm_head is not None
    job = Job(len(texts), "text", progress, stop, each).resume(done)
    pad = pad_id(model)
    todo = job.left()

    def measure(places: list[int]) -> None:
        batch = [todo[place] for place in places]
        ids, mask = padded([texts[i] for i in batch], pad)
        # stop() is asked after each layer too (job.inner): one batch may hold the whole corpus
        tables = head_analysis.batch_pattern_scores(model, ids, padding_or_none(mask), induction,
                                                    job.inner)   # name → [B, L, H]
        for row, i in enumerate(batch):
            job.finish(i, {name: t[row] for name, t in tables.items()})

    job.run(length_batches([len(texts[i]) for i in todo], batch_tokens), measure)
    stack_cfg = model.attention_stack()[0].cfg
    shape = (stack_cfg.n_layers, stack_cfg.n_heads)
    names = [name for name in head_analysis.SCORES if name not in head_analysis.CAUSAL_ONLY]
    ranges = head_analysis.SCORE_BOUNDS
    result = {name: job.over(shape, lambda value, name=name: value[name], bounds=ranges[name]) for name in names}
    if induction:
        not_repeats = {i: "not a span repeated once" for i, value in job.values.items()
                       if value["induction"].isnan().all()}
        result["induction"] = job.over(shape, lambda value: value["induction"], not_repeats,
                                       bounds=ranges["induction"])
    return result


def logit_attribution_over(model, pairs: Sequence[Pair], progress: Progress | None = None,
                           stop: Stop | None = None, each: Each | None = None,
                           done: Done | None = None) -> tuple[Over, Over]:
    """Direct logit attribution of logit(answer) − logit(foil) on each pair's clean prompt (core/analysis/
    patching.py logit_attribution), summarised: (heads: Over [L, H], mlps: Over [L]). One pair at a time:
    logit_attribution reads one prompt's records, and batching pairs would need a second implementation of it."""
    patching.check_decoder(model, "direct logit attribution")
    patching.check_pre_norm(model, "direct logit attribution")
    pairs = check_pairs(model, pairs)
    job = Job(len(pairs), "pair", progress, stop, each).resume(done)

    def measure(i: int) -> None:
        parts = patching.logit_attribution(model, pairs[i].clean[None], pairs[i].answer, pairs[i].foil)
        job.finish(i, (parts.heads, parts.mlps))

    job.run(job.left(), measure)
    cfg = model.config
    return (job.over((cfg.n_layers, cfg.n_heads), lambda value: value[0], bounds=UNBOUNDED),
            job.over((cfg.n_layers,), lambda value: value[1], bounds=UNBOUNDED))


by_position = patching.by_position     # whether a sweep's columns are token positions


def check_one_length(pairs: list[Pair]) -> None:
    """Position sites stack sweeps of one width: every pair of the commonest length, else the others named."""
    lengths = [len(pair.clean) for pair in pairs]
    common = max(set(lengths), key=lengths.count)
    others = [i for i, n in enumerate(lengths) if n != common]
    if others:
        named = ", ".join(f"{i} ({lengths[i]})" for i in others[:NAMED]) + (" …" if len(others) > NAMED else "")
        raise ValueError(f"a sweep over positions needs pairs of one token length: most have {common} tokens, "
                         f"but pairs {named} do not; drop or re-template them, or sweep the heads (site 'z' "
                         "without a layer), which takes any lengths")


def pair_groups(pairs: list[Pair], todo: list[int], pair_tokens: int) -> list[list[int]]:
    """The pairs of todo to sweep together, each group at most pair_tokens pairs × its longest prompt (one pair at
    least), ordered by their tail, the tokens from their first difference to the end, then by length: a batch of
    cells resumes every row from its earliest position, left-padded prompts end together, so pairs with like tails
    share a batch with no wasted positions."""
    def tail(i: int) -> int:
        differ = (pairs[i].clean != pairs[i].corrupted).nonzero()
        return len(pairs[i].clean) - (int(differ[0]) if len(differ) else len(pairs[i].clean))

    groups, current, width = [], [], 0
    for i in sorted(todo, key=lambda i: (tail(i), len(pairs[i].clean))):
        width_with = max(width, len(pairs[i].clean))
        if current and (len(current) + 1) * width_with > pair_tokens:
            groups.append(current)
            current, width_with = [], len(pairs[i].clean)
        current.append(i)
        width = width_with
    return groups + ([current] if current else [])


def patch_over(model, pairs: Sequence[Pair], site: str, mode: str = "denoise", layer: int | None = None,
               progress: Progress | None = None, stop: Stop | None = None,
               each: Each | None = None, done: Done | None = None) -> Over:
    """Activation patching (core/analysis/patching.py patch_sweep) of each pair, summarised: per_item holds each
    pair's normalised scores (1: the clean run's metric, 0: the corrupted run's), and mean is the mean of those
    scores, not the normalised mean metric. Position sites (resid_pre, attn_out, mlp_out, and z at one layer)
    need pairs of one token length; the layer × head sweep of z takes any. A pair whose clean and corrupted runs
    give the same logit difference has no normalised score: it is skipped and named in the note.
    Pairs are swept together (patching.sweep_pairs, the sweep patch_sweep runs on a batch of one): up to
    PAIR_TOKENS pairs × their longest prompt, left-padded, share one clean and one corrupted pass, and their cells
    share batches of up to PATCH_TOKENS rows × positions (sizes, not arguments: a saved job is named by what it
    measures). Each pair is handed on as its last cell finishes; stop() is asked between those batches."""
    patching.check_decoder(model, "patching")
    pairs = check_pairs(model, pairs)
    cfg = model.config
    if site not in patching.SITES:
        raise ValueError(f"site must be one of {', '.join(patching.SITES)}, got {site!r}")
    if mode not in patching.MODES:
        raise ValueError(f"mode must be 'denoise' or 'noise', got {mode!r}")
    if layer is not None and (site != "z" or not 0 <= layer < cfg.n_layers):
        raise ValueError(f"layer= sweeps one layer's heads × positions of site 'z' (layers 0..{cfg.n_layers - 1}); "
                         f"got site {site!r}, layer {layer}")
    positions = by_position(site, layer)
    if positions:
        check_one_length(pairs)
    job = Job(len(pairs), "pair", progress, stop, each).resume(done)

    def measure(chosen: list[int]) -> None:
        batch = patching.pair_batch([(pairs[i].clean, pairs[i].corrupted, pairs[i].answer, pairs[i].foil)
                                     for i in chosen], pad_id(model))
        for row, sweep in patching.sweep_pairs(model, batch, site, mode, layer, PATCH_TOKENS, job.inner):
            if sweep.clean_metric == sweep.corrupted_metric:
                job.skip(chosen[row], "its clean and corrupted runs give the same logit difference, "
                                      f"{sweep.clean_metric:.4g}")
            else:
                job.finish(chosen[row], sweep.scores)

    job.run(pair_groups(pairs, job.left(), PAIR_TOKENS), measure)
    n = len(pairs[0].clean)
    shape = patching.sweep_shape(site, layer, n, cfg.n_layers, cfg.n_heads)
    return job.over(shape, bounds=UNBOUNDED)      # normalised scores reach past 0 and 1


def ablation_over(model, texts: Sequence[Tensor], ablation: str = "zero", limit: int | None = ABLATION_TEXTS,
                  batch: int = 16, progress: Progress | None = None, stop: Stop | None = None,
                  each: Each | None = None, done: Done | None = None) -> Over:
    """The mean loss increase when each head alone is removed (core/analysis/heads.py ablation_sweep), per text,
    summarised: Over [L, H]. A sweep runs the model once per head, so by default only the first ABLATION_TEXTS (8)
    texts are swept, and the note says how many were left; limit=None sweeps them all. progress counts texts;
    stop() is asked between the sweep's batches too, so a stop lands within one batch of heads."""
    head_analysis.check_loss_model(model)
    texts = check_texts(model, texts)
    if limit is not None and limit < 1:
        raise ValueError(f"limit is the number of texts to sweep, at least 1 (or None for all), got {limit}")
    chosen = texts if limit is None else texts[:limit]
    job = Job(len(chosen), "text", progress, stop, each).resume(done)
    job.run(job.left(), lambda i: job.finish(i, head_analysis.ablation_sweep(model, chosen[i][None], ablation, batch,
                                                                             progress=job.inner)))
    over = job.over((model.config.n_layers, model.config.n_heads), bounds=UNBOUNDED)   # a loss may also fall
    if len(chosen) < len(texts):
        over.note = "; ".join(part for part in (ablation_cap_note(len(chosen), len(texts), limit), over.note) if part)
    return over


def approximation_value(result) -> dict[str, Tensor]:
    """One text's item of approximation_over, from its ApproxResult: tv and z_error [L, H] (float32, NaN where not
    approximated; tv all NaN without weights per key), measure [2] (exact, approximate; float64, so a ratio of
    them is the ApproxResult's own), cache_bytes [2] (exact, approximate) and tokens []."""
    z_error = result.z_error.float()
    return {"tv": torch.full_like(z_error, float("nan")) if result.tv is None else result.tv.float(),
            "z_error": z_error,
            "measure": torch.tensor([result.exact, result.approximate], dtype=torch.float64),
            "cache_bytes": torch.tensor([result.cache_bytes_exact, result.cache_bytes_approx], dtype=torch.float64),
            "tokens": torch.tensor(float(result.tokens), dtype=torch.float64)}


def approximation_over(model, texts: Sequence[Tensor], approx: Approx | str, progress: Progress | None = None,
                       stop: Stop | None = None, each: Each | None = None, done: Done | None = None) -> dict[str, Over]:
    """core/analysis/approx.py approximation of each text under `approx` (an Approx, or the words approx_words
    writes, as a saved job names it), summarised; one text at a time (a batch's padding would change what BigBird
    and Linformer read). Parts, each an Over with n and its interval's method:
      tv, z_error        [L, H] each head's error beside exact attention (shadow: on exact inputs), NaN where not
                         approximated; tv in [0, 1] (NaN throughout for linformer), z_error ≥ 0: bootstrap intervals
      perplexity_change  [] a decoder's approximate / exact perplexity − 1 per text, in [−1, ∞) (a perplexity is
                         positive): the bootstrap, whose interval cannot pass −1 as Student's t's can when one
                         text's change is huge
      cosine             [] an encoder's cosine of the sentence embeddings, in [−1, 1]: the bootstrap
      measure            [2] the measure exact and approximate (perplexity, or the cosine with its exact 1)
      cache_bytes        [2] the KV cache's bytes per token, exact and approximate (one value for every text)
      tokens             [] each text's length
    A text the approximation refuses alone (a decoder's one-token text, a text longer than fitted projections)
    is left out and named; what holds for every text (the method on this model) is refused before the first."""
    if isinstance(approx, str):
        approx = approx_from_words(approx)
    if not isinstance(approx, Approx):
        raise ValueError(f"approx must be a core.approx.Approx or its words ('topk k=32 layers=3'), "
                         f"got {type(approx).__name__}")
    stack, _ = model.attention_stack()
    approx.check(stack.cfg, len(stack.blocks))
    texts = check_texts(model, texts)
    job = Job(len(texts), "text", progress, stop, each).resume(done)

    def measure(i: int) -> None:
        try:
            job.finish(i, approximation_value(approximation(model, texts[i], approx)))
        except ValueError as error:
            job.skip(i, str(error))

    job.run(job.left(), measure)
    heads = (len(stack.blocks), stack.cfg.n_heads)
    forwards = reads_forwards(model)
    result = {"tv": job.over(heads, lambda value: value["tv"], bounds=SHARE),
              "z_error": job.over(heads, lambda value: value["z_error"], bounds=NONNEGATIVE)}
    if forwards:
        result["perplexity_change"] = job.over((), lambda value: value["measure"][1] / value["measure"][0] - 1,
                                               bounds=RELATIVE_CHANGE)
    else:
        result["cosine"] = job.over((), lambda value: value["measure"][1], bounds=CORRELATION)
    result["measure"] = job.over((2,), lambda value: value["measure"], bounds=NONNEGATIVE if forwards else CORRELATION)
    result["cache_bytes"] = job.over((2,), lambda value: value["cache_bytes"], bounds=NONNEGATIVE)
    result["tokens"] = job.over((), lambda value: value["tokens"], bounds=NONNEGATIVE)
    return result


# ---- the analyses a saved or chunked job runs, by name ----

def patch_axes(arguments: dict) -> dict[str, tuple[str, ...]]:
    if not by_position(arguments["site"], arguments["layer"]):
        return {"over": ("layer", "head")}
    return {"over": ("head", "position") if arguments["site"] == "z" else ("layer", "position")}


ANALYSES = {analysis.name: analysis for analysis in (
    Analysis("head_scores", head_scores_over, "texts", lambda _: {"*": ("layer", "head")}),
    Analysis("logit_attribution", logit_attribution_over, "pairs",
             lambda _: {"heads": ("layer", "head"), "mlps": ("layer",)}),
    Analysis("patch", patch_over, "pairs", patch_axes),
    Analysis("ablation", ablation_over, "texts", lambda _: {"over": ("layer", "head")}),
    Analysis("shortcuts", shortcuts_over, "pairs", lambda _: {"exact": ("measure", "site"), "*": ("method", "site")}),
    Analysis("approximation", approximation_over, "texts",
             lambda _: {"tv": ("layer", "head"), "z_error": ("layer", "head"), "measure": ("run",),
                        "cache_bytes": ("run",), "*": ()}),
)}


def analysis_named(name: str) -> Analysis:
    """The analysis a job of that name runs; the error lists the names."""
    if not isinstance(name, str) or name not in ANALYSES:
        raise ValueError(f"analysis must be one of {', '.join(ANALYSES)}, got {name!r}")
    return ANALYSES[name]
