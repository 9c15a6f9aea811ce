"""Speed of the views inside one forward pass (core/analysis/anatomy.py) on a real model: medians (and ranges) of
repeated runs, each for a layer and head not asked for before, beside one plain forward pass of the same text.

  forward stages       every stage of one layer and head, from one recorded pass (target ≤ 1 s)
  score decomposition  one score of the last layer (the most parts: 2 per earlier layer) split into
                       query part × key part (target ≤ 0.5 s)
  q/k geometry         the head's queries and keys in the one q/k plane (core/plane.py)
With --publish the table goes to docs/benchmarks.md (section anatomy).
Usage: python bench/anatomy.py [--model smollm2-135m-instruct] [--repeats 5] [--tokens 32] [--publish]
"""
from __future__ import annotations

import argparse

import torch

from common import add_publish, long_ids, md_table, median, publish, row, spread, timed
from core import load_model
from core.analysis import anatomy, qk
from core.store import ensure

WIDTHS = (46, 22, 12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    add_publish(parser)
    args = parser.parse_args()
    folder = ensure(args.model)
    model = load_model(folder, device="cpu", dtype=torch.float32)
    stack, _ = model.attention_stack()
    n_layers, n_heads = len(stack.blocks), stack.cfg.n_heads
    ids = long_ids(model.tokenizer, args.tokens)
    n = ids.shape[1]
    print(f"model {args.model} ({folder}), cpu, float32, threads {torch.get_num_threads()}, {n} tokens, "
          f"medians (ranges) of {args.repeats} runs, a new layer and head each run")
    anatomy.forward_stages(model, ids, 0, 0)      # warm-up
    times = {key: [] for key in ("plain", "stages", "decomposition", "geometry")}
    for run in range(args.repeats):
        layer, head = (run * 7 + 3) % n_layers, (run * 5 + 1) % n_heads
        query, key = n - 1 - run % n, (run * 3) % n
        with torch.inference_mode():
            times["plain"].append(timed(lambda: model(ids), "cpu")[0])
        times["stages"].append(timed(lambda: anatomy.forward_stages(model, ids, layer, head), "cpu")[0])
        times["decomposition"].append(timed(lambda: qk.score_decomposition(model, ids, n_layers - 1, head,
                                                                           query, key), "cpu")[0])
        times["geometry"].append(timed(lambda: anatomy.qk_geometry(model, ids, layer, head), "cpu")[0])
    plain = median(times["plain"])
    labels = {"plain": "one plain forward pass", "stages": "forward_stages, one layer and head",
              "decomposition": f"score_decomposition, layer {n_layers - 1}", "geometry": "qk_geometry"}
    print(row("", "time (s)", "× one pass", widths=WIDTHS))
    for key, label in labels.items():
        print(row(label, spread(times[key], 3), f"{median(times[key]) / plain:.1f}x", widths=WIDTHS))
    if args.publish:
        publish("anatomy", f"{args.model}, float32, {n} tokens, a new layer and head each run; seconds, median "
                           f"(range) of {args.repeats} runs, each view beside one plain forward pass of the same "
                           "text in the same run.\n\n" +
                md_table(["view", "time (s)", "× one plain pass"],
                         [[label if key == "plain" else f"`{label.split(',')[0]}`{label[len(label.split(',')[0]):]}",
                           spread(times[key], 3), f"{median(times[key]) / plain:.2f}×"]
                          for key, label in labels.items()], ["---", "---:", "---:"]))
    print(f"SUMMARY anatomy: forward_stages {median(times['stages']):.3f} s (target ≤ 1), score_decomposition "
          f"{median(times['decomposition']):.3f} s (≤ 0.5), qk_geometry {median(times['geometry']):.3f} s, "
          f"on {n} tokens of {args.model}")


if __name__ == "__main__":
    main()
