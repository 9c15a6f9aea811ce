"""Speed of the query/key attribution of a flow graph's attention edges (core/analysis/qk.py graph_attribution) on
a real model, beside one forward pass with the records it reads, in one run: medians (and ranges) of alternating
runs, and their ratio.

  attribution   every kept attention edge of the flow graph of the last token of a 64-token text: each of its
                heads' relative score split into query-side and key-side components, every earlier head and MLP
                (one recorded pass of its own, then the parts)
  forward       one forward pass recording what the attribution reads (q, k, z, the attention pattern, the
                residual stream's parts), no logits
The flow graph itself is built once, outside the timings (bench/patching.py times it).
With --publish the table goes to docs/benchmarks.md (section qk).
Usage: python bench/analysis/qk.py [--model smollm2-135m-instruct] [--repeats 5] [--tokens 64] [--publish]
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
from core.store import ensure  # noqa: E402

WIDTHS = (46, 22, 22, 9)


def recorded_forward(model, ids) -> None:
    with torch.inference_mode():
        model(ids, record=set(qk.QK_RECORDS), return_logits=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    add_publish(parser)
    args = parser.parse_args()
    folder = ensure(args.model)
    model = load_model(folder, device="cpu", dtype=torch.float32)
    ids = long_ids(model.tokenizer, args.tokens)
    graph = patching.flow_graph(model, ids)
    edges = qk.attention_edges(graph)
    heads = sum(len(e.heads) for e in edges)
    print(f"model {args.model} ({folder}), cpu, float32, threads {torch.get_num_threads()}, flow graph of the last "
          f"token of {args.tokens} tokens: {len(edges)} kept attention edges, {heads} (edge, head) pairs; medians "
          f"(ranges) of {args.repeats} alternating runs")
    recorded_forward(model, ids)                                                       # warm-up
    qk.graph_attribution(model, ids, graph)
    times = {"attribution": [], "forward": []}
    for _ in range(args.repeats):
        times["forward"].append(timed(lambda: recorded_forward(model, ids), "cpu")[0])
        times["attribution"].append(timed(lambda: qk.graph_attribution(model, ids, graph), "cpu")[0])
    ratio = median(times["attribution"]) / median(times["forward"])
    print(row("", "attribution (s)", "forward (s)", "ratio", widths=WIDTHS))
    print(row(f"{len(edges)} edges, {heads} heads", spread(times["attribution"], 3), spread(times["forward"], 3),
              f"{ratio:.1f}x", widths=WIDTHS))
    if args.publish:
        table = [[f"every kept attention edge ({len(edges)} edges, {heads} edge heads)",
                  f"{spread(times['attribution'], 3)} s", f"{spread(times['forward'], 3)} s", f"{ratio:.1f}×"]]
        publish("qk", f"{args.model}, cpu, float32, {torch.get_num_threads()} thread(s), the flow graph of the last "
                      f"token of a {args.tokens}-token text; median (range) of {args.repeats} runs alternating "
                      "between the sides. The forward pass records what the attribution reads.\n\n" +
                md_table(["", "attribution", "one recorded forward pass", "ratio"], table,
                         ["---", "---:", "---:", "---:"]))
    print(f"SUMMARY qk: attribution of {len(edges)} edges {median(times['attribution']):.3f} s, {ratio:.1f}x one "
          f"recorded forward pass (target ≤ 3x)")


if __name__ == "__main__":
    main()
