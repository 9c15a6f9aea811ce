"""Speed of the Heads tab's measurements (core/analysis/heads.py) on a real model, each beside the plain way to get the
same numbers, in one run: medians (and ranges) of alternating runs.

  atlas        pattern scores of every head on a text + the induction probe, against transformers'
               output_attentions=True scored with the same function
  ablation     one head's per-token loss change (two forward passes)
  sweep        every head ablated alone, batched one head per row, against one forward pass per head
               (timed on the first layer's heads and scaled to all of them)
  integrated   integrated gradients (32 steps, batched) and gradient x input, 128 tokens
With --publish the table goes to docs/benchmarks.md (section heads).
Usage: python bench/heads.py [--model smollm2-135m-instruct] [--tokens 512] [--sweep-tokens 128] [--repeats 5]
                             [--publish]
"""
from __future__ import annotations

import argparse

import torch

from common import add_publish, load_both, long_ids, md_table, median, publish, row, spread, timed
from core.analysis import heads


def theirs_atlas(theirs, ids, causal: bool):
    """The same scores from transformers' attention maps (every layer's n × n held at once)."""
    with torch.inference_mode():
        maps = theirs(ids, output_attentions=True).attentions
    return {i: heads.row_scores(a[0], ids[0], causal) for i, a in enumerate(maps)}


def one_head_at_a_time(model, ids, layer_heads):
    with torch.inference_mode():
        for layer, head in layer_heads:
            model(ids, ablate_heads=[(layer, head)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--sweep-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    add_publish(parser)
    args = parser.parse_args()
    ours, theirs, folder = load_both(args.model, "cpu", torch.float32, attn_implementation="eager")
    ids = long_ids(ours.tokenizer, args.tokens)
    short = ids[:, :args.sweep_tokens]
    cfg = ours.config
    print(f"model {args.model} ({folder}), cpu, float32, threads {torch.get_num_threads()}, "
          f"{args.tokens} tokens (sweep and gradients: {args.sweep_tokens}), medians (ranges) of {args.repeats} runs")
    heads.pattern_scores(ours, ids[:, :32]), heads.attribute(ours, short[:, :16], steps=2)  # warm-up

    times = {key: [] for key in ("atlas", "theirs atlas", "ablation", "sweep", "per head", "integrated")}
    first_layer = [(0, h) for h in range(cfg.n_heads)]
    for _ in range(args.repeats):
        times["atlas"].append(timed(lambda: (heads.pattern_scores(ours, ids), heads.induction(ours)), "cpu")[0])
        times["theirs atlas"].append(timed(lambda: theirs_atlas(theirs, ids, ours.config.causal), "cpu")[0])
        times["ablation"].append(timed(lambda: heads.ablate(ours, ids, [(5, 3)]), "cpu")[0])
        times["sweep"].append(timed(lambda: heads.ablation_sweep(ours, short), "cpu")[0])
        per_head = timed(lambda: one_head_at_a_time(ours, short, first_layer), "cpu")[0] / len(first_layer)
        times["per head"].append(per_head * cfg.n_layers * cfg.n_heads)
        times["integrated"].append(timed(lambda: heads.attribute(ours, short, steps=32), "cpu")[0])
    n_heads = cfg.n_layers * cfg.n_heads
    print(row("", "this core (s)", "plain way (s)", "ratio", widths=(44, 24, 24, 8)))
    atlas_ratio = median(times["theirs atlas"]) / median(times["atlas"])
    sweep_ratio = median(times["per head"]) / median(times["sweep"])
    print(row(f"atlas, {args.tokens} tokens (+ induction probe, ours)", spread(times["atlas"], 2),
              spread(times["theirs atlas"], 2), f"{atlas_ratio:.2f}x", widths=(44, 24, 24, 8)))
    print(row(f"one ablation, {args.tokens} tokens", spread(times["ablation"], 2), "", "", widths=(44, 24, 24, 8)))
    print(row(f"sweep, {n_heads} heads, {args.sweep_tokens} tokens", spread(times["sweep"], 1),
              spread(times["per head"], 1), f"{sweep_ratio:.2f}x", widths=(44, 24, 24, 8)))
    print(row(f"attribution with IG (32 steps), {args.sweep_tokens} tokens", spread(times["integrated"], 2), "", "",
              widths=(44, 24, 24, 8)))
    if args.publish:
        table = [[f"atlas of a {args.tokens}-token text, with the induction probe", f"{spread(times['atlas'], 2)} s",
                  f"transformers' `output_attentions` scored by the same function, without the probe: "
                  f"{spread(times['theirs atlas'], 2)} s", f"{atlas_ratio:.2f}× its speed"],
                 [f"one ablation with its per-token loss change, {args.tokens} tokens (two forward passes)",
                  f"{spread(times['ablation'], 2)} s", "", ""],
                 [f"the sweep of all {n_heads} heads, {args.sweep_tokens} tokens", f"{spread(times['sweep'], 1)} s",
                  f"one forward pass per head: {spread(times['per head'], 1)} s", f"{sweep_ratio:.2f}× faster"],
                 [f"integrated gradients, 32 steps, {args.sweep_tokens} tokens", f"{spread(times['integrated'], 2)} s",
                  "", ""]]
        publish("heads", f"{args.model}, cpu, float32, {torch.get_num_threads()} thread(s); median (range) of "
                         f"{args.repeats} runs alternating between the sides. The plain sweep's time is measured on "
                         f"the first layer's {cfg.n_heads} heads and scaled to all {n_heads}.\n\n" +
                md_table(["", "this core", "the plain way", "ratio"], table, ["---", "---:", "---:", "---:"]))
    print(f"SUMMARY heads: atlas {median(times['atlas']):.2f} s (target ≤ 5), {atlas_ratio:.2f}x transformers' "
          f"maps; ablation {median(times['ablation']):.2f} s (≤ 2); sweep {median(times['sweep']):.1f} s (≤ 90), "
          f"{sweep_ratio:.2f}x one pass per head; IG {median(times['integrated']):.2f} s (≤ 20)")


if __name__ == "__main__":
    main()
