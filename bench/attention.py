"""Time and peak memory of capturing every layer's and head's attention, this core against transformers'
output_attentions=True, at 512, 1024 and 2048 tokens, side by side in one run. Each measurement runs in a
fresh process so that peak memory (resident set size, sampled every 5 ms) belongs to that capture alone.

This core's capture (core/capture.py): every layer × head pooled to ≤ 128² for the overview, full resolution
in float16 up to 512 tokens, above that one layer recomputed on demand (its time is printed too).
transformers: all L·H·n² probabilities in float32, as output_attentions returns them.
Usage: python bench/attention.py [--model smollm2-135m-instruct] [--lengths 512 1024 2048]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

import psutil
import torch


class PeakRSS:
    """Samples this process's resident memory in a thread; .peak is the highest seen, in bytes."""

    def __init__(self, interval: float = 0.005):
        self.interval, self.peak, self.running = interval, 0, False
        self.process = psutil.Process()

    def __enter__(self):
        self.running, self.peak = True, self.process.memory_info().rss
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()
        return self

    def sample(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def measure(impl: str, model_name: str, length: int) -> dict:
    """Run in a child process: load, warm up, then capture once while sampling memory."""
    from common import load_both, long_ids
    from core.capture import capture
    ours, theirs, _ = load_both(model_name, "cpu", torch.float32, attn_implementation="eager")
    ids = long_ids(ours.tokenizer, length)
    if impl == "ours":
        del theirs
        capture(ours, ids[:, :64])  # warm-up
        run = lambda: capture(ours, ids)  # noqa: E731
    else:
        del ours
        with torch.inference_mode():
            theirs(ids[:, :64], output_attentions=True)
        run = lambda: theirs(ids, output_attentions=True).attentions  # noqa: E731
    import gc
    gc.collect()
    before = psutil.Process().memory_info().rss
    with torch.inference_mode(), PeakRSS() as rss:
        start = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - start
    out = {"seconds": seconds, "peak": rss.peak, "before": before}
    if impl == "ours":
        start = time.perf_counter()
        result.head(ours.config.n_layers - 1, 0)
        out["one_layer_on_demand"] = time.perf_counter() - start
    return out


def child(impl: str, model_name: str, length: int) -> dict:
    code = (f"import json, sys; sys.path.insert(0, 'bench'); from attention import measure; "
            f"print('RESULT', json.dumps(measure({impl!r}, {model_name!r}, {length})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{impl} at {length} tokens failed:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    args = parser.parse_args()
    gib = 1024 ** 3
    print(f"model {args.model}, cpu, float32, threads {torch.get_num_threads()}")
    print(f"{'tokens':<8}{'ours s':>9}{'theirs s':>10}{'speed-up':>10}{'ours peak':>12}{'theirs peak':>13}{'mem ratio':>11}"
          f"{'one layer':>11}")
    summary = []
    for n in args.lengths:
        ours, theirs = child("ours", args.model, n), child("theirs", args.model, n)
        speed = theirs["seconds"] / ours["seconds"]
        mem = ours["peak"] / theirs["peak"]
        print(f"{n:<8}{ours['seconds']:>9.2f}{theirs['seconds']:>10.2f}{speed:>9.2f}x{ours['peak'] / gib:>10.2f}GB"
              f"{theirs['peak'] / gib:>11.2f}GB{mem:>11.2f}{ours['one_layer_on_demand']:>10.2f}s")
        summary.append(f"{n}: {speed:.2f}x faster, {mem:.2f} of the memory")
    print("peak = the process's highest resident memory during the capture, model weights included")
    print("SUMMARY attention capture vs transformers output_attentions: " + "; ".join(summary) +
          " (target at 2048: ≥ 3x faster, ≤ 0.33 of the memory)")


if __name__ == "__main__":
    main()
