"""Cheap estimates of activation patching (core/analysis/shortcuts.py) against the exact sweeps on a real model.

  speed   AtP over every head (z, layer × head) and every resid_pre position of the 14-token IOI pair from one
          set of passes (shortcuts.atp_sweeps), beside the two exact sweeps (patching.patch_sweep) and one plain
          forward pass, alternating, medians (ranges) of --repeats runs: AtP's cost in forward-pass equivalents
          and the exact sweeps' time over AtP's.
  report  shortcuts_over (the Across texts tab's job) over --pairs built-in IOI pairs (core.corpus.texts.ioi_pairs),
          heads and resid_pre: each method's Spearman's ρ, top-10 overlap, false negatives, signed error on the 10
          strongest cells and cost, as the mean [95 % interval] over the pairs; and the job's seconds per pair,
          so how many pairs one job fits within the tab's time cap.
With --publish the run is saved to assets/measured/shortcuts.json (every pair's values, the summaries, the command, date and
machine) and docs/shortcuts.md's section `shortcuts` (its findings, both tables) is written from that file alone;
--render writes the section again from the saved file without running the model.
Usage: python bench/analysis/shortcuts.py [--model smollm2-135m-instruct] [--repeats 5] [--pairs 8] [--threads 1]
                                          [--publish | --render]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for common

from common import DOCS, add_publish, md_table, median, publish, row, section, stamp, timed  # noqa: E402

IOI = ("When Mary and John went to the store, John gave a drink to",
       "When Mary and John went to the store, Mary gave a drink to")
WIDTHS = (44, 22, 16, 12)
DOC = DOCS / "shortcuts.md"
SAVED = DOCS.parent / "assets" / "measured" / "shortcuts.json"
SECTION = "shortcuts"
TARGET_PASSES = 4       # AtP of every head and resid_pre cell together should cost at most this many forward passes
SITE_NAMES = {"z": "heads (z, layer × head)", "resid_pre": "resid_pre (layer × position)"}
SITE_HEADINGS = {"z": "Heads (`z`, layer × head)", "resid_pre": "The residual stream (`resid_pre`, layer × position)"}
MINUS = "−"


# ---- measuring: the model runs here, and every figure goes into one saved run ----

def speed(model, repeats: int) -> dict:
    """AtP of every head and resid_pre cell of the IOI pair beside the two exact sweeps and one forward pass:
    every run's seconds, their medians, and the forward-pass equivalents."""
    import torch

    from core.analysis import patching, shortcuts
    tok = model.tokenizer
    clean, corrupted = (torch.tensor([tok(t, add_special_tokens=False).input_ids]) for t in IOI)
    answer, foil = (tok(w, add_special_tokens=False).input_ids[0] for w in (" Mary", " John"))
    cfg, n = model.config, clean.shape[1]

    def forward():
        with torch.inference_mode():
            model(clean)

    runs = {"forward": forward,
            "atp": lambda: shortcuts.atp_sweeps(model, clean, corrupted, answer, foil, ("z", "resid_pre")),
            "exact": lambda: (patching.patch_sweep(model, clean, corrupted, answer, foil, "z"),
                              patching.patch_sweep(model, clean, corrupted, answer, foil, "resid_pre"))}
    for run in runs.values():       # warm-up
        run()
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(timed(run, "cpu")[0])
    one = median(times["forward"])
    return {"pair": list(IOI), "tokens": n, "cells": {"z": cfg.n_layers * cfg.n_heads, "resid_pre": cfg.n_layers * n},
            "repeats": repeats, "seconds": times, "median_seconds": {name: median(t) for name, t in times.items()},
            "forward_passes": {"atp": median([t / one for t in times["atp"]]), "exact": median(times["exact"]) / one},
            "exact_over_atp": median(times["exact"]) / median(times["atp"]), "target_forward_passes": TARGET_PASSES}


def finite(x: float) -> float | None:
    return None if math.isnan(x) else x


def summary(over, at: tuple[int, int]) -> dict:
    """One cell of an Over as the saved run keeps it: mean, interval (None where there is none), which interval,
    the quantity's range, n, and every pair's value (in the order of the run's items)."""
    return {"mean": finite(float(over.mean[at])), "low": finite(float(over.low[at])),
            "high": finite(float(over.high[at])), "interval": over.interval or None,
            "bounds": None if over.bounds is None else list(over.bounds), "n": over.n,
            "per_pair": [finite(float(v)) for v in over.per_item[(slice(None), *at)]]}


def report(model, n_pairs: int) -> dict:
    """shortcuts_over, the Across texts tab's job, over the pairs: every site's exact row and each method's
    measures, and the job's seconds per pair."""
    import torch

    from core.analysis import shortcuts
    from core.corpus.stats import CONFIDENCE, MIN_ITEMS
    from core.corpus.texts import ioi_pairs
    from ui.settings import AppSettings
    cap = AppSettings().corpus_max_seconds     # one corpus job's time cap on a server with the defaults
    pairs = ioi_pairs(model.tokenizer, n_pairs)
    start = time.perf_counter()
    found = shortcuts.shortcuts_over(model, pairs, progress=lambda done, total: print(f"  pair {done}/{total}",
                                                                                      flush=True))
    per_pair = (time.perf_counter() - start) / n_pairs
    tok = model.tokenizer
    sites = {}
    for column, site in enumerate(shortcuts.SITES_COMPARED):
        exact = found["exact"]
        sites[site] = {"exact": {"cost": summary(exact, (0, column)), "strong_cells": summary(exact, (1, column))},
                       "methods": {method: {name: summary(found[name], (shortcuts.METHODS.index(method), column))
                                            for name in shortcuts.MEASURES}
                                   for method in shortcuts.methods_at(site)}}
    return {"pairs": n_pairs, "seed": 0, "mode": "denoise", "k": 10, "strong": shortcuts.STRONG,
            "strongest": shortcuts.STRONGEST, "ig_points": shortcuts.IG_POINTS, "confidence": CONFIDENCE,
            "min_items": MIN_ITEMS,
            "prompts": [{"clean": tok.decode(p.clean.tolist()), "corrupted": tok.decode(p.corrupted.tolist()),
                         "answer": tok.decode([p.answer]), "foil": tok.decode([p.foil])} for p in pairs],
            "items": list(found["rho"].items), "left_out": {str(i): why for i, why in found["rho"].left_out.items()},
            "seconds_per_pair": per_pair, "threads": torch.get_num_threads(), "cap_seconds": cap,
            "pairs_within_cap": int(cap // per_pair), "sites": sites}


# ---- rendering: the section of docs/shortcuts.md from a saved run, and nothing else ----

def num(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}".replace("-", MINUS)


def shown(s: dict) -> str:
    """'0.83 [0.71, 0.95]', the mean alone where there is no interval, '—' where there is no value."""
    if s["mean"] is None:
        return "—"
    return num(s["mean"]) if s["low"] is None else f"{num(s['mean'])} [{num(s['low'])}, {num(s['high'])}]"


def spread(values: list[float], middle: float, digits: int) -> str:
    return f"{num(middle, digits)} ({num(min(values), digits)}–{num(max(values), digits)})"


def speed_table(run: dict) -> list[list[str]]:
    s = run["speed"]
    cells = f"{s['cells']['z']} heads + {s['cells']['resid_pre']} resid_pre cells"
    rows = [("one forward pass of the clean prompt", "forward", 3, "1", ""),
            (f"AtP, {cells}, one set of passes", "atp", 3, num(s["forward_passes"]["atp"], 1), ""),
            ("exact patching (`patch_sweep` z and resid_pre)", "exact", 2, num(s["forward_passes"]["exact"], 0),
             f"{num(s['exact_over_atp'], 1)}×")]
    return [[name, f"{spread(s['seconds'][key], s['median_seconds'][key], digits)} s", passes, ratio]
            for name, key, digits, passes, ratio in rows]


def agreement_table(run: dict) -> list[list[str]]:
    r, rows = run["report"], []
    for site, found in r["sites"].items():
        exact = found["exact"]
        rows.append([SITE_NAMES[site], f"exact patching ({shown(exact['strong_cells'])} cells ≥ {r['strong']:g})",
                     "—", "—", "—", "—", shown(exact["cost"])])
        for method, measures in found["methods"].items():
            rows.append([SITE_NAMES[site], method, *(shown(measures[name]) for name in
                                                     ("rho", "overlap", "false_negatives", "signed_error", "cost"))])
    return rows


def overlapping(a: dict, b: dict) -> bool | None:
    """Whether two summaries' intervals overlap; None where either has none."""
    if a["low"] is None or b["low"] is None:
        return None
    return a["low"] <= b["high"] and b["low"] <= a["high"]


def names(methods: list[str]) -> str:
    return methods[0] if len(methods) == 1 else ", ".join(methods[:-1]) + " and " + methods[-1]


def leader(measures: dict, name: str, lower: bool) -> str:
    """Which method leads on one measure, said from the numbers: the leader (with the methods whose printed mean
    equals its), its value, whether its interval is clear of the next one's, and which trails."""
    ranked = sorted((m for m in measures if measures[m][name]["mean"] is not None),
                    key=lambda m: measures[m][name]["mean"], reverse=not lower)
    if not ranked:
        return "no method has a value"
    first = measures[ranked[0]][name]
    tied = [m for m in ranked if num(measures[m][name]["mean"]) == num(first["mean"])]
    others = [m for m in ranked if m not in tied]
    text = f"{names(tied)} ({shown(first)}{'' if len(tied) == 1 else ', the same to two decimals'})"
    if others:
        runner = measures[others[0]][name]
        clear = overlapping(first, runner)
        whose = "its" if len(tied) == 1 else f"{tied[0]}'s"
        if clear is not None:
            text += f", {whose} interval {'overlapping' if clear else 'clear of'} {others[0]}'s ({shown(runner)})"
        if len(others) > 1 or clear is None:
            last = others[-1]
            text += f"; {last} {'highest' if lower else 'lowest'} ({shown(measures[last][name])})"
    return text


def signed_words(measures: dict) -> str:
    """Which estimates fall short of patching on the strongest cells, which overshoot, and which cannot be told
    from it, by whether the interval of their signed error excludes 0."""
    short, over, level, plain = [], [], [], []
    for method, m in measures.items():
        s = m["signed_error"]
        if s["mean"] is None:
            continue
        if s["low"] is None:
            plain.append(f"{method} {shown(s)}")
        elif s["high"] < 0:
            short.append(f"{method} ({shown(s)})")
        elif s["low"] > 0:
            over.append(f"{method} ({shown(s)})")
        else:
            level.append(f"{method} ({shown(s)})")
    parts = []
    if short:
        parts.append(f"{names(short)} fall{'s' if len(short) == 1 else ''} short of patching (interval below 0)")
    if over:
        parts.append(f"{names(over)} overshoot{'s' if len(over) == 1 else ''} patching (interval above 0)")
    if level:
        parts.append(f"{names(level)} cannot be told from patching (interval around 0)")
    if plain:
        parts.append(f"{names(plain)}, with no interval")
    return "; ".join(parts)


def site_words(run: dict, site: str) -> str:
    r = run["report"]
    found = r["sites"][site]
    measures, exact = found["methods"], found["exact"]
    k, strong = r["k"], r["strong"]
    strong_cells = exact["strong_cells"]
    most = max(v for v in strong_cells["per_pair"] if v is not None)
    if strong_cells["mean"] > k:
        strong_text = (f"more than k = {k} on average, so even a perfect ranking leaves some below the top {k}: "
                       f"there the false negatives say less than ρ and the signed error")
    elif most > k:
        strong_text = (f"more than k = {k} on some pairs (up to {most:g}), where even a perfect ranking leaves some "
                       f"below the top {k}")
    else:
        strong_text = f"at most k = {k} on every pair (up to {most:g}), so a perfect ranking would miss none"
    unsigned = [m for m in measures if measures[m]["signed_error"]["mean"] is None]
    none_shared = [m for m in measures if measures[m]["overlap"]["mean"] == 0]
    lines = [f"- **{SITE_HEADINGS[site]}**. Closest to patching by Spearman's ρ: "
             f"{leader(measures, 'rho', lower=False)}.",
             f"  By top-{k} overlap: {leader(measures, 'overlap', lower=False)}"
             + (f"; {names(none_shared)} share{'s' if len(none_shared) == 1 else ''} none of the exact top {k} on "
                f"any pair" if none_shared and all(v == 0 for m in none_shared
                                                   for v in measures[m]["overlap"]["per_pair"]) else "") + ".",
             f"  Exact patching finds {shown(strong_cells)} cells ≥ {strong:g} of the clean − corrupted difference "
             f"per pair, {strong_text}. Fewest false negatives: {leader(measures, 'false_negatives', lower=True)}.",
             f"  On the {r['strongest']} strongest cells, {signed_words(measures)}"
             + (f"; {names(unsigned)}, unsigned, has none" if unsigned else "") + ".",
             f"  Cheapest, in forward passes: {leader(measures, 'cost', lower=True)}; the exact sweep "
             f"{shown(exact['cost'])}."]
    return "\n".join(lines)


def headline(run: dict) -> str:
    """Where AtP agrees better with patching, heads or the residual stream, by ρ and by the overlap."""
    sites = run["report"]["sites"]
    said = []
    for name, words in (("rho", "ρ"), ("overlap", f"top-{run['report']['k']} overlap")):
        heads, resid = (sites[s]["methods"]["atp"][name] for s in ("z", "resid_pre"))
        if num(heads["mean"]) == num(resid["mean"]):
            side = "the same on both"
        else:
            side = "higher on heads" if heads["mean"] > resid["mean"] else "higher on the residual stream"
        clear = overlapping(heads, resid)
        note = "" if clear is None else ", the intervals overlapping" if clear else ", the intervals apart"
        said.append(f"{words} {side} ({shown(heads)} on heads, {shown(resid)} on resid_pre{note})")
    return "AtP against exact patching: " + "; ".join(said) + "."


def interval_words(run: dict) -> str:
    """Which interval each measure got, read from the saved summaries."""
    r = run["report"]
    labels = {"rho": "ρ", "overlap": "the overlap", "false_negatives": "the false negatives",
              "signed_error": "the signed error", "cost": "the cost"}
    by_kind: dict[str, list[str]] = {}
    for name, label in labels.items():
        kinds = {m[name]["interval"] for s in r["sites"].values() for m in s["methods"].values()
                 if m[name]["mean"] is not None}
        for kind in kinds:
            by_kind.setdefault(kind or "none", []).append(label)
    words = [f"{names(labels_)}: {'no interval' if kind == 'none' else kind}" for kind, labels_ in by_kind.items()]
    n = r["sites"]["z"]["methods"]["atp"]["rho"]["n"]
    few = (f" With n = {n}, fewer than {r['min_items']}, there is no interval." if n < r["min_items"] else "")
    return (f"Intervals of confidence {r['confidence']:g} over the pairs ({'; '.join(words)}); a bounded "
            f"measure's interval stays in its range.{few}")


def findings(run: dict) -> str:
    r, s = run["report"], run["speed"]
    n = r["sites"]["z"]["methods"]["atp"]["rho"]["n"]
    left = (f" Left out: {'; '.join(f'pair {i}: {why}' for i, why in r['left_out'].items())}."
            if r["left_out"] else "")
    met = "met" if s["forward_passes"]["atp"] <= s["target_forward_passes"] else "missed"
    return "\n\n".join([
        f"{run['model']}, {n} of {r['pairs']} built-in IOI pairs (`ioi_pairs(tokenizer, {r['pairs']}, "
        f"seed={r['seed']})`, {r['mode']}), mean [interval] over the pairs.{left} {interval_words(run)}",
        headline(run),
        site_words(run, "z") + "\n" + site_words(run, "resid_pre"),
        f"Cost on the {s['tokens']}-token pair of the speed table: AtP of all {s['cells']['z']} heads and "
        f"{s['cells']['resid_pre']} resid_pre cells together takes {num(s['forward_passes']['atp'], 1)} forward "
        f"passes (target ≤ {s['target_forward_passes']}: {met}), the two exact sweeps "
        f"{num(s['forward_passes']['exact'], 0)}, {num(s['exact_over_atp'], 1)}× AtP's time.",
        f"These are {n} pairs of one task on one model: an interval is over those pairs, not over tasks or models."])


def body(run: dict) -> str:
    """The section's body: the findings, then the two tables and the job's line, all read from the saved run."""
    r, s = run["report"], run["speed"]
    return (
        f"From `{SAVED.relative_to(DOCS.parent).as_posix()}` (every pair's values and the summaries); "
        f"`python bench/analysis/shortcuts.py --render` writes this section again from it.\n\n"
        + findings(run)
        + f"\n\n### The measurement\n\n{run['model']}, cpu, float32, {run['threads']} thread(s). Speed: the "
          f"{s['pair'][0]!r} pair, median (range) of {s['repeats']} runs alternating between the rows; forward-pass "
          "equivalents are each row's time over the forward pass's median.\n\n"
        + md_table(["", "time", "forward passes", "exact / AtP"], speed_table(run), ["---", "---:", "---:", "---:"])
        + f"\n\nAgreement with exact patching ({r['mode']}) over the pairs: mean [interval] over the pairs, over the "
          f"cells whose activation differs between the two prompts. Overlap: the share of the exact top {r['k']} (by "
          f"size) in the method's top {r['k']}; false negatives: cells with an exact effect ≥ {r['strong']:g} of the "
          f"clean − corrupted difference that the method ranks below {r['k']} (the exact row gives their count); "
          f"signed error: method − exact on the {r['strongest']} strongest cells (normalised units; none for the "
          "unsigned flow graph, whose ρ is against |exact|); cost: time over one forward pass of the same pair. "
          "The exact row is the truth the others are measured against.\n\n"
        + md_table(["site", "method", "Spearman ρ", f"top-{r['k']} overlap", "false negatives", "signed error",
                    "cost (forward passes)"], agreement_table(run), ["---", "---", "---:", "---:", "---:", "---:",
                                                                     "---:"])
        + f"\n\nThe job (`shortcuts_over`, the Across texts tab's): {num(r['seconds_per_pair'], 1)} s a pair (both "
          f"sites, every method, {r['threads']} thread(s)): {r['pairs_within_cap']} pairs within the Across texts "
          f"tab's {r['cap_seconds']:g} s cap on one job; a job stopped by the cap keeps its pairs and the next run "
          "goes on from them.")


def block(run: dict) -> str:
    """The section as the doc holds it, markers and head line included."""
    return section(SECTION, body(run), run=run)


def render(run: dict, doc: Path = DOC) -> Path:
    """Write the saved run's section into the doc, headed by the run's own command, date and machine."""
    return publish(SECTION, body(run), doc=doc, run=run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-report", action="store_true", help="the speed table alone (not with --publish)")
    parser.add_argument("--render", action="store_true",
                        help=f"only write the section again from the saved {SAVED.name}, without running the model")
    add_publish(parser)
    args = parser.parse_args()
    if args.render:
        render(json.loads(SAVED.read_text(encoding="utf-8")))
        return
    if args.publish and args.skip_report:
        parser.error("--publish writes the report's tables and findings: leave out --skip-report")
    import torch

    from common import load_average
    from core import load_model
    from core.store import ensure
    torch.set_num_threads(args.threads)
    folder = ensure(args.model)
    model = load_model(folder, device="cpu", dtype=torch.float32)
    load = load_average()
    print(f"model {args.model} ({folder}), cpu, float32, {torch.get_num_threads()} thread(s), load average "
          f"{load if load is None else f'{load:.2f}'}, medians (ranges) of {args.repeats} alternating runs")
    run = {"model": args.model, "threads": torch.get_num_threads(), "speed": speed(model, args.repeats)}
    s = run["speed"]
    print(row("", "seconds", "forward passes", "exact / AtP", widths=WIDTHS))
    for cells in speed_table(run):
        print(row(*cells, widths=WIDTHS))
    lines = []
    if not args.skip_report:
        run["report"] = report(model, args.pairs)
        for cells in agreement_table(run):
            print(row(*cells, widths=(30, 40, 22, 22, 22, 22, 20)))
        lines = [f"{run['report']['seconds_per_pair']:.1f} s a pair, {run['report']['pairs_within_cap']} pairs "
                 f"within the {run['report']['cap_seconds']:g} s cap"]
    if args.publish:
        run = {**stamp(), **run}
        SAVED.write_text(json.dumps(run, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"saved {SAVED}")
        render(run)
    print(f"SUMMARY shortcuts: AtP over {s['cells']['z']} heads + {s['cells']['resid_pre']} resid_pre cells of the "
          f"{s['tokens']}-token IOI pair: {s['forward_passes']['atp']:.1f} forward-pass equivalents (target ≤ "
          f"{TARGET_PASSES}), {s['exact_over_atp']:.1f}x faster than exact patching of the same cells"
          + ("; " + "; ".join(lines) if lines else ""))


if __name__ == "__main__":
    main()
