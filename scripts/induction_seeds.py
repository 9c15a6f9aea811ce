"""Does the Lab's induction run always learn the textbook circuit? The saved run's config (assets/lessons/induction:
a two-layer attention-only decoder on copy-62) trained from several seeds, each traced by
core.analysis.induction.circuit on the same 16 fresh texts: held-out exact match, layer 0's strongest
previous-token head, layer 1's strongest induction head, and the earlier head that feeds its keys most.

With --publish the table goes to docs/core.md (section induction-seeds), with the date, the machine and this
command. One thread, so each seed's weights repeat exactly on this machine.
Usage: python scripts/induction_seeds.py [--seeds 0 1 2] [--publish]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))     # common: publish, md_table
sys.path.insert(0, str(ROOT))

from common import DOCS, add_publish, md_table, publish  # noqa: E402
from core.lab import train  # noqa: E402
from core.analysis import induction  # noqa: E402
from core.lab import shipped  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    add_publish(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = shipped.lab_config(shipped.INDUCTION)
    rows = []
    for seed in args.seeds:
        started = time.perf_counter()
        run = None
        for run, _ in train.train(replace(config, seed=seed, eval_every=config.steps)):
            pass
        found = induction.circuit(run.model)
        share = found.keys.shares
        first = found.keys.labels.index(found.first_source)
        p, i = found.previous_head, found.induction_head
        rows.append([str(seed), f"{run.final.exact_match:.0%}", f"L0 H{p} ({found.previous_token[p]:.2f})",
                     f"L1 H{i} ({found.induction[i]:.2f})",
                     f"{found.first_source} {share.mean[first]:+.2f} [{share.low[first]:.2f}, {share.high[first]:.2f}]",
                     "yes" if found.found else "no", f"{time.perf_counter() - started:.0f} s"])
        print(" | ".join(rows[-1]), flush=True)
    body = (f"The saved run's config ({config.n_layers} layers × {config.n_heads} heads, d_model {config.d_model}, "
            f"attention only, copy-62 with {config.lengths[0]}–{config.lengths[1]} symbols, batch {config.batch}, "
            f"{config.steps:,} steps, lr {config.lr:g}) from each seed, one thread; traced on 16 fresh texts "
            "`<bos> s <sep> s` (20 symbols): layer 0's head of largest previous-token score, layer 1's head of "
            "largest induction score, the earlier head with the largest share of that head's keys (mean [95 % "
            "interval]), and whether it is the previous-token head.\n\n"
            + md_table(["seed", "exact match", "previous-token head", "induction head", "keys fed most by",
                        "textbook circuit?", "time"], rows))
    if args.publish:
        publish("induction-seeds", body, doc=DOCS / "core.md")
    else:
        print(body)


if __name__ == "__main__":
    main()
