"""What each approximation of attention (core/approx.py) costs in accuracy on real heads: approximation_over
(core/analysis/over.py, the corpus job over core/analysis/approx.py approximation) on SmolLM2-135M-Instruct,
Gemma 3 270M and MiniLM-L6, for every method and a small ladder of budgets, in the middle layer alone and in all
layers. Writes assets/measured/approx_accuracy.json and docs/approximations.md's section `approximations`.

    python scripts/approx_accuracy.py --publish          # measure every model, save, render
    python scripts/approx_accuracy.py --render           # the doc's section again from the saved JSON
    python scripts/approx_accuracy.py --models minilm-l6 # one model, printed, nothing saved

The corpora, the same strings for every model, each model encoding them with its own tokenizer:
  passages  PASSAGES passages of assets/texts/macbeth_acts_1_2.txt (one drawn with SEED from each of PASSAGES equal
            stretches of the text, from a line's start), each encoded with the tokenizer's own special tokens and cut
            by the tokenizer to PASSAGE_TOKENS tokens: long enough for every budget of the ladder to bite
  prompts   the clean prompts of PROMPTS built-in IOI pairs (core.corpus.texts.ioi_pairs, seed SEED), short: top-k
            with k ≥ the visible keys and BigBird over at most three blocks are exact on them (the doc names the
            runs whose every error is 0)
Even-numbered items are the fit half (Linformer's fitted projections are fitted on them), odd-numbered the
evaluation half, on which every method is measured. Each job is saved under runs/approx_accuracy (core/corpus/saved.py),
so a killed run resumes where it stopped.

The JSON's keys:
  command, date, machine, load_average     bench/common.py's stamp
  threads                                  torch's CPU threads (the run is CPU only, float32)
  seconds, minutes                         the whole run's wall time
  settings                                 confidence_percent, seed, the corpora's sizes, passage_tokens, min_items
                                           (an interval's least n), the ladder's budgets per method
                                           (lowrank_fractions of the full rank)
  models: [{
    name, family, layers, heads, kv_heads, head_dim, d_model, middle_layer, full_rank (2·H_kv·d_head capped at
    d_model: lowrank_kv's), cache_dtype ("float32"), measure ("perplexity_change" or "cosine"), load_seconds,
    refusals: {method: the core's words}   (linformer on a decoder)
    corpora: {passages|prompts: {
      description, items (evaluation half), fit_items, tokens: {min, mean, max, each},
      exact: {mean, low, high, n, interval}    a decoder's exact perplexity over the texts (from the first run with
                                               every text: each run's shadow pass is exact), null for an encoder
      runs: [{
        method, label (the budget in words), budget {...}, words (approx_words, or null for a fitted Linformer),
        scope ("all" or "layer"), layers (null: all), seconds (measuring, this run), reused (items read back),
        refused (instead of what follows: the core's words, where the fit half cannot give E that rank),
        n, note, left_out {index: why},
        change: {mean, low, high, interval, n, each, percent: {mean, low, high}}: the relative perplexity change
                approx/exact − 1 (in [−1, ∞)) or the cosine (in [−1, 1]), the mean over the texts with its
                percentile bootstrap interval, and each text's value
        measure: {exact, approximate}          their means over the texts
        tv, z_error: {mean, max, max_at: [layer, head], map}: over the approximated heads, the mean and the largest
                of the per-head means over the texts; map is the [layers][heads] per-head means in all layers, or
                the [heads] row of the one layer (NaN written as null; tv is null for linformer)
        cache_bytes: {exact, approximate}      bytes a token holds in the KV cache, every layer, float32
      }]}}
  }]
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import md_table, publish, section, stamp  # noqa: E402

OUT = ROOT / "assets" / "measured" / "approx_accuracy.json"
DOC = ROOT / "docs" / "approximations.md"
RUNS = ROOT / "runs" / "approx_accuracy"
TEXT = ROOT / "assets" / "texts" / "macbeth_acts_1_2.txt"
SECTION = "approximations"
MODELS = ("smollm2-135m-instruct", "gemma-3-270m", "minilm-l6")
SEED = 0
PASSAGES = 10             # drawn; half fit, half evaluated
PASSAGE_TOKENS = 128
PASSAGE_CHARS = 1000      # characters read for a passage: more than PASSAGE_TOKENS tokens for every tokenizer
PROMPTS = 12
TOPK = (8, 32, 64)
BIGBIRD = ((16, 1, 0), (16, 1, 2), (8, 1, 0))     # (block, global_blocks, random_blocks)
PERFORMER = (64, 256)
LOWRANK_FRACTIONS = (0.5, 0.75, 0.875, 0.9375)
LINFORMER = ((8, "random"), (32, "random"), (8, "fitted"), (32, "fitted"))
WITHIN_PERCENT = 1        # the perplexity change the low-rank finding asks a rank to stay within, interval and all
MINUS = "−"


# ---- the corpora ----

def passage_strings(text: str, n: int = PASSAGES, seed: int = SEED) -> list[str]:
    """n passages of PASSAGE_CHARS characters, the i-th from a line's start drawn in the i-th of n equal stretches."""
    rng = random.Random(seed)
    stretch = len(text) // n
    strings = []
    for i in range(n):
        at = i * stretch + rng.randrange(stretch - PASSAGE_CHARS)
        at = text.index("\n", at) + 1
        strings.append(text[at:at + PASSAGE_CHARS])
    return strings


def corpora_of(model) -> dict[str, dict]:
    """name → its texts (token ids), split into the fit half (even items) and the evaluation half (odd)."""
    import torch

    from core.corpus import texts as corpora
    tok = model.tokenizer
    passages = [torch.tensor(tok(s, truncation=True, max_length=PASSAGE_TOKENS)["input_ids"])
                for s in passage_strings(TEXT.read_text(encoding="utf-8"))]
    short = [len(p) for p in passages if len(p) != PASSAGE_TOKENS]
    if short:
        raise ValueError(f"passages of {short} tokens: raise PASSAGE_CHARS so every one reaches {PASSAGE_TOKENS}")
    prompts = [pair.clean for pair in corpora.ioi_pairs(tok, PROMPTS, seed=SEED)]
    return {
        "passages": {"texts": passages, "description": (
            f"{PASSAGES // 2} passages of assets/texts/macbeth_acts_1_2.txt (Macbeth, Acts I–II), each cut to "
            f"{PASSAGE_TOKENS} tokens by the tokenizer")},
        "prompts": {"texts": prompts, "description": f"the clean prompts of {PROMPTS // 2} built-in IOI pairs"}}


def halves(texts: list) -> tuple[list, list]:
    return texts[0::2], texts[1::2]


# ---- the ladder ----

def ladder(cfg, causal: bool) -> list[tuple[str, dict]]:
    """(method, budget) of every run on a model whose reading stack has config cfg."""
    runs = [("topk", {"k": k}) for k in TOPK]
    runs += [("bigbird", {"block": b, "global_blocks": g, "random_blocks": r}) for b, g, r in BIGBIRD]
    runs += [("performer", {"features": m}) for m in PERFORMER]
    runs += [("lowrank_kv", {"rank": round(f * full_rank(cfg))}) for f in LOWRANK_FRACTIONS]
    if not causal:
        runs += [("linformer", {"rank": r, "fit": fit}) for r, fit in LINFORMER]
    return runs


def full_rank(cfg) -> int:
    """lowrank_kv's full rank: [W_K; W_V] is (2·H_kv·d_head) × d_model."""
    return min(2 * cfg.n_kv_heads * cfg.head_dim, cfg.d_model)


def label(method: str, budget: dict) -> str:
    if method == "bigbird":
        return f"block {budget['block']}, global {budget['global_blocks']}, random {budget['random_blocks']}"
    if method == "linformer":
        return f"rank {budget['rank']}, {budget['fit']}"
    name = {"topk": "k", "performer": "features", "lowrank_kv": "rank"}[method]
    return f"{name} {budget[name]}"


# ---- measuring ----

def number(value) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


def rounded(value, digits: int = 6) -> float | None:
    """A figure as saved: 6 significant digits (NaN as null)."""
    value = number(value)
    return None if value is None else float(f"{value:.{digits}g}")


def head_summary(over, layers: list[int] | None) -> dict | None:
    """The per-head means over the texts: their mean and largest over the approximated heads, and the map."""
    import torch
    mean = over.mean.float()
    if mean.isnan().all():
        return None
    finite = torch.nan_to_num(mean, nan=-1.0)
    at = divmod(int(finite.argmax()), mean.shape[1])
    shown = mean if layers is None else mean[layers[0]]
    return {"mean": rounded(mean[~mean.isnan()].mean()), "max": rounded(mean[at]), "max_at": list(at),
            "map": [[rounded(v) for v in row] for row in shown.tolist()] if layers is None
            else [rounded(v) for v in shown.tolist()]}


def interval(over, scale: float = 1.0) -> dict:
    return {"mean": rounded(over.mean * scale), "low": rounded(over.low * scale), "high": rounded(over.high * scale)}


def summary(result: dict, measure: str) -> dict:
    """One run's record from approximation_over's parts."""
    change = result[measure]
    record = {"n": change.n, "note": change.note, "left_out": {str(i): why for i, why in change.left_out.items()},
              "change": {**interval(change), "interval": change.interval or None, "n": change.n,
                         "each": [rounded(v) for v in change.per_item.tolist()]}}
    if measure == "perplexity_change":
        record["change"]["percent"] = {key: None if value is None else round(value, 4)
                                       for key, value in interval(change, 100.0).items()}
    exact, approximate = result["measure"].mean.tolist()
    record["measure"] = {"exact": rounded(exact), "approximate": rounded(approximate)}
    exact_bytes, approx_bytes = result["cache_bytes"].mean.tolist()
    record["cache_bytes"] = {"exact": int(exact_bytes), "approximate": int(approx_bytes)}
    return record


def measure_run(model, name: str, texts: list, fit_texts: list, method: str, budget: dict, layers, measure: str
                ) -> tuple[dict, dict]:
    """(the run's record, approximation_over's result) of one method and budget in `layers` (None: all)."""
    from core.analysis.approx import approx_words
    from core.analysis.over import analysis_named, approximation_over
    from core.approx import Approx, fit_linformer
    from core.corpus import saved
    started = time.perf_counter()
    reused = 0
    if method == "linformer" and budget["fit"] == "fitted":
        try:
            projections = fit_linformer(model, fit_texts, budget["rank"])
        except ValueError as error:     # a rank above the fit half's positions: no such E
            return {"method": method, "label": label(method, budget), "budget": budget, "words": None,
                    "scope": "all" if layers is None else "layer", "layers": layers, "refused": str(error)}, None
        approx = Approx(method, layers, projections=projections, **budget)
        words = None
        result = approximation_over(model, texts, approx)
    else:
        approx = Approx(method, layers, **budget)
        words = approx_words(approx)
        run = saved.run_over(analysis_named("approximation"), model, texts, RUNS, name, approx=words)
        result, reused = run.result, run.reused
    record = {"method": method, "label": label(method, budget), "budget": budget, "words": words,
              "scope": "all" if layers is None else "layer", "layers": layers,
              "seconds": round(time.perf_counter() - started, 1), "reused": reused, **summary(result, measure),
              "tv": head_summary(result["tv"], layers), "z_error": head_summary(result["z_error"], layers)}
    return record, result


def exact_summary(result: dict, measure: str) -> dict | None:
    """The exact perplexity over the texts, every run's baseline (each run's shadow pass is exact attention), from
    one run's per-text values; an encoder's exact cosine is 1 and has none."""
    if measure != "perplexity_change":
        return None
    from core.corpus.stats import NONNEGATIVE, summarise
    exact = summarise(result["measure"].per_item[:, 0], bounds=NONNEGATIVE)
    return {**interval(exact), "n": exact.n, "interval": exact.interval or None}


def refusals(model, cfg, n_layers: int) -> dict[str, str]:
    """The core's words for the methods this model refuses (linformer on a decoder)."""
    from core.approx import Approx
    refused = {}
    for method, budget in (("linformer", {"rank": 8}),):
        try:
            Approx(method, **budget).check(cfg, n_layers)
        except ValueError as error:
            refused[method] = str(error)
    return refused


def measure_model(name: str) -> dict:
    import torch

    from core import load_model
    from core.analysis.approx import reads_forwards
    from core.store import ensure
    started = time.perf_counter()
    model = load_model(ensure(name), device="cpu", dtype=torch.float32)
    load_seconds = round(time.perf_counter() - started, 1)
    stack, _ = model.attention_stack()
    cfg, n_layers = stack.cfg, len(stack.blocks)
    causal = model.config.causal
    measure = "perplexity_change" if reads_forwards(model) else "cosine"
    middle = n_layers // 2
    out = {"name": name, "family": model.config.family, "layers": n_layers, "heads": cfg.n_heads,
           "kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "d_model": cfg.d_model, "middle_layer": middle,
           "full_rank": full_rank(cfg), "cache_dtype": "float32", "measure": measure, "load_seconds": load_seconds,
           "refusals": refusals(model, cfg, n_layers), "corpora": {}}
    for corpus, found in corpora_of(model).items():
        fit_texts, texts = halves(found["texts"])
        lengths = [len(t) for t in texts]
        here = {"description": found["description"], "items": len(texts), "fit_items": len(fit_texts),
                "tokens": {"min": min(lengths), "mean": round(sum(lengths) / len(lengths), 2), "max": max(lengths),
                           "each": lengths},
                "exact": None, "runs": []}
        scopes = [None, [middle]] if corpus == "passages" else [None]
        for method, budget in ladder(cfg, causal):
            for layers in scopes:
                record, result = measure_run(model, name, texts, fit_texts, method, budget, layers, measure)
                here["runs"].append(record)
                if "refused" in record:
                    print(f"{name} {corpus} {method} {record['label']} {record['scope']}: refused: "
                          f"{record['refused']}", flush=True)
                    continue
                if here["exact"] is None and record["n"] == len(texts):
                    here["exact"] = exact_summary(result, measure)
                print(f"{name} {corpus} {method} {record['label']} {record['scope']}: {measure} "
                      f"{record['change']['mean']} [{record['change']['low']}, {record['change']['high']}] "
                      f"n={record['n']}, tv {record['tv'] and record['tv']['mean']}, z {record['z_error']['mean']}, "
                      f"bytes {record['cache_bytes']['approximate']}/{record['cache_bytes']['exact']} "
                      f"({record['seconds']} s)", flush=True)
        out["corpora"][corpus] = here
    return out


# ---- the doc's section, from the saved run alone ----

def num(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    text = f"{value:.{digits}f}"
    return text.replace("-", MINUS)


def signed_percent(change: dict) -> str:
    """'+1.23 % [+0.51, +1.95]' from a perplexity change's percent (two decimals)."""
    def one(value):
        if value is None:
            return "–"
        digits = 2 if abs(value) < 100 else 0       # a change of hundreds of percent needs no hundredths
        return ("+" if value >= 0 else MINUS) + f"{abs(value):,.{digits}f}"
    p = change["percent"]
    bounds = f" [{one(p['low'])}, {one(p['high'])}]" if p["low"] is not None else ""
    return f"{one(p['mean'])} %{bounds}"


def cosine_text(change: dict) -> str:
    bounds = f" [{num(change['low'])}, {num(change['high'])}]" if change["low"] is not None else ""
    return f"{num(change['mean'])}{bounds}"


def change_text(run: dict, measure: str) -> str:
    return signed_percent(run["change"]) if measure == "perplexity_change" else cosine_text(run["change"])


def heads_text(errors: dict | None) -> str:
    if errors is None:
        return "–"
    if errors["max"] < ROUNDING:            # every head exact: no worst one to name
        return f"{num(errors['mean'])} ({num(errors['max'])})"
    layer, head = errors["max_at"]
    return f"{num(errors['mean'])} ({num(errors['max'])}, L{layer} H{head})"


NAMES = {"topk": "top-k", "bigbird": "BigBird", "performer": "Performer", "lowrank_kv": "low-rank KV",
         "linformer": "Linformer"}
TITLES = {"smollm2-135m-instruct": "SmolLM2-135M-Instruct", "gemma-3-270m": "Gemma 3 270M",
          "minilm-l6": "MiniLM-L6 (all-MiniLM-L6-v2)"}


def paired(runs: list[dict]) -> list[tuple[dict, dict | None]]:
    """Each all-layers run with its one-layer twin (the same method and budget), in the ladder's order."""
    alone = {(r["method"], json.dumps(r["budget"], sort_keys=True)): r for r in runs if r["scope"] == "layer"}
    return [(r, alone.get((r["method"], json.dumps(r["budget"], sort_keys=True)))) for r in runs
            if r["scope"] == "all"]


def corpus_table(model: dict, corpus: dict, with_layer: bool) -> str:
    measure = model["measure"]
    what = "perplexity change" if measure == "perplexity_change" else "cosine"
    header = ["method", "budget", f"{what}, all layers"]
    if with_layer:
        header.append(f"{what}, layer {model['middle_layer']} alone")
    header += ["TV of rows: mean (worst head)", "z error: mean (worst head)", "cache bytes / token", "n"]
    rows = []
    for run, alone in paired(corpus["runs"]):
        if "refused" in run:
            rows.append([NAMES[run["method"]], run["label"], f"refused: {run['refused']}",
                         *["–"] * (len(header) - 3)])
            continue
        cells = [NAMES[run["method"]], run["label"], change_text(run, measure)]
        if with_layer:
            cells.append(change_text(alone, measure) if alone and "refused" not in alone else "–")
        cells += [heads_text(run["tv"]), heads_text(run["z_error"]),
                  f"{run['cache_bytes']['approximate']:,} of {run['cache_bytes']['exact']:,}", str(run["n"])]
        rows.append(cells)
    align = ["---", "---"] + ["---:"] * (len(header) - 2)
    return md_table(header, rows, align)


def within(run: dict, measure: str) -> bool:
    """Whether the run's whole interval keeps the model within WITHIN_PERCENT: a perplexity change between ±that
    percent, a cosine no further than that percent below 1."""
    if "refused" in run or run["change"]["low"] is None:
        return False
    c = run["change"]
    if measure == "perplexity_change":
        return -WITHIN_PERCENT <= c["percent"]["low"] and c["percent"]["high"] <= WITHIN_PERCENT
    return 100 * (1 - c["low"]) <= WITHIN_PERCENT


def within_words(model: dict, corpus: dict, scope: str) -> str:
    """Per method, the budgets of the ladder that keep the model within WITHIN_PERCENT in `scope` ("all" or
    "layer"), read from the runs: 'top-k: k 64 (+0.44 % [+0.09, +0.79]); BigBird: none; …'."""
    measure, parts = model["measure"], []
    for method in dict.fromkeys(r["method"] for r in corpus["runs"]):
        runs = [r for r in corpus["runs"] if r["method"] == method and r["scope"] == scope]
        if not runs:
            continue
        kept = [f"{r['label']} ({change_text(r, measure)}"
                + (f", {r['cache_bytes']['approximate']:,} of {r['cache_bytes']['exact']:,} cache bytes a token)"
                   if r["cache_bytes"]["approximate"] != r["cache_bytes"]["exact"] else ")")
                for r in runs if within(r, measure)]
        parts.append(f"{NAMES[method]}: {', '.join(kept) if kept else 'none'}")
    where = "in all layers" if scope == "all" else f"in layer {model['middle_layer']} alone"
    bound = (f"a perplexity change within ±{WITHIN_PERCENT} %" if measure == "perplexity_change" else
             f"a cosine within {WITHIN_PERCENT} % of 1")
    return f"The budgets that keep {bound} {where}, interval and all: " + "; ".join(parts) + "."


ROUNDING = 1e-4     # an error below this on every head: exact attention, computed another way


def exact_runs(corpus: dict) -> str:
    """The all-layers runs whose every head's TV and z error round to 0, in words: 'top-k k 32, BigBird block 8, …'."""
    found = [f"{NAMES[r['method']]} {r['label']}" for r in corpus["runs"] if r["scope"] == "all"
             and "refused" not in r and all(e is None or e["max"] < ROUNDING for e in (r["tv"], r["z_error"]))]
    return "; ".join(found)


def model_section(model: dict) -> str:
    title = TITLES.get(model["name"], model["name"])
    parts = [f"### {title} (`{model['name']}`)",
             f"{model['layers']} layers, {model['heads']} heads ({model['kv_heads']} key/value heads, d_head "
             f"{model['head_dim']}, d_model {model['d_model']}); the one layer is layer {model['middle_layer']}, the "
             f"middle one; lowrank_kv's full rank is {model['full_rank']}. Measure: "
             + ("the text's perplexity, its relative change approximate / exact − 1 in percent."
                if model["measure"] == "perplexity_change" else
                "the cosine of the sentence embeddings (mean of the last hidden states) with and without the "
                "approximation.")]
    for method, words in model["refusals"].items():
        parts.append(f"{NAMES[method]} is refused here, in the core's words: “{words}”")
    for key, corpus in model["corpora"].items():
        t = corpus["tokens"]
        lengths = (f"{t['min']} tokens each" if t["min"] == t["max"] else
                   f"{t['min']}–{t['max']} tokens (mean {num(t['mean'], 1)})")
        line = (f"**{key.capitalize()}**: {corpus['description']}; {corpus['items']} evaluated (the fit half holds "
                f"{corpus['fit_items']}), {lengths}.")
        if corpus["exact"] is not None:
            e = corpus["exact"]
            line += (f" Exact perplexity: {num(e['mean'], 2)} [{num(e['low'], 2)}, {num(e['high'], 2)}] "
                     f"({e['interval']}).")
        exact = exact_runs(corpus)
        if exact:
            line += (f" Exact on these texts, every head's error 0 to rounding (the budget reaches every key a query "
                     f"may read): {exact}.")
        parts.append(line)
        parts.append(corpus_table(model, corpus, with_layer=any(r["scope"] == "layer" for r in corpus["runs"])))
        notes = left_out_words(corpus)
        if key == "passages" or notes:
            parts.append("\n".join([*(f"- {within_words(model, corpus, scope)}" for scope in ("all", "layer")
                                       if key == "passages" and any(r["scope"] == scope for r in corpus["runs"])),
                                     *(f"- {note}" for note in notes)]))
    return "\n\n".join(parts)


def left_out_words(corpus: dict) -> list[str]:
    """Each run that left texts out, with the core's reasons: 'Linformer rank 8, fitted: left out text 3 (…)'."""
    return [f"{NAMES[r['method']]} {r['label']}"
            + ("" if r["scope"] == "all" else f" (layer {r['layers'][0]} alone)")
            + f": left out {', '.join(f'text {i} ({why})' for i, why in r['left_out'].items())}; n = {r['n']}."
            for r in corpus["runs"] if "refused" not in r and r["left_out"]]


def fraction_label(model: dict, run: dict, fractions: list[float]) -> str:
    """A low-rank run's budget as the ladder's fraction of the full rank, so the models share a row."""
    share = run["budget"]["rank"] / model["full_rank"]
    return f"rank {min(fractions, key=lambda f: abs(f - share)):g} of full"


def overview(run: dict) -> str:
    """The passages with every layer approximated: each model's change side by side, one row per budget."""
    models, rows = run["models"], {}
    fractions = run["settings"]["lowrank_fractions"]
    for column, model in enumerate(models):
        for r in model["corpora"]["passages"]["runs"]:
            if r["scope"] != "all":
                continue
            name = fraction_label(model, r, fractions) if r["method"] == "lowrank_kv" else r["label"]
            cells = rows.setdefault((NAMES[r["method"]], name), ["–"] * len(models))
            cells[column] = "refused" if "refused" in r else change_text(r, model["measure"])
    for column, model in enumerate(models):     # after every row exists: a method the model refuses outright
        for method in model["refusals"]:
            for key, cells in rows.items():
                if key[0] == NAMES[method]:
                    cells[column] = "refused (causal)"
    header = ["method", "budget", *(f"{TITLES.get(m['name'], m['name'])}: "
                                    + ("perplexity change" if m["measure"] == "perplexity_change" else "cosine")
                                    for m in models)]
    return md_table(header, [[*key, *cells] for key, cells in rows.items()], ["---", "---"] + ["---:"] * len(models))


def body(run: dict) -> str:
    s = run["settings"]
    return "\n\n".join([
        f"From `{OUT.relative_to(ROOT).as_posix()}`; `python scripts/approx_accuracy.py --render` writes this section "
        f"again from it. CPU, float32, {run['threads']} thread(s), {num(run['minutes'], 1)} min in all. Each "
        f"interval is the {s['confidence_percent']} % percentile bootstrap interval of the mean over the evaluated "
        "texts (none below "
        f"{s['min_items']} texts); n is the texts "
        "measured. TV and z error: each head's mean over the texts, then the mean over the approximated heads and "
        "the worst head (shadow: on exact inputs; in all layers, the whole map is in the JSON). Cache bytes: per "
        "token, every layer, float32; top-k and BigBird keep every key (they read fewer).",
        "### Every layer approximated, on the passages",
        overview(run),
        *(model_section(model) for model in run["models"])])


def block(run: dict) -> str:
    """The section as the doc holds it, markers and head line included."""
    return section(SECTION, body(run), run=run)


def render(run: dict, doc: Path = DOC) -> Path:
    """Write the saved run's section into the doc, headed by the run's own command, date and machine."""
    return publish(SECTION, body(run), doc=doc, run=run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--publish", action="store_true", help="save the run and write the doc's section")
    parser.add_argument("--render", action="store_true", help="only write the section again from the saved JSON")
    args = parser.parse_args()
    if args.render:
        render(json.loads(OUT.read_text(encoding="utf-8")))
        return
    if args.publish and tuple(args.models) != MODELS:
        parser.error(f"--publish measures every model ({', '.join(MODELS)}): leave out --models")
    import torch

    from core.corpus.stats import CONFIDENCE, MIN_ITEMS
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    models = [measure_model(name) for name in args.models]
    seconds = time.perf_counter() - started
    run = {"threads": torch.get_num_threads(), "seconds": round(seconds, 1), "minutes": round(seconds / 60, 1),
           "settings": {"confidence_percent": round(100 * CONFIDENCE), "seed": SEED, "passages": PASSAGES,
                        "passage_tokens": PASSAGE_TOKENS, "prompts": PROMPTS,
                        "min_items": MIN_ITEMS, "topk": list(TOPK), "bigbird": [list(b) for b in BIGBIRD],
                        "performer": list(PERFORMER), "lowrank_fractions": list(LOWRANK_FRACTIONS),
                        "linformer": [list(x) for x in LINFORMER]},
           "models": models}
    print(f"SUMMARY approx_accuracy: {len(models)} models in {run['seconds'] / 60:.1f} min")
    if args.publish:
        run = {**stamp(), **run}
        OUT.write_text(json.dumps(run, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"saved {OUT}")
        render(run)


if __name__ == "__main__":
    main()
