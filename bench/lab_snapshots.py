"""Where the Lab tab's default run forms its attention, so that its default snapshot steps show something.

The default run (core/lab/train.py: DEFAULT_RUN, the fields the Lab tab opens with; on the CPU, without the
server's time budget) is trained once; every few steps its attention is measured on the held-out example the snapshots draw, and on the
first held-out examples. The formation number is core.lab.answers.weight_on_source: the weight (mean of heads) that the
rows predicting each output character give the source position the task says it comes from (reverse: the mirrored
one), averaged over the characters, per layer: 1 when the attention looks only there, about 1/len(source) when it
looks everywhere alike. Prints the curve, the steps the formation rule chooses, and the machine and time. Usage:
    python bench/lab_snapshots.py [--every 10] [--examples 32] [--threads N] [--twice]
--twice trains the run a second time and says whether the two curves are identical (training is seeded).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.lab import train as engine  # noqa: E402
from core.lab.answers import weight_on_source  # noqa: E402
from core.lab.train import DEFAULT_RUN, LabConfig  # noqa: E402

# a layer whose mean-of-heads map puts this much weight on the right key reads as a clear diagonal in a snapshot;
# the untrained model's weight is about 1 / len(source), under 0.1
FORMED = 0.3


@dataclass
class Point:
    step: int  # 0: before training
    train_loss: float | None
    shown: np.ndarray  # [L] weight_on_source on the example the snapshots draw (the first held-out one)
    held: np.ndarray  # [L] its mean over the first held-out examples
    exact_match: float | None  # where the run evaluated


def formation(model, config: LabConfig, held: list[tuple[str, str]]) -> np.ndarray:
    """weight_on_source per layer [len(held), L], on each held-out pair teacher-forced as the snapshots are."""
    return np.stack([weight_on_source(config.task, s, engine.lab_attention(model, config.family, s, t))
                     for s, t in held])


def formation_curve(config: LabConfig, steps: Iterable[int], examples: int = 1) -> Iterator[Point]:
    """Train `config` to its end or to the last of `steps`, measuring the attention's formation after each of
    `steps` (0: the untrained model, the same seed's). Measuring reads the model in inference mode and draws no
    random numbers, so the run trains exactly as the Lab trains it."""
    wanted = sorted(set(steps))
    held = engine.examples(config.task, config.seed, max(1, examples), True, config.lengths)

    def point(model, step, loss=None, exact=None):
        per_example = formation(model, config, held)
        return Point(step, loss, per_example[0], per_example.mean(0), exact)

    if 0 in wanted:
        yield point(engine.build_model(config), 0)
    last, done = wanted[-1], 0
    for run, progress in engine.train(config, stop=lambda: done >= last):
        if progress.step in wanted and progress.step > done:
            yield point(run.model, progress.step, progress.train_loss, progress.exact_match)
        done = progress.step


def choose(curve: list[Point], end: int) -> tuple[int, int, int]:
    """Three snapshot steps from a measured curve, read on the example the snapshots draw: the first step where the
    best layer's weight on the right key reaches FORMED (the attention has visibly formed), the first where it is
    halfway from there to its final value (mid-rise), and the end of the run."""
    best = {p.step: float(p.shown.max()) for p in curve}
    final = best[max(best)]
    first = next(s for s in sorted(best) if best[s] >= FORMED)
    middle = next(s for s in sorted(best) if s >= first and best[s] >= (best[first] + final) / 2)
    return first, middle, end


def measure(args) -> list[Point]:
    config = DEFAULT_RUN
    steps = range(0, config.steps + 1, args.every)
    curve = []
    for p in formation_curve(config, [*steps, config.steps, *config.snapshot_steps], args.examples):
        curve.append(p)
        layers = "  ".join(f"{x:.3f}" for x in p.shown)
        held = "  ".join(f"{x:.3f}" for x in p.held)
        loss = "     –" if p.train_loss is None else f"{p.train_loss:6.3f}"
        exact = "" if p.exact_match is None else f"  exact match {p.exact_match:.1%}"
        print(f"step {p.step:>4}  loss {loss}  snapshot example, per layer: {layers}  "
              f"first {args.examples} held-out: {held}{exact}", flush=True)
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=10, help="measure every this many steps")
    parser.add_argument("--examples", type=int, default=32, help="held-out examples the mean is taken over")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    parser.add_argument("--twice", action="store_true", help="train again and compare the curves")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = DEFAULT_RUN
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; the Lab's default run: {config.task}, {config.family} "
          f"{config.n_layers}×{config.d_model}, {config.n_heads} heads, seed {config.seed}, {config.steps} steps")
    started = time.perf_counter()
    curve = measure(args)
    seconds = time.perf_counter() - started
    shown = ", ".join(map(str, config.snapshot_steps))
    at = {p.step: p for p in curve}
    for step in config.snapshot_steps:
        print(f"default snapshot step {step}: best layer {at[step].shown.max():.3f} on the snapshot example, "
              f"{at[step].held.max():.3f} over the held-out examples (formed: ≥ {FORMED})")
    print(f"chosen snapshot steps: {', '.join(map(str, choose(curve, config.steps)))} "
          f"(the tab's default: {shown}); {seconds:.1f} s")
    if args.twice:
        again = measure(args)
        same = all(a.step == b.step and a.train_loss == b.train_loss and np.array_equal(a.held, b.held)
                   for a, b in zip(curve, again, strict=True))
        print(f"a second run's curve is {'identical' if same else 'DIFFERENT'} (losses and weights, bit for bit)")


if __name__ == "__main__":
    main()
