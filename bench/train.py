"""How long the training lab's default run takes to learn its task: seconds until the held-out exact match of
free-running greedy generation first reaches 95 % (evaluated every 50 steps, evaluation time included), over
runs with different seeds: median and range. With --publish the result goes to docs/benchmarks.md (section train).
Usage:
    python bench/train.py [--task reverse] [--family marian] [--repeats 5] [--steps 1000] [--publish]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import add_publish, md_table, median, publish  # noqa: E402
from core.lab.train import LabConfig, train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", default="reverse")
    parser.add_argument("--family", default="marian")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000)
    add_publish(parser)
    args = parser.parse_args()
    print(f"task {args.task}, family {args.family}, default config otherwise, cpu, threads {torch.get_num_threads()}")
    reached, rates, rows = [], [], []
    for seed in range(args.repeats):
        lab = LabConfig(task=args.task, family=args.family, seed=seed, steps=args.steps, eval_every=50)
        when = None
        for _, p in train(lab, stop=lambda: when is not None):
            if p.exact_match is not None and p.exact_match >= 0.95 and when is None:
                when = p
        last = when or p
        rates.append(last.tokens_per_s)
        status = f"{when.seconds:.1f} s at step {when.step}" if when else f"not reached in {args.steps} steps"
        print(f"seed {seed}: 95 % held-out exact match {status} (exact match {last.exact_match:.1%}, "
              f"{last.tokens_per_s:,.0f} tokens/s)", flush=True)
        reached.append(when.seconds if when else float("inf"))
        rows.append([seed, f"{when.seconds:.1f} s" if when else f"not in {args.steps} steps",
                     when.step if when else "–", f"{last.exact_match:.1%}", f"{last.tokens_per_s:,.0f}"])
    spread = f"{median(reached):.1f} s ({min(reached):.1f}–{max(reached):.1f})"
    print(f"SUMMARY train: {args.task} ({args.family}) reaches 95 % held-out exact match in {spread} "
          f"(target ≤ 90 s), {median(rates):,.0f} tokens/s")
    if args.publish:
        cfg = LabConfig(task=args.task, family=args.family)
        publish("train", f"The Lab's default run, task {args.task}, {args.family} layout ({cfg.n_layers} layers, "
                         f"d {cfg.d_model}, {cfg.n_heads} heads), at most {args.steps} steps, held-out exact match "
                         f"of free-running greedy generation every 50 steps (evaluation time included), "
                         f"{args.repeats} seeds: **95 % held-out exact match in {spread}**, median (range), "
                         f"training at {median(rates):,.0f} tokens/s (median).\n\n" +
                md_table(["seed", "seconds to 95 %", "at step", "exact match then", "tokens/s"], rows,
                         ["---:", "---:", "---:", "---:", "---:"]))


if __name__ == "__main__":
    main()
