"""Speed of core/analysis/qk.py on a real model, each beside its reference in one run: medians (and ranges) of
alternating runs, and their ratio.

  attribution   graph_attribution: every kept attention edge of the flow graph of the last token of a 64-token
                text, each of its heads' relative score split into query-side and key-side components, every
                earlier head and MLP (one recorded pass of its own, then the parts); the flow graph itself is built
                once, outside the timings (bench/patching.py times it)
    forward     one forward pass recording what the attribution reads (q, k, z, the attention pattern, the
                residual stream's parts), no logits
  composition   composition_over: what feeds the keys of L18 H6 (the strongest induction head, docs/core.md) over
                48 induction texts (32 random tokens repeated once, after BOS: 65 tokens), one text at a time
    forward     one plain batched forward pass of the same 48 texts, with logits: the tokens per second a
                composition run is compared with
With --publish the table goes to docs/benchmarks.md (section qk).
Usage: python bench/analysis/qk.py [--model smollm2-135m-instruct] [--repeats 5] [--tokens 64] [--texts 48]
                                   [--publish]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for common

from common import add_publish, long_ids, md_table, median, publish, row, spread, timed  # noqa: E402
from core import load_model  # noqa: E402
from core.analysis import patching, qk  # noqa: E402
from core.corpus.texts import induction_texts  # noqa: E402
from core.store import ensure  # noqa: E402

WIDTHS = (60, 22, 22, 24)
LAYER, HEAD = 18, 6   # SmolLM2's strongest induction head (scripts/composition_finding.py)


def recorded_forward(model, ids) -> None:
    with torch.inference_mode():
        model(ids, record=set(qk.QK_RECORDS), return_logits=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--texts", type=int, default=48)
    add_publish(parser)
    args = parser.parse_args()
    folder = ensure(args.model)
    model = load_model(folder, device="cpu", dtype=torch.float32)
    ids = long_ids(model.tokenizer, args.tokens)
    graph = patching.flow_graph(model, ids)
    edges = qk.attention_edges(graph)
    heads = sum(len(e.heads) for e in edges)
    print(f"model {args.model} ({folder}), cpu, float32, threads {torch.get_num_threads()}, flow graph of the last "
          f"token of {args.tokens} tokens: {len(edges)} kept attention edges, {heads} (edge, head) pairs; "
          f"{args.texts} induction texts; medians (ranges) of {args.repeats} alternating runs")
    texts = induction_texts(model.tokenizer, args.texts, 32, bos=model.config.bos_token_id)
    batch = torch.stack(texts)
    layer, head = (LAYER, HEAD) if model.config.n_layers > LAYER else (model.config.n_layers - 1, 0)
    runs = {"attribution": lambda: qk.graph_attribution(model, ids, graph),
            "recorded forward": lambda: recorded_forward(model, ids),
            "composition": lambda: qk.composition_over(model, texts, layer, head, "key"),
            "batched forward": lambda: plain_forward(model, batch)}
    for run in runs.values():                                                           # warm-up
        run()
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            times[name].append(timed(run, "cpu")[0])
    m = {name: median(t) for name, t in times.items()}
    ratio = m["attribution"] / m["recorded forward"]
    share = m["batched forward"] / m["composition"]         # same tokens: the composition's share of the throughput
    tokens = batch.numel()
    rows = [[f"graph_attribution: {len(edges)} edges, {heads} edge heads", spread(times["attribution"], 3),
             spread(times["recorded forward"], 3), f"{ratio:.1f}×", "≤ 3×"],
            [f"composition_over L{layer} H{head}: {len(texts)} texts, {tokens} tokens", spread(times["composition"], 2),
             spread(times["batched forward"], 2), f"{share:.2f} of its tokens/s", "≥ 0.3"]]
    print(row("", "measured (s)", "reference (s)", "ratio", widths=WIDTHS))
    for r in rows:
        print(row(*r[:4], widths=WIDTHS))
    if args.publish:
        publish("qk", f"{args.model}, cpu, float32, {torch.get_num_threads()} thread(s); median (range) of "
                      f"{args.repeats} runs alternating between the four. The attribution's reference is one forward "
                      f"pass of the {args.tokens}-token text recording what it reads; the composition's is one plain "
                      f"batched forward pass (with logits) of the same {len(texts)} texts, and the ratio is the "
                      "composition's tokens per second over the forward's.\n\n" +
                md_table(["", "measured", "reference", "ratio", "target"], [[r[0], f"{r[1]} s", f"{r[2]} s", *r[3:]]
                                                                           for r in rows],
                         ["---", "---:", "---:", "---:", "---:"]))
    print(f"SUMMARY qk: attribution of {len(edges)} edges {m['attribution']:.3f} s, {ratio:.1f}x one recorded forward "
          f"pass (target ≤ 3x); composition_over at {share:.2f} of a batched forward's tokens/s (target ≥ 0.3)")


def plain_forward(model, batch) -> None:
    with torch.inference_mode():
        model(batch)

if __name__ == "__main__":
    main()
