"""Cheap estimates of activation patching (core/analysis/shortcuts.py) against the exact sweeps on a real model.

  speed   AtP over every head (z, layer × head) and every resid_pre position of the 14-token IOI pair from one
          set of passes (shortcuts.atp_sweeps), beside the two exact sweeps (patching.patch_sweep) and one plain
          forward pass, alternating, medians (ranges) of --repeats runs: AtP's cost in forward-pass equivalents
          and the exact sweeps' time over AtP's.
  report  shortcuts_over (the Across texts tab's job) over --pairs built-in IOI pairs (core.corpus.texts.ioi_pairs),
          heads and resid_pre: each method's Spearman's ρ, top-10 overlap, false negatives, signed error on the 10
          strongest cells and cost, as the mean [95 % interval] over the pairs; and the job's seconds per pair,
          so how many pairs one job fits within the tab's time cap.
With --publish both tables go to docs/shortcuts.md (section shortcuts).
Usage: python bench/analysis/shortcuts.py [--model smollm2-135m-instruct] [--repeats 5] [--pairs 6] [--threads 1]
                                          [--publish]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for common

from common import DOCS, add_publish, load_average, md_table, median, publish, row, spread, timed  # noqa: E402
from core import load_model  # noqa: E402
from core.analysis import patching, shortcuts  # noqa: E402
from core.corpus.texts import ioi_pairs  # noqa: E402
from core.store import ensure  # noqa: E402
from ui.settings import AppSettings  # noqa: E402

IOI = ("When Mary and John went to the store, John gave a drink to",
       "When Mary and John went to the store, Mary gave a drink to")
WIDTHS = (44, 22, 16, 12)
CAP_S = AppSettings().corpus_max_seconds     # one corpus job's time cap on a server with the defaults


def speed(model, repeats: int) -> tuple[list[list[str]], str]:
    """The speed table's rows and its summary line."""
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
    equivalents = [t / one for t in times["atp"]]
    ratio = median(times["exact"]) / median(times["atp"])
    cells = f"{cfg.n_layers * cfg.n_heads} heads + {cfg.n_layers * n} resid_pre cells"
    print(row("", "seconds", "forward passes", "exact / AtP", widths=WIDTHS))
    print(row("one forward pass", spread(times["forward"], 3), "1", "", widths=WIDTHS))
    print(row(f"AtP, {cells}", spread(times["atp"], 3), f"{median(equivalents):.1f}", "", widths=WIDTHS))
    print(row("exact patching, the same cells", spread(times["exact"], 2),
              f"{median(times['exact']) / one:.0f}", f"{ratio:.1f}x", widths=WIDTHS))
    table = [["one forward pass of the clean prompt", f"{spread(times['forward'], 3)} s", "1", ""],
             [f"AtP, {cells}, one set of passes", f"{spread(times['atp'], 3)} s", f"{median(equivalents):.1f}", ""],
             ["exact patching (`patch_sweep` z and resid_pre)", f"{spread(times['exact'], 2)} s",
              f"{median(times['exact']) / one:.0f}", f"{ratio:.1f}×"]]
    summary = (f"AtP over {cells} of the {n}-token IOI pair: {median(equivalents):.1f} forward-pass equivalents "
               f"(target ≤ 4), {ratio:.1f}x faster than exact patching of the same cells")
    return table, summary


def cell(over, at: tuple[int, int]) -> str:
    """'0.83 [0.71, 0.95]' at one cell of an Over, or the mean alone where there is no interval."""
    mean, low, high = (float(t[at]) for t in (over.mean, over.low, over.high))
    if math.isnan(mean):
        return "—"
    return f"{mean:.2f}" if math.isnan(low) else f"{mean:.2f} [{low:.2f}, {high:.2f}]"


def report(model, n_pairs: int) -> tuple[list[list[str]], list[str]]:
    """The report table's rows (one per site and method) and its lines: shortcuts_over, the Across texts tab's
    job, over the pairs, and its seconds per pair."""
    pairs = ioi_pairs(model.tokenizer, n_pairs)
    start = time.perf_counter()
    found = shortcuts.shortcuts_over(model, pairs, progress=lambda done, total: print(f"  pair {done}/{total}",
                                                                                      flush=True))
    per_pair = (time.perf_counter() - start) / n_pairs
    table, lines = [], []
    for column, site in enumerate(shortcuts.SITES_COMPARED):
        name = "heads (z, layer × head)" if site == "z" else "resid_pre (layer × position)"
        exact = found["exact"]
        table.append([name, f"exact patching ({cell(exact, (1, column))} cells ≥ 0.1)", "1", "1", "0", "0",
                      cell(exact, (0, column))])
        chosen = shortcuts.methods_at(site)
        for method in chosen:
            at = (shortcuts.METHODS.index(method), column)
            cells = [cell(found[s], at) for s in shortcuts.MEASURES]
            table.append([name, method, *cells])
            print(row(f"{site} {method}", *cells, widths=(16, 22, 22, 22, 22, 20)))
        rhos = ", ".join(f"{m} {float(found['rho'].mean[shortcuts.METHODS.index(m), column]):.2f}" for m in chosen)
        lines.append(f"{site}: mean rho {rhos} over {found['rho'].n} pairs")
    if found["rho"].left_out:
        lines.append(f"left out {found['rho'].left_out}")
    lines.append(f"{per_pair:.1f} s a pair (both sites, every method, {torch.get_num_threads()} thread(s)): "
                 f"{int(CAP_S // per_pair)} pairs within the Across texts tab's {CAP_S:g} s cap on one job")
    return table, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-report", action="store_true", help="the speed table alone")
    add_publish(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = ensure(args.model)
    model = load_model(folder, device="cpu", dtype=torch.float32)
    load = load_average()
    print(f"model {args.model} ({folder}), cpu, float32, {torch.get_num_threads()} thread(s), load average "
          f"{load if load is None else f'{load:.2f}'}, medians (ranges) of {args.repeats} alternating runs")
    speed_table, summary = speed(model, args.repeats)
    lines = []
    if not args.skip_report:
        report_table, lines = report(model, args.pairs)
    if args.publish:
        body = (f"{args.model}, cpu, float32, {torch.get_num_threads()} thread(s). Speed: the {IOI[0]!r} pair, "
                f"median (range) of {args.repeats} runs alternating between the rows; forward-pass equivalents are "
                "each row's time over the forward pass's median.\n\n"
                + md_table(["", "time", "forward passes", "exact / AtP"], speed_table, ["---", "---:", "---:", "---:"]))
        if not args.skip_report:
            body += (f"\n\nAgreement with exact patching (denoising) over {args.pairs} built-in IOI pairs "
                     "(`ioi_pairs(tokenizer, n, seed=0)`): mean [95 % interval] over the pairs, over the cells whose "
                     "activation differs between the two prompts. Overlap: the share of the exact top 10 (by size) in "
                     "the method's top 10; false negatives: cells with an exact effect ≥ 0.1 of the clean − corrupted "
                     "difference that the method ranks below 10 (where more than 10 cells reach 0.1, the exact row "
                     "gives their count, even a perfect ranking leaves the rest below 10); signed error: method − "
                     "exact on the 10 strongest cells (normalised units; none for the unsigned flow graph, whose ρ is against |exact|); cost: "
                     "time over one forward pass of the same pair.\n\n"
                     + md_table(["site", "method", "Spearman ρ", "top-10 overlap", "false negatives",
                                 "signed error", "cost (forward passes)"], report_table,
                                ["---", "---", "---:", "---:", "---:", "---:", "---:"])
                     + f"\n\nThe job (`shortcuts_over`, the Across texts tab's): {lines[-1]}; a job stopped by the "
                       "cap keeps its pairs and the next run goes on from them.")
        publish("shortcuts", body, doc=DOCS / "shortcuts.md")
    print(f"SUMMARY shortcuts: {summary}" + ("; " + "; ".join(lines) if lines else ""))


if __name__ == "__main__":
    main()
