"""Does the Lab's induction run always learn the textbook circuit? The run the project ships
(assets/lessons/induction: a two-layer attention-only decoder on copy-62) traced, and its config trained from
several seeds, each traced by core.lab.induction.circuit on the same 16 fresh texts: held-out exact match, layer 0's
strongest previous-token head, layer 1's strongest induction head, the earlier head that feeds its keys most, and
whether core.analysis.circuits' rule names the circuit.

Every score is saved to assets/measured/induction_seeds.json; docs/core.md's two sections (induction-shipped, the
paragraph on the shipped run; induction-seeds, the table) are written from that file, the circuit decided again by
the rule from the stored scores. One thread, so each seed's weights repeat exactly on this machine.
Usage: python scripts/induction_seeds.py [--seeds 0 1 2 3] [--publish]
       python scripts/induction_seeds.py --render      (the docs again from the saved file, nothing trained)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))     # common: publish, md_table, stamp
sys.path.insert(0, str(ROOT))

from common import DOCS, add_publish, md_table, publish, stamp  # noqa: E402
from core import load_model  # noqa: E402
from core.analysis import circuits  # noqa: E402
from core.lab import induction, shipped, train  # noqa: E402

OUT = ROOT / "assets" / "measured" / "induction_seeds.json"


def traced(model) -> dict:
    """One model's circuit as plain values: both scores of every head and what feeds the induction head's keys."""
    found = induction.circuit(model)
    return {"previous_token": found.previous_token.tolist(), "induction": found.induction.tolist(),
            "keys": circuits.keys_record(found.keys), "weights_k": found.keys.weights.k.tolist()}


def decided(record: dict) -> circuits.InductionCircuit:
    """The rule's decision on a stored trace."""
    previous, induction_scores = torch.tensor(record["previous_token"]), torch.tensor(record["induction"])
    keys = circuits.stored_keys(record["keys"], previous.shape[1])
    return circuits.induction_circuit(previous, induction_scores, keys)


def share_words(record: dict, part) -> str:
    """A part's mean share of the keys with its interval, as stored."""
    keys = record["keys"]
    i = keys["labels"].index(str(part))
    return f"{keys['mean'][i]:+.2f} [{keys['low'][i]:.2f}, {keys['high'][i]:.2f}]"


def shipped_paragraph(saved: dict) -> str:
    """The paragraph on the shipped run, every figure read from its stored trace."""
    record = saved["shipped"]
    finding = decided(record)
    weights = torch.tensor(record["weights_k"])[0]
    allowed = f"L0 H{int(weights.argmax())}"
    if finding.found:
        said = (f"{finding.source} is the previous-token head ({finding.source_previous:.2f}), {finding.induction} "
                f"the induction head ({finding.induction_score:.2f}), and {finding.source} feeds "
                f"{finding.induction}'s keys first (share {share_words(record, finding.source)})")
    else:
        said = f"the rule finds {finding.words()}"
    return (f"On the run the project ships (`assets/lessons/induction`, its command in that folder's README), traced "
            f"on {record['keys']['n']} fresh texts, {said}, while the weights alone rank {allowed} first "
            f"(K-composition {float(weights.max()):.2f}). A circuit is named only where the induction score is at "
            f"least {circuits.INDUCTION_MIN:g} and the earlier head feeding its keys most is a previous-token head "
            f"(score at least {circuits.PREVIOUS_MIN:g}; core.analysis.circuits).")


def seeds_table(saved: dict) -> str:
    config = train.LabConfig(**saved["config"])
    rows = []
    for run in saved["seeds"]:
        finding = decided(run)
        previous = torch.tensor(run["previous_token"])
        p = int(previous[0].argmax())
        source = (f"{finding.source} {share_words(run, finding.source)}" if finding.source is not None else "—")
        rows.append([str(run["seed"]), f"{run['exact_match']:.0%}", f"L0 H{p} ({float(previous[0, p]):.2f})",
                     f"{finding.induction} ({finding.induction_score:.2f})", source,
                     "yes" if finding.found else "no", f"{run['seconds']:.0f} s"])
    return (f"The saved run's config ({config.n_layers} layers × {config.n_heads} heads, d_model {config.d_model}, "
            f"attention only, copy-62 with {config.lengths[0]}–{config.lengths[1]} symbols, batch {config.batch}, "
            f"{config.steps:,} steps, lr {config.lr:g}) from each seed, one thread; traced on 16 fresh texts "
            "`<bos> s <sep> s` (20 symbols): layer 0's head of largest previous-token score, layer 1's head of "
            "largest induction score, the earlier head with the largest share of that head's keys (mean [95 % "
            "interval]), and whether core.analysis.circuits names the circuit (induction score at least "
            f"{circuits.INDUCTION_MIN:g}, the head feeding its keys most a previous-token head at least "
            f"{circuits.PREVIOUS_MIN:g}).\n\n"
            + md_table(["seed", "exact match", "layer 0's largest previous-token score",
                        "layer 1's largest induction score", "keys fed most by", "circuit named?", "time"], rows))


def measure(seeds: list[int]) -> dict:
    config = shipped.lab_config(shipped.INDUCTION)
    saved = {**stamp(), "config": asdict(config), "shipped": traced(load_model(shipped.INDUCTION, device="cpu")),
             "seeds": []}
    for seed in seeds:
        started = time.perf_counter()
        run = None
        for run, _ in train.train(replace(config, seed=seed, eval_every=config.steps)):
            pass
        record = {"seed": seed, "exact_match": run.final.exact_match, **traced(run.model)}
        record["seconds"] = round(time.perf_counter() - started, 1)
        saved["seeds"].append(record)
        print(f"seed {seed}: {decided(record).words()}", flush=True)
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--render", action="store_true", help=f"write the docs again from {OUT.name}")
    add_publish(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.render:
        saved = json.loads(OUT.read_text(encoding="utf-8"))
    else:
        saved = measure(args.seeds)
        OUT.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
    paragraph, table = shipped_paragraph(saved), seeds_table(saved)
    if args.publish or args.render:
        publish("induction-shipped", paragraph, doc=DOCS / "core.md", run=saved)
        publish("induction-seeds", table, doc=DOCS / "core.md", run=saved)
    else:
        print(paragraph, table, sep="\n\n")


if __name__ == "__main__":
    main()
