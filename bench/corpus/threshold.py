"""What fixing glibc's mmap threshold (core/machine/allocator.py fix_mmap_threshold, the app's ATTN_MALLOC_MMAP_KB) costs in
speed. The setting is process-wide, so every kind of work the app does is timed, not only corpus jobs:
- heads: head_scores_over on --texts windows of --tokens random tokens (a corpus job);
- generate: greedy generation of --new tokens after a --tokens-token prompt, with the KV cache (the Generate tab);
- attention: one forward of --long tokens keeping every layer's probabilities (the Attention and Heads tabs);
- patch: patch_sweep of the head site on one IOI pair (the Patching tab);
- train: --steps steps of the Lab's default run (reverse, Marian), evaluation included (the Lab tab).
Each is timed after a warm-up, in fresh processes, glibc's moving threshold against each --mmap-kb fixed value, the
order rotating from run to run; medians, ranges and each fixed value's ratio to the moving threshold. The memory
the setting saves is bench/corpus/speed.py's memory part. With --publish the table goes to docs/benchmarks.md
(section corpus-threshold).
Usage: python bench/corpus/threshold.py [--model smollm2-135m-instruct] [--texts 48] [--tokens 64] [--new 64]
                                   [--long 512] [--steps 200] [--mmap-kb 32768 [128 …]]
                                   [--work heads generate attention patch train]
                                   [--repeats 5] [--threads 1] [--publish]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))     # bench/, for common (which adds the root)

from common import add_publish, md_table, median, publish, spread  # noqa: E402

WORK = ("heads", "generate", "attention", "patch", "train")
CHILD = """
import json, sys, time
import torch
from core import load_model
from core.analysis.patching import patch_sweep
from core.analysis import over as overs
from core.corpus import texts
from core.generate import generate
from core.store import ensure
from core.lab.train import LabConfig, train
from core.machine import allocator
model_name, work = sys.argv[1], sys.argv[2].split(",")
n_texts, tokens, new, long, steps, kb, threads = map(int, sys.argv[3:])
torch.set_num_threads(threads)
if kb:
    assert allocator.fix_mmap_threshold(kb)
model = load_model(ensure(model_name), device="cpu", dtype=torch.float32)
gen = torch.Generator().manual_seed(0)
ids = [torch.randint(3, model.config.vocab_size, (tokens,), generator=gen) for _ in range(n_texts)]
long_ids = torch.randint(3, model.config.vocab_size, (1, long), generator=gen)
pair = texts.ioi_pairs(model.tokenizer, 1)[0]
jobs = {
    "heads": (lambda: overs.head_scores_over(model, ids[:8]), lambda: overs.head_scores_over(model, ids)),
    "generate": (lambda: generate(model, ids[0][None], 8), lambda: generate(model, ids[0][None], new)),
    "attention": (lambda: model(long_ids[:, :64], capture_attention=True),
                  lambda: model(long_ids, capture_attention=True)),
    "patch": (lambda: None, lambda: patch_sweep(model, pair.clean[None], pair.corrupted[None], pair.answer,
                                                pair.foil, "z")),
    "train": (lambda: None, lambda: [None for _ in train(LabConfig(task="reverse", steps=steps, eval_every=steps,
                                                                   seed=0))]),
}
seconds = {}
for name in work:
    warm, timed = jobs[name]
    with torch.inference_mode(name != "train"):   # training needs autograd
        warm()
        start = time.perf_counter()
        timed()
        seconds[name] = time.perf_counter() - start
print("RESULT", json.dumps(seconds))
"""


def timed_child(args, kb: int) -> dict[str, float]:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", CHILD, args.model, ",".join(args.work),
                           *map(str, (args.texts, args.tokens, args.new, args.long, args.steps, kb, args.threads))],
                          cwd=root, capture_output=True, text=True, timeout=1800,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"})
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"the child (mmap threshold {kb or 'moving'}) failed:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--texts", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--long", type=int, default=512)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--mmap-kb", type=int, nargs="+", default=[32768])
    parser.add_argument("--work", nargs="+", choices=WORK, default=list(WORK))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    add_publish(parser)
    args = parser.parse_args()
    if args.repeats < 5 or min(args.mmap_kb) < 1 or args.threads < 1:
        raise SystemExit("--repeats must be at least 5, each --mmap-kb and --threads at least 1")
    settings = [0, *dict.fromkeys(args.mmap_kb)]
    times = {kb: [] for kb in settings}
    for run in range(args.repeats):
        for kb in settings[run % len(settings):] + settings[:run % len(settings)]:  # each setting first in turn
            times[kb].append(timed_child(args, kb))
    print(f"{args.model}, cpu float32, {args.threads} thread(s), seconds: median (range) of {args.repeats} "
          f"fresh processes per setting, the order rotating")
    described = {"heads": f"head_scores_over, {args.texts} texts × {args.tokens} tokens",
                 "generate": f"generate, {args.new} new tokens after {args.tokens}",
                 "attention": f"forward keeping probabilities, {args.long} tokens",
                 "patch": "patch_sweep, head site, one IOI pair",
                 "train": f"the Lab's default run (reverse, Marian), {args.steps} steps"}
    table = []
    for name in args.work:
        print(f"  {described[name]}")
        moving = [t[name] for t in times[0]]
        print(f"    {'glibc moving threshold:':<28}{spread(moving, 2)}")
        cells = [described[name], spread(moving, 2)]
        for kb in settings[1:]:
            fixed = [t[name] for t in times[kb]]
            print(f"    {f'fixed at {kb} KiB:':<28}{spread(fixed, 2)}   {median(fixed) / median(moving):.2f}x")
            cells.append(f"{spread(fixed, 2)}, {median(fixed) / median(moving):.2f}×")
        table.append(cells)
    if args.publish:
        publish("corpus-threshold", f"{args.model}, cpu, float32, {args.threads} thread(s); seconds, median (range) "
                                    f"of {args.repeats} fresh processes per setting, the order rotating; each fixed "
                                    "threshold's ratio to glibc's moving one.\n\n" +
                md_table(["work", "glibc's moving threshold", *(f"fixed at {kb:,} KiB" for kb in settings[1:])], table,
                         ["---", *["---:"] * len(settings)]))


if __name__ == "__main__":
    main()
