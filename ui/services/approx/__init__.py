"""Approximate attention on the loaded model, as plain values over core.analysis.approx: the method, its budget and
its layers checked by the one check functions (each refusal names the field and what would be right), the text read
whole (a text over the cap is refused with its token count, never cut), and the result: each head's error against
exact attention on the same queries, keys and values ([layers, heads], NaN where a head is not approximated), the
model's change in words, the KV cache's bytes per token exact and approximate, and the approximation's description.
What the methods cost in time (the published bench run, and a live timing at short lengths) is in .cost. Never
imports gradio."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np
import torch

from core.analysis.approx import approximation
from core.approx import METHODS, NAMES, Approx, fit_linformer
from ui.services.checks import UserError, check_choice, check_range, stack_shape
from ui.services.text import check_text_size, checked_text
from ui.settings import DEFAULT_TEXT_BYTES

MAX_APPROX_TOKENS = 1024  # the model reads the text twice, and each replaced layer holds both weights [H, T, T]
MAX_SEED = 2**32 - 1
LAYERS_ALL = "all"
MAX_LAYER_ITEMS = 1024  # a list of layers longer than this is refused before each is read
LAYERS_HINT = "Layers are 'all', one layer (3) or a list (0, 2, 5)"
FITS = ("random", "fitted")
# each budget's name → (least, most, what it is): the one range every caller checks it against
BUDGET_LIMITS = {
    "k": (1, MAX_APPROX_TOKENS, "keys each query keeps"),
    "block": (1, MAX_APPROX_TOKENS, "tokens a block"),
    "global_blocks": (0, 64, "blocks that read and are read by every block"),
    "random_blocks": (0, 64, "random key blocks each query block reads"),
    "features": (1, 4096, "random features"),
    "rank": (1, 4096, "rows kept"),
    "seed": (0, MAX_SEED, "the random draw"),
}
MEASURE_WORDS = {"tv": "total variation of the weights", "z_error": "relative error of the output z"}


def check_method(method) -> str:
    """One of core.approx.METHODS, or a UserError listing them."""
    return check_choice("Method", method, list(METHODS), f" ({', '.join(f'{m}: {NAMES[m]}' for m in METHODS)})")


def check_budget(method: str, budget) -> dict:
    """The budget of `method` as given (a dict, or its JSON text; None or "" for the defaults), each value checked in
    its range (BUDGET_LIMITS); a name the method does not take is refused, naming the ones it takes."""
    if budget is None or (isinstance(budget, str) and not budget.strip()):
        return {}
    if isinstance(budget, str):
        try:
            budget = json.loads(budget)
        except json.JSONDecodeError:
            raise UserError(f"The budget must be a JSON object such as {example(method)}, got {budget[:40]!r}.") \
                from None
    if not isinstance(budget, dict):
        raise UserError(f"The budget must be a JSON object such as {example(method)}, got a {type(budget).__name__}.")
    takes = METHODS[method]
    unknown = [str(name)[:20] for name in budget if name not in takes]
    if unknown:
        raise UserError(f"{NAMES[method]} takes the budget {', '.join(takes)}; not {', '.join(unknown)}.")
    checked = {}
    for name, value in budget.items():
        if name == "fit":
            checked[name] = check_choice("Linformer's fit", value, FITS)
        else:
            low, high, what = BUDGET_LIMITS[name]
            checked[name] = check_range(f"Budget {name} ({what})", value, low, high)
    return checked


def example(method: str) -> str:
    return json.dumps({name: value for name, value in METHODS[method].items() if name != "seed"})


def budget_from_fields(method: str, fields: dict) -> dict:
    """The page's budget fields (name → value, every method's) narrowed to those `method` takes (none for a method
    that is not one: check_method says so)."""
    return {name: fields[name] for name in METHODS.get(method, {}) if name in fields}


def parse_layers(value, n_layers: int) -> tuple[int, ...] | None:
    """None for every layer ('all', empty), else the chosen layers, sorted, each in 0 … n_layers − 1: one index (3,
    "3") or a list ([0, 2], "0, 2, 5")."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", LAYERS_ALL)):
        return None
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, str):
        items = [part for part in re.split(r"[,;\s]+", value.strip()) if part]
    else:
        items = [value]
    if not items:
        raise UserError(f"No layer was given. {LAYERS_HINT}.")
    if len(items) > MAX_LAYER_ITEMS:
        raise UserError(f"{len(items):,} layers were given; this model has {n_layers}. {LAYERS_HINT}.")
    try:
        return tuple(sorted({check_range("Layer", item, 0, n_layers - 1) for item in items}))
    except UserError as error:
        raise UserError(f"{str(error).rstrip('.')}. {LAYERS_HINT}.") from None


def check_text(text, cap_bytes: int = DEFAULT_TEXT_BYTES) -> str:
    """The text as a tokenizer reads it: refused when missing, empty, not a string or over the app's byte cap."""
    text = checked_text(text)
    return check_text_size("Text", text, cap_bytes)


def whole_ids(model, text: str, max_tokens: int = MAX_APPROX_TOKENS) -> list[int]:
    """Every token of the text: one over the cap (or the model's context) is refused with its count, never cut, since
    the errors and the perplexity are the text's own."""
    ids = model.tokenizer(text)["input_ids"]
    limit = min(max_tokens, model.config.max_positions)
    if len(ids) > limit:
        why = "the model's context" if limit == model.config.max_positions else "this section's cap"
        raise UserError(f"The text is {len(ids):,} tokens; the approximation reads at most {limit:,} ({why}) and never "
                        f"cuts a text. Shorten it to {limit:,} tokens or fewer.")
    if len(ids) < 2:
        raise UserError(f"The text is {len(ids)} token; the approximation needs at least 2 (a perplexity predicts "
                        "each next token).")
    return ids


@dataclass
class ApproxRun:
    """One text under one approximation, in plain values. tv and z_error are [layers, heads] of the stack that reads
    the text, NaN where a head is not approximated; tv is None for linformer (no weight per key)."""
    method: str
    budget: dict
    layers: tuple[int, ...] | None   # None: every layer
    description: str                 # "top-k (k = 32)"
    tokens: int                      # every token of the text, read
    tv: np.ndarray | None
    z_error: np.ndarray
    measure: str                     # "perplexity" or "cosine"
    exact: float
    approximate: float
    change: float                    # perplexity: approximate / exact − 1; cosine: 1 − cos
    bytes_exact: int                 # the KV cache's bytes per token, over every layer
    bytes_approx: int
    fitted: bool = False             # linformer's projections fitted to this text's own keys and values

    @property
    def where(self) -> str:
        return "every layer" if self.layers is None else (
            f"layer {self.layers[0]}" if len(self.layers) == 1 else f"layers {', '.join(map(str, self.layers))}")

    def as_json(self) -> dict:
        """The endpoint's answer: NaN (a head not approximated) as null."""
        def grid(values):
            return None if values is None else [[None if math.isnan(v) else float(v) for v in row]
                                                for row in values.tolist()]
        return {"method": self.method, "budget": self.budget,
                "layers": LAYERS_ALL if self.layers is None else list(self.layers), "tokens": self.tokens,
                "tv": grid(self.tv), "z_error": grid(self.z_error), "measure": self.measure, "exact": self.exact,
                "approximate": self.approximate, "change": self.change,
                "bytes_per_token": {"exact": self.bytes_exact, "approximate": self.bytes_approx},
                "description": self.description, "words": change_words(self) + " " + bytes_words(self)}


def build_approx(model, method: str, budget: dict, layers, ids: list[int]) -> tuple[Approx, bool]:
    """The Approx, refused in words where this model's stack cannot take it (Approx.check); linformer with
    fit "fitted" gets projections fitted to this text's own keys and values (core.approx.fit_linformer)."""
    stack = model.attention_stack()[0]
    fitted = method == "linformer" and budget.get("fit", METHODS["linformer"]["fit"]) == "fitted"
    try:
        plain = Approx(method, layers, **{**budget, **({"fit": "random"} if fitted else {})})
        plain.check(stack.cfg, len(stack.blocks))
        if not fitted:
            return plain, False
        if plain.rank > len(ids):
            raise UserError(f"A fitted Linformer keeps at most as many rows as the text has tokens ({len(ids)}); "
                            f"its rank is {plain.rank}.")
        with torch.inference_mode():
            projections = fit_linformer(model, [torch.tensor(ids)], plain.rank)
        return Approx(method, layers, projections=projections, **budget), True
    except UserError:
        raise
    except ValueError as error:
        raise UserError(sentence(str(error))) from None


def sentence(text: str) -> str:
    text = text.strip() or "The approximation was refused"
    return text[0].upper() + text[1:] + ("" if text.endswith((".", "?", "!")) else ".")


def approximation_run(models, model_name, text, method, budget=None, layers=LAYERS_ALL,
                      cap_bytes: int = DEFAULT_TEXT_BYTES, max_tokens: int = MAX_APPROX_TOKENS,
                      progress=None) -> ApproxRun:
    """Every input checked (the text and the method before any model loads for them), then the approximation of
    core.analysis.approx on the loaded model, every token of the text read."""
    text = check_text(text, cap_bytes)
    method = check_method(method)
    budget = check_budget(method, budget)
    model = models.get(model_name, progress)
    chosen = parse_layers(layers, stack_shape(model)[0])
    ids = whole_ids(model, text, max_tokens)
    approx, fitted = build_approx(model, method, budget, chosen, ids)
    try:
        result = approximation(model, torch.tensor(ids), approx)
    except ValueError as error:
        raise UserError(sentence(str(error))) from None
    tv = None if result.tv is None else result.tv.numpy().astype(np.float64)
    return ApproxRun(method, dict(approx.budget), chosen, approx.describe(), result.tokens, tv,
                     result.z_error.numpy().astype(np.float64), result.measure, result.exact, result.approximate,
                     result.change, result.cache_bytes_exact, result.cache_bytes_approx, fitted)


def largest_heads(values: np.ndarray, n: int = 3) -> list[tuple[int, int, float]]:
    """The n heads of largest error, (layer, head, value), largest first; NaN cells left out."""
    finite = np.argwhere(np.isfinite(values))
    order = sorted(((int(i), int(j), float(values[i, j])) for i, j in finite), key=lambda c: -c[2])
    return order[:n]


def change_words(run: ApproxRun) -> str:
    """The model's change in words: perplexity exact → approximate with its relative change, or the sentence
    embedding's cosine; how large the heads' errors were, and the largest."""
    on = f"{run.description} on {run.where}" + (" (its projections fitted to this text)" if run.fitted else "")
    if run.measure == "perplexity":
        change = (f"Perplexity on these {run.tokens:,} tokens: {run.exact:,.2f} with exact attention → "
                  f"{run.approximate:,.2f} with {on} ({run.change:+.2%}).")
    else:
        change = (f"The sentence embedding (the mean of the last hidden states over the {run.tokens:,} tokens) with "
                  f"{on} has cosine {run.approximate:.6f} to exact attention's (1 − cos = {run.change:.3g}).")
    values = run.tv if run.tv is not None else run.z_error
    key = "tv" if run.tv is not None else "z_error"
    finite = values[np.isfinite(values)]
    if finite.size and float(np.nanmax(run.z_error)) < 1e-6:
        return change + (" Every approximated head matches exact attention on this text: its budget covers every key "
                         "each query reads.")
    top = ", ".join(f"L{layer} H{head} {value:.3g}" for layer, head, value in largest_heads(values))
    return change + (f" Per head, the {MEASURE_WORDS[key]} averages {float(finite.mean()):.3g} over the "
                     f"{finite.size} heads approximated (the output's relative error "
                     f"{float(np.nanmean(run.z_error)):.3g}); largest: {top}.")


def bytes_words(run: ApproxRun) -> str:
    """The KV cache's bytes per token exact and approximate, and why they differ or not."""
    if run.method == "lowrank_kv":
        why = f"low-rank KV keeps {run.budget['rank']} numbers per token per replaced layer"
    elif run.method == "performer":
        why = ("Performer's layers keep a fixed state (features × d_head numbers per head, whatever the length) "
               "instead of keys and values")
    else:
        why = {"topk": "top-k keeps every key (it reads k of them)", "bigbird": "BigBird keeps every key (it reads "
               "blocks of them)", "linformer": "Linformer mixes the whole text's keys, so it keeps every key to mix "
               "them"}[run.method]
    ratio = "" if run.bytes_exact == run.bytes_approx else f", {run.bytes_approx / run.bytes_exact:.1%} of exact"
    return (f"The KV cache holds {run.bytes_exact:,} bytes per token with exact attention and {run.bytes_approx:,} "
            f"with the approximation{ratio}: {why}.")
