"""Where the induction heads' keys come from, on a real model: the atlas's strongest induction heads (the induction
score over the induction texts, core.analysis.over.head_scores_over), each traced with core.analysis.qk's
composition_over (the Heads tab's *What feeds a head*) on the same texts to the components that wrote its keys,
beside its weights-only K-composition, and whether core.analysis.circuits' rule names the circuit (the earlier head
feeding the keys most a previous-token head, both scores above the rule's minimums).

Every score is saved to assets/measured/composition_finding.json; docs/core.md's section composition is written from
that file, the circuit decided again by the rule from the stored scores.
Usage: python scripts/composition_finding.py [--model smollm2-135m-instruct] [--texts 20] [--heads 3] [--publish]
       python scripts/composition_finding.py --render      (the docs again from the saved file, nothing measured)
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))     # common: publish, md_table, stamp
sys.path.insert(0, str(ROOT))

from common import DOCS, add_publish, md_table, publish, stamp  # noqa: E402
from core import load_model  # noqa: E402
from core.analysis import circuits, qk  # noqa: E402
from core.analysis.over import head_scores_over  # noqa: E402
from core.corpus import texts as corpora  # noqa: E402
from core.store import ensure  # noqa: E402

OUT = ROOT / "assets" / "measured" / "composition_finding.json"
PROBE_LENGTH = 100    # random tokens before each text repeats: the Heads tab's induction probe's


def share(keys: dict, i: int) -> str:
    low, high = keys["low"][i], keys["high"][i]
    interval = "" if low is None or math.isnan(low) else f" [{low:.2f}, {high:.2f}]"
    return f"{keys['mean'][i]:+.2f}{interval}"


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    model = load_model(ensure(args.model), device="cpu")
    length = min(PROBE_LENGTH, (model.config.max_positions - 1) // 2)
    texts = corpora.induction_texts(model.tokenizer, args.texts, length, bos=model.config.bos_token_id)
    scores = head_scores_over(model, texts)
    induction, previous = scores["induction"].mean, scores["previous_token"].mean          # [L, H]
    later = induction.clone()
    later[0] = -math.inf                                 # a layer-0 head has no earlier head to read
    traced = []
    for flat in later.flatten().topk(args.heads).indices.tolist():
        layer, head = divmod(flat, model.config.n_heads)
        keys = qk.composition_over(model, texts, layer, head, "key")
        traced.append({"keys": circuits.keys_record(keys), "weights_k": keys.weights.k.tolist()})
        print(f"L{layer} H{head}: traced", flush=True)
    return {**stamp(), "model": args.model, "texts": args.texts, "length": length,
            "previous_token": previous.tolist(), "induction": induction.tolist(), "heads": traced}


def body(saved: dict) -> str:
    previous, induction = torch.tensor(saved["previous_token"]), torch.tensor(saved["induction"])
    n_heads = previous.shape[1]
    rows = []
    for traced in saved["heads"]:
        keys = circuits.stored_keys(traced["keys"], n_heads)
        finding = circuits.induction_circuit(previous, induction, keys)
        stored = traced["keys"]
        order = sorted(range(len(stored["labels"])), key=lambda i: -abs(stored["mean"][i]))
        weights = torch.tensor(traced["weights_k"]).flatten()
        strongest = divmod(int(weights.argmax()), n_heads)
        source = ("—" if finding.source is None else
                  f"{finding.source} {share(stored, keys.index(finding.source))} ({finding.source_previous:.2f})")
        rows.append([f"{finding.induction} ({finding.induction_score:.2f})",
                     *(f"{stored['labels'][i]} {share(stored, i)}" for i in order[:2]), source,
                     "yes" if finding.found else "no",
                     f"L{strongest[0]} H{strongest[1]} ({float(weights.max()):.3f})"])
    return (f"{saved['model']} on {saved['texts']} induction texts ({saved['length']} random tokens repeated once, as "
            f"the Heads tab's probe, seeds 0…{saved['texts'] - 1}): the {len(saved['heads'])} heads of layers ≥ 1 of "
            "largest induction score over them, each traced with *What feeds a head* on its keys (each text's 16 "
            "most attended pairs after key 0, weighted by attention; a share is a component's part of the relative "
            "score over the relative score, mean [95 % interval] over the texts, the two of largest |share| first), "
            "the earlier single head with the largest share (its previous-token score over the same texts in "
            "brackets), whether core.analysis.circuits names the circuit (induction score at least "
            f"{circuits.INDUCTION_MIN:g}, that head a previous-token head at least {circuits.PREVIOUS_MIN:g}), and "
            "the earlier head its weights alone compose with most (Elhage et al.'s K-composition).\n\n"
            + md_table(["induction head (score)", "largest share", "second", "largest single head (previous-token)",
                        "circuit named?", "weights' strongest K-composition"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--texts", type=int, default=20)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--render", action="store_true", help=f"write the docs again from {OUT.name}")
    add_publish(parser)
    args = parser.parse_args()
    if args.render:
        saved = json.loads(OUT.read_text(encoding="utf-8"))
    else:
        saved = measure(args)
        OUT.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
    text = body(saved)
    if args.publish or args.render:
        publish("composition", text, doc=DOCS / "core.md", run=saved)
    else:
        print(text)


if __name__ == "__main__":
    main()
