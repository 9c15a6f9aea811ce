"""What fixing glibc's mmap threshold (ui/memory.py fix_mmap_threshold, the app's ATTN_MALLOC_MMAP_KB) costs in
speed: head_scores_over on --texts windows of --tokens random tokens, timed after a warm-up in fresh processes,
glibc's moving threshold against one fixed at --mmap-kb KiB, alternating (each side first in every other run);
medians, ranges and the ratio. The memory it saves is bench/corpus/speed.py's memory part.
Usage: python bench/corpus/threshold.py [--model smollm2-135m-instruct] [--texts 48] [--tokens 64] [--mmap-kb 128]
                                   [--repeats 5] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))     # bench/, for common (which adds the root)

from common import median, spread  # noqa: E402

CHILD = """
import json, sys, time
import torch
from core import load_model
from core.corpus import summaries
from core.store import ensure
from ui import memory
model_name, texts, tokens, kb, threads = sys.argv[1], *map(int, sys.argv[2:])
torch.set_num_threads(threads)
if kb:
    assert memory.fix_mmap_threshold(kb)
model = load_model(ensure(model_name), device="cpu", dtype=torch.float32)
gen = torch.Generator().manual_seed(0)
ids = [torch.randint(3, model.config.vocab_size, (tokens,), generator=gen) for _ in range(texts)]
summaries.head_scores_over(model, ids[:8])  # warm-up
start = time.perf_counter()
summaries.head_scores_over(model, ids)
print("RESULT", json.dumps(time.perf_counter() - start))
"""


def timed_child(args, kb: int) -> float:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", CHILD, args.model, str(args.texts), str(args.tokens), str(kb),
                           str(args.threads)], cwd=root, capture_output=True, text=True, timeout=1800,
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
    parser.add_argument("--mmap-kb", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.repeats < 5 or args.mmap_kb < 1 or args.threads < 1:
        raise SystemExit("--repeats must be at least 5, --mmap-kb and --threads at least 1")
    times = {0: [], args.mmap_kb: []}
    for run in range(args.repeats):
        for kb in ((0, args.mmap_kb) if run % 2 == 0 else (args.mmap_kb, 0)):
            times[kb].append(timed_child(args, kb))
    print(f"head_scores_over, {args.texts} texts × {args.tokens} tokens, {args.model}, cpu float32, "
          f"{args.threads} thread(s), seconds: median (range) of {args.repeats} alternating fresh processes")
    for label, value in (("glibc's moving threshold", spread(times[0], 2)),
                         (f"fixed at {args.mmap_kb} KiB", spread(times[args.mmap_kb], 2)),
                         ("ratio (fixed / moving)", f"{median(times[args.mmap_kb]) / median(times[0]):.2f}x")):
        print(f"  {label + ':':<31}{value}")


if __name__ == "__main__":
    main()
