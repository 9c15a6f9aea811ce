"""Where the induction heads' keys come from, on a real model: the atlas's strongest induction heads (the induction
score over the induction texts, core.corpus.summaries.head_scores_over), each traced with the Heads tab's *What feeds
a head* (ui.services.corpus.composition: core.analysis.qk.composition_over on the same texts) to the components
that wrote its keys, beside its weights-only K-composition, and whether the first is one of the atlas's
previous-token heads.

With --publish the table goes to docs/core.md (section composition), with the date, the machine and this command.
Usage: python scripts/composition_finding.py [--model smollm2-135m-instruct] [--texts 20] [--heads 3] [--publish]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))     # common: publish, md_table
sys.path.insert(0, str(ROOT))

from common import DOCS, add_publish, md_table, publish  # noqa: E402
from core import load_model  # noqa: E402
from core.corpus import summaries, texts as corpora  # noqa: E402
from core.store import ensure  # noqa: E402
from ui.services.corpus.composition import composition  # noqa: E402
from ui.services.corpus.over import induction_length  # noqa: E402

PREVIOUS_TOP = 5      # the atlas's previous-token heads a source is checked against


def share(found, i: int) -> str:
    low, high = float(found.low[i]), float(found.high[i])
    interval = "" if math.isnan(low) else f" [{low:.2f}, {high:.2f}]"
    return f"{float(found.mean[i]):+.2f}{interval}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--texts", type=int, default=20)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    add_publish(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(ensure(args.model), device="cpu")
    length = induction_length(model)
    texts = corpora.induction_texts(model.tokenizer, args.texts, length, bos=model.config.bos_token_id)
    scores = summaries.head_scores_over(model, texts)
    n_heads = model.config.n_heads
    name = lambda flat: f"L{flat // n_heads} H{flat % n_heads}"                       # noqa: E731
    induction = scores["induction"].mean.flatten()
    previous = scores["previous_token"].mean
    rows = []
    for flat in induction.topk(args.heads).indices.tolist():
        layer, head = divmod(flat, n_heads)
        earlier = previous[:layer].flatten()
        top_previous = [name(i) for i in earlier.topk(min(PREVIOUS_TOP, earlier.numel())).indices.tolist()]
        found = composition(model, layer, head, "key", args.texts)
        weights = found.weights.flatten()
        first_head = next((label for label in found.labels if " H" in label), None)
        rows.append([f"{name(flat)} ({float(induction[flat]):.2f})", f"{found.labels[0]} {share(found, 0)}",
                     f"{found.labels[1]} {share(found, 1)}",
                     f"{first_head} {share(found, found.labels.index(first_head))}" if first_head else "—",
                     "yes" if first_head in top_previous else "no",
                     f"{name(int(weights.argmax()))} ({float(weights.max()):.3f})" if weights.size else "—"])
        print(" | ".join(rows[-1]), flush=True)
    body = (f"{args.model} on {args.texts} induction texts ({length} random tokens repeated once, as the Heads tab's "
            f"probe, seeds 0…{args.texts - 1}): the {args.heads} heads of largest induction score over them, each "
            "traced with *What feeds a head* on its keys (each text's 16 most attended pairs after key 0, weighted "
            "by attention; a share is a component's part of the relative score over the relative score, mean "
            "[95 % interval] over the texts), whether its largest single earlier head is one of the "
            f"{PREVIOUS_TOP} earlier heads of largest previous-token score over the same texts, and the earlier head "
            "its weights alone compose with most (Elhage et al.'s K-composition).\n\n"
            + md_table(["induction head (score)", "largest share", "second", "largest single head",
                        "a previous-token head?", "weights' strongest K-composition"], rows))
    if args.publish:
        publish("composition", body, doc=DOCS / "core.md")
    else:
        print(body)


if __name__ == "__main__":
    main()
