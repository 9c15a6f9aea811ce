"""What each head does and whether the output depends on it, as plain values over core.analysis.heads: scores per
layer × head, the induction probe, ablation and the sweep, attribution for one prediction, the logit lens and
surprisal. A session's results for its model and text are kept in its HeadsCache (in the KeptStore), so moving
between the Heads tab's sections does not recompute them."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field

import numpy as np
import torch

from core.analysis import heads
from core.analysis.capture import layer_map
from core.corpus import stats
from ui.services.checks import UserError, check_choice, check_range, index_of
from ui.services.checks import check_head, stack_shape as scored_shape  # noqa: F401 - the tab's layer and head
from ui.services.jobs import stream_job
from ui.services.text import Encoded, as_batch, one_token, to_numpy, token_grid, token_texts

MAX_HEADS_TOKENS = 512  # the Heads tab's cap: its sections run the model several times on the text
MAX_SWEEP_TOKENS = 128  # the sweep runs the text once per head (270 times for SmolLM2)
SWEEP_BATCH = 16  # heads ablated per forward pass of the sweep
MAX_IG_STEPS = 256
MAX_IG_TOKEN_STEPS = 4096  # steps × tokens bounds integrated gradients' time; memory is one pass's of
                           # heads.IG_TOKENS_PER_PASS token-points, whatever the steps
COMPLETENESS_STEPS = (8, 32, 128)  # the step counts at which the completeness error is measured and shown
INDUCTION_LENGTH = 100  # the probe: 100 seeded random tokens, then the same 100 again
INDUCTION_SEED = 0
TOP_HEADS = 5  # rows per score in the top-heads table, and the heads "top 5 by a score" picks
SCORES, LOCAL_WINDOW = heads.SCORES, heads.LOCAL_WINDOW  # score name → (description, threshold, head name)
named_heads, naming_rule = heads.named_heads, heads.naming_rule   # the one rule per named head
spearman = stats.spearman   # Spearman's ρ, the one the core computes everywhere
ATLAS_ADVICE = "The atlas above shows its encoder's heads."


def next_token_reason(model, what: str, advice: str | None = None) -> str | None:
    """Why `what` (a next-token measurement) cannot run on this model, or None when it can. advice: a sentence
    after every reason (the Patching tab's); without it an encoder-decoder is pointed to the atlas."""
    cfg = model.config
    if cfg.is_encoder_decoder:
        reason = (f"{what} reads decoder-only models here: this is an encoder-decoder, whose decoder needs a target "
                  "text of its own.")
        return f"{reason} {advice or ATLAS_ADVICE}"
    if not cfg.causal:
        reason = (f"{what} measures next-token prediction, and this model is an encoder: it reads the text in both "
                  "directions and predicts no next token.")
    elif model.lm_head is None:
        reason = f"{what} needs an LM head to predict tokens, and this checkpoint has none."
    else:
        return None
    return reason if advice is None else f"{reason} {advice}"


def lm_head_reason(model, what: str) -> str | None:
    """Why `what` (a reading of token predictions: lens, attribution) cannot run here, or None when it can."""
    if model.config.is_encoder_decoder:
        return (
            f"{what} reads decoder-only models and encoders with an LM head here: this is an encoder-decoder, "
            "whose predictions come from a decoder that needs a target text of its own."
        )
    if model.lm_head is None:
        return (
            f"{what} reads each position's token prediction through the LM head, and this checkpoint has none "
            "(a sentence encoder such as all-MiniLM-L6-v2 keeps only the encoder), so there is nothing to read."
        )
    return None


def score_names(model) -> list[str]:
    """The head scores that make sense for this model: the induction probe only where it predicts next tokens."""
    skip = heads.CAUSAL_ONLY if next_token_reason(model, "The probe") else ()
    return [name for name in heads.SCORES if name not in skip]


HEADS_KEPT = ("heads",)  # a session's HeadsCache in the KeptStore, under its own ticket


@dataclass
class HeadsCache:
    """One session's results for its current model and text, so moving between the Heads tab's sections does
    not recompute them. The induction probe depends on the model only and survives a new text."""

    key: tuple  # (model name, token count, hash of the ids)
    tokens: Encoded
    scores: dict[str, torch.Tensor] | None = None  # the text's attention-pattern scores, name → [L, H]
    induction: heads.InductionResult | None = None
    sweep_scores: dict[str, torch.Tensor] | None = None  # the same scores on the sweep's first tokens
    sweeps: dict[str, torch.Tensor] = field(default_factory=dict)  # ablation → [L, H] mean loss increase
    probe_sweeps: dict[str, torch.Tensor] = field(default_factory=dict)  # the same on the induction probe
    lens: heads.LensTable | None = None
    surprisal: heads.Surprisal | None = None
    attribution: tuple | None = None  # (AttributionSettings, heads.Attribution) of the last call
    completeness: tuple | None = None  # (its settings, [CompletenessRow]) of the last completeness table

    @property
    def model_name(self) -> str:
        return self.key[0]


def heads_cache(previous: HeadsCache | None, model_name: str, tokens: Encoded) -> HeadsCache:
    """The session's cache for this model and text: the previous one when both are unchanged."""
    key = (model_name, len(tokens.ids), hash(tuple(tokens.ids)))
    if previous is not None and previous.key == key:
        return previous
    cache = HeadsCache(key, tokens)
    if previous is not None and previous.model_name == model_name:
        cache.induction, cache.probe_sweeps = previous.induction, previous.probe_sweeps
    return cache


def session_cache(previous: HeadsCache | None, model_name: str, tokens: Encoded) -> HeadsCache:
    """This call's cache for the model and text: a copy of the session's previous one when it still fits (what
    the call adds goes into the copy), else a new one. Never the previous one itself: a result (the atlas of the
    default text) may be shared by every session."""
    cache = heads_cache(previous, model_name, tokens)
    return dataclasses.replace(cache, sweeps=dict(cache.sweeps), probe_sweeps=dict(cache.probe_sweeps))


def cached_induction(model, cache: HeadsCache) -> heads.InductionResult | None:
    """The model's induction probe (kept in the cache), or None where the model predicts no next token."""
    if next_token_reason(model, "The probe") is not None:
        return None
    if cache.induction is None:
        cache.induction = heads.induction(model, INDUCTION_LENGTH, INDUCTION_SEED)
    return cache.induction


def head_scores(model, cache: HeadsCache) -> dict[str, torch.Tensor]:
    """Every score of every head, name → [L, H]: the text's attention patterns, and the induction probe's."""
    if cache.scores is None:
        cache.scores = heads.pattern_scores(model, as_batch(cache.tokens.ids, model.device))
    scores = dict(cache.scores)
    probe = cached_induction(model, cache)
    if probe is not None:
        scores["induction"] = probe.scores
    return scores


def sweep_scores(model, cache: HeadsCache, limit: int) -> dict[str, torch.Tensor]:
    """The scores on the text's first `limit` tokens (the sweep's), so that both maps read the same tokens."""
    if len(cache.tokens.ids) <= limit:
        return head_scores(model, cache)
    if cache.sweep_scores is None:
        cache.sweep_scores = heads.pattern_scores(model, as_batch(cache.tokens.ids[:limit], model.device))
    scores = dict(cache.sweep_scores)
    probe = cached_induction(model, cache)
    if probe is not None:
        scores["induction"] = probe.scores
    return scores


def check_score(model, name: str) -> str:
    """A score name this model has, or a UserError that lists them (and why induction may be missing)."""
    names = score_names(model)
    if not isinstance(name, str):
        raise UserError(f"The score must be one name, not a {type(name).__name__}; choose one of {', '.join(names)}.")
    if name in names:
        return name
    if name in heads.SCORES:
        raise UserError(f"The {name} score is not available here. {next_token_reason(model, 'The induction probe')}")
    raise UserError(f"Unknown score {name!r}; choose one of {', '.join(names)}.")


def top_heads(table: torch.Tensor, name: str, k: int = TOP_HEADS) -> list[tuple[int, int, float]]:
    """The k most characteristic heads for a score: highest, or lowest for entropy (low entropy is focused)."""
    return heads.top_heads(table, k, largest=name != "entropy")


def head_map(model, ids: list[int], layer: int, head: int) -> np.ndarray:
    """One head's attention over the text [n, n] (a seq2seq model: its encoder's), by a pass up to that layer."""
    return to_numpy(layer_map(model, as_batch(ids, model.device), layer)[head])


HEAD_PATTERN = re.compile(r"(\d{1,6})\.(\d{1,6})", re.ASCII)


def parse_heads(text: str | None, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """"3.2, 5.0" → [(3, 2), (5, 0)] (layer.head, in order, repeats dropped), or a UserError naming the bad one."""
    items = [item for item in re.split(r"[,;\s]+", text or "") if item]
    if not items:
        raise UserError('No heads to ablate: write them as layer.head, e.g. "3.2, 5.0", or pick the top 5 by a score.')
    chosen: list[tuple[int, int]] = []
    for item in items:
        match = HEAD_PATTERN.fullmatch(item)
        if match is None:
            raise UserError(f"{item!r} is not a head: write layer.head with two whole numbers, e.g. 3.2.")
        layer, head = int(match[1]), int(match[2])
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise UserError(
                f"Head {item} does not exist: this model has layers 0–{n_layers - 1} and heads 0–{n_heads - 1}."
            )
        if (layer, head) not in chosen:
            chosen.append((layer, head))
    return chosen


def format_heads(pairs) -> str:
    return ", ".join(f"{layer}.{head}" for layer, head, *_ in pairs)


def check_ablation(kind: str) -> str:
    if not isinstance(kind, str) or kind not in ("zero", "mean"):
        raise UserError(f"Ablation must be 'zero' or 'mean', got {kind!r}.")
    return kind


def alternatives(model, result: heads.Surprisal) -> list[list[tuple[str, float]]]:
    """The top alternatives at each predicted position as (token text, probability)."""
    ids, probs = result.alternatives.numpy(), to_numpy(result.probs)
    grid = token_grid(model, ids)
    return [list(zip(names, row.tolist())) for names, row in zip(grid, probs)]


@dataclass
class AblationView:
    heads: list[tuple[int, int]]
    labels: list[str]  # the token each loss is for: the next one (a decoder), the one there (an MLM encoder)
    clean_loss: np.ndarray  # [T - 1] for a decoder, [T] for an MLM encoder; nats
    ablated_loss: np.ndarray
    changed: list[tuple[int, str, str, str, str]]  # (position, token there, clean top, ablated top, the text's)

    @property
    def delta(self) -> np.ndarray:
        return self.ablated_loss - self.clean_loss


def loss_tokens(model) -> int:
    """The fewest tokens a loss can be measured on: a decoder needs a next token, an MLM encoder only one."""
    return 2 if model.config.causal else 1


def ablation(model, tokens: Encoded, head_pairs: list[tuple[int, int]], kind: str) -> AblationView:
    """Per-token loss with and without the heads, and the positions whose top prediction changed."""
    reason = lm_head_reason(model, "Ablation")
    if reason:
        raise UserError(reason)
    if len(tokens.ids) < loss_tokens(model):
        raise UserError("Ablation needs at least 2 tokens: there is no next token to predict in one.")
    result = heads.ablate(model, as_batch(tokens.ids, model.device), head_pairs, check_ablation(kind))
    n, causal = len(tokens.ids), model.config.causal
    positions = result.changed.tolist()
    clean = token_texts(model, result.clean_top[positions].tolist())
    ablated = token_texts(model, result.ablated_top[positions].tolist())
    answers = [
        (tokens.labels[p + 1] if p + 1 < n else "(after the text)") if causal else tokens.labels[p] for p in positions
    ]
    changed = [(p, tokens.labels[p], c, a, t) for p, c, a, t in zip(positions, clean, ablated, answers)]
    labels = tokens.labels[1:] if causal else tokens.labels
    return AblationView(head_pairs, labels, to_numpy(result.clean_loss), to_numpy(result.ablated_loss), changed)


@dataclass
class SweepUpdate:
    done: int  # heads ablated so far
    total: int
    increase: torch.Tensor | None  # [L, H] once finished
    seconds: float


def stream_sweep(model, ids: list[int], kind: str, batch: int = SWEEP_BATCH) -> Iterator[SweepUpdate]:
    """Ablate every head of the main stack alone, `batch` at a time, yielding after each batch and then the
    [L, H] map of mean loss increase. The sweep runs in a worker thread; closing the iterator stops it."""
    kind = check_ablation(kind)
    work = lambda report: heads.ablation_sweep(model, as_batch(ids, model.device), kind, batch, report)  # noqa: E731
    with closing(stream_job(work, model.config.n_layers * model.config.n_heads, "ablation-sweep")) as updates:
        for update in updates:
            yield SweepUpdate(update.done, update.total, update.result, update.seconds)


@dataclass
class SweepPlan:
    """Where the sweep removes each head: on the tokens its score was measured on, so that the two maps compare."""
    ids: list[int]  # the tokens whose mean loss each ablation changes
    on_probe: bool  # the induction probe (INDUCTION_LENGTH seeded random tokens, twice), else the text's start
    text_tokens: int  # the text's own count, to say when the sweep read only its first MAX_SWEEP_TOKENS


def sweep_plan(model, cache: HeadsCache, score: str) -> SweepPlan:
    """The induction score is measured on the probe, so its sweep runs on the probe; every other score and its
    sweep read the text's first MAX_SWEEP_TOKENS tokens (sweep_scores)."""
    n = len(cache.tokens.ids)
    probe = cached_induction(model, cache) if score == "induction" else None
    if probe is not None:
        return SweepPlan(probe.ids[0].tolist(), True, n)
    ids = cache.tokens.ids[:MAX_SWEEP_TOKENS]
    if len(ids) < loss_tokens(model):
        raise UserError("The sweep needs at least 2 tokens: there is no next token to predict in one.")
    return SweepPlan(ids, False, n)


def kept_sweep(cache: HeadsCache, plan: SweepPlan, kind: str) -> torch.Tensor | None:
    """The session's [L, H] loss increase for this ablation on the plan's tokens, or None when not run yet."""
    return (cache.probe_sweeps if plan.on_probe else cache.sweeps).get(kind)


def keep_sweep(cache: HeadsCache, plan: SweepPlan, kind: str, increase: torch.Tensor) -> None:
    (cache.probe_sweeps if plan.on_probe else cache.sweeps)[kind] = increase


def added_head(listed: str | None, layer_value, head_value) -> str:
    """The ablation list "3.2, 5.0" with layer.head added once, or a UserError when either is not a whole number."""
    layer, head = index_of(layer_value or 0), index_of(head_value or 0)
    if layer is None or head is None:
        raise UserError(f"Layer and head must be whole numbers to add a head, got {layer_value!r}.{head_value!r}.")
    entry = f"{layer}.{head}"
    items = [item.strip() for item in (listed or "").split(",") if item.strip()]
    return ", ".join(items if entry in items else [*items, entry])


def explained_token(model, field: str, text, empty: str) -> int | None:
    """A target or foil box's token id (None when empty), within what the LM head predicts."""
    token = one_token(model, field, text, empty)
    if token is not None and token >= model.config.vocab_size:
        raise UserError(f"{field}: {text!r} is token {token}, which this model's LM head does not predict (it "
                        f"scores ids 0–{model.config.vocab_size - 1}).")
    return token


@dataclass(frozen=True)
class AttributionSettings:
    position: int
    layer: int
    head: int
    steps: int
    target: int | None  # None: the model's top token
    foil: int | None
    baseline: str


def attribution_settings(model, cache: HeadsCache, position, layer, head, steps, target_text=None, foil_text=None,
                         baseline="pad") -> AttributionSettings:
    """Every attribution setting checked, with the steps × tokens budget (MAX_IG_TOKEN_STEPS)."""
    reason = lm_head_reason(model, "Attribution")
    if reason:
        raise UserError(reason)
    cfg = model.config
    n = len(cache.tokens.ids)
    position = check_range("Position", position, -1, n - 1)
    position = n - 1 if position == -1 else position
    layer = check_range("Layer", layer, 0, cfg.n_layers - 1)
    head = check_range("Head", head, 0, cfg.n_heads - 1)
    steps = check_range("Steps", steps, 1, MAX_IG_STEPS)
    used = position + 1 if cfg.causal else n  # a decoder's prediction at p reads tokens 0..p
    if steps * used > MAX_IG_TOKEN_STEPS:
        raise UserError(
            f"Integrated gradients would run {steps} steps × {used} tokens = {steps * used:,} token passes at once; "
            f"the limit is {MAX_IG_TOKEN_STEPS:,}. Use at most {max(1, MAX_IG_TOKEN_STEPS // used)} steps"
            + (", or an earlier position." if cfg.causal else ", or a shorter text.")
        )
    check_choice("Baseline", baseline, heads.BASELINES)
    target = explained_token(model, "Target token", target_text, "for the model's top token")
    foil = explained_token(model, "Foil token", foil_text, "for no foil")
    return AttributionSettings(position, layer, head, steps, target, foil, baseline)


def attribution(model, cache: HeadsCache, position, layer, head, steps, target_text=None, foil_text=None,
                baseline="pad") -> heads.Attribution:
    """Attention, rollout, gradient × input and integrated gradients for the prediction at one position (of
    logit(target), or of logit(target) − logit(foil)), with every setting checked first. The last result is kept
    in the cache with its settings."""
    settings = attribution_settings(model, cache, position, layer, head, steps, target_text, foil_text, baseline)
    if cache.attribution is None or cache.attribution[0] != settings:
        ids = as_batch(cache.tokens.ids, model.device)
        try:
            result = heads.attribute(model, ids, settings.position, settings.layer, settings.head, settings.steps,
                                     target=settings.target, foil=settings.foil, baseline=settings.baseline)
        except (ValueError, IndexError) as exc:
            raise UserError(str(exc)) from exc
        cache.attribution = (settings, result)
    return cache.attribution[1]


@dataclass
class CompletenessRow:
    steps: int
    measured: heads.Completeness | None  # None: not run, for the reason in `skipped`
    skipped: str = ""


def completeness_table(model, cache: HeadsCache, result: heads.Attribution,
                       counts=COMPLETENESS_STEPS) -> list[CompletenessRow]:
    """The completeness error of `result`'s integrated gradients (the same position, target, foil and baseline)
    measured at each number of steps in `counts` and at the result's own, which is read from it rather than run
    again; a count over the steps × tokens budget is listed as not run. Kept in the cache for these settings."""
    key = (result.position, result.target, result.foil, result.baseline, result.steps, tuple(counts))
    if cache.completeness is not None and cache.completeness[0] == key:
        return cache.completeness[1]
    used = len(result.integrated)
    rows = {result.steps: CompletenessRow(result.steps, heads.Completeness(
        result.steps, float(result.integrated.sum()), result.logit_difference))}
    todo = []
    for count in sorted(set(counts) - {result.steps}):
        if count * used > MAX_IG_TOKEN_STEPS:
            rows[count] = CompletenessRow(count, None, f"not run: {count} steps × {used} tokens = {count * used:,} "
                                                       f"token passes, over the limit of {MAX_IG_TOKEN_STEPS:,}")
        else:
            todo.append(count)
    if todo:
        try:
            measured = heads.completeness_by_steps(model, as_batch(cache.tokens.ids, model.device), result.position,
                                                   todo, result.target, result.foil, result.baseline)
        except (ValueError, IndexError) as exc:
            raise UserError(str(exc)) from exc
        rows.update({m.steps: CompletenessRow(m.steps, m) for m in measured})
    table = [rows[count] for count in sorted(rows)]
    cache.completeness = (key, table)
    return table


def cached_lens(model, cache: HeadsCache) -> heads.LensTable:
    reason = lm_head_reason(model, "The logit lens")
    if reason:
        raise UserError(reason)
    if cache.lens is None:
        cache.lens = heads.lens_table(model, as_batch(cache.tokens.ids, model.device))
    return cache.lens


def token_surprisal(model, cache: HeadsCache) -> heads.Surprisal:
    reason = next_token_reason(model, "Surprisal")
    if reason:
        raise UserError(reason)
    if len(cache.tokens.ids) < 2:
        raise UserError("Surprisal needs at least 2 tokens: the first one is never predicted.")
    if cache.surprisal is None:
        cache.surprisal = heads.surprisal(model, as_batch(cache.tokens.ids, model.device), k=5)
    return cache.surprisal
