"""Plain attention against the online softmax (eq. 6.10, FlashAttention's order of work) for one head on random
q, k, v: softmax(q·kᵀ/√d_head)·v with the n × n scores and weights, against core/attention.py online_attention,
which reads the keys and values a block at a time with each row's running max, sum and output. The two run
alternately; medians (and ranges) of the repeats, their ratio, the largest difference between the outputs, and
the bytes each holds beyond q, k, v and the output (softmax_bytes, from the shapes).
Both are plain PyTorch here, so the online loop's time is its Python steps and smaller matmuls against the plain
version's passes over two n × n matrices, not a fused kernel's: the point it makes is memory; the time ratio is
measured, whichever way it falls on the machine.
Usage: python bench/variants/online_softmax.py [--tokens 8192] [--block 256] [--d-head 64] [--repeats 5]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for common
from common import median, row, spread, timed  # noqa: E402
from core.attention import online_attention, softmax_bytes  # noqa: E402


def plain_attention(q, k, v):
    return torch.softmax((q @ k.T) * q.shape[1] ** -0.5, dim=-1) @ v    # [n, n] scores and weights held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.tokens < 1 or not 1 <= args.block <= args.tokens or args.d_head < 1 or args.repeats < 1:
        raise SystemExit("--tokens, --d-head and --repeats must be ≥ 1 and --block between 1 and --tokens")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(args.tokens, args.d_head, generator=gen).to(args.device) for _ in range(3))
    print(f"one head, {args.tokens} tokens, d_head {args.d_head}, block {args.block}, {args.device}, float32, "
          f"threads {torch.get_num_threads()}, medians (ranges) of {args.repeats} alternating runs")
    plain_attention(q[:256], k[:256], v[:256]), online_attention(q[:256], k[:256], v[:256], 64)   # warm-up
    times = {"plain": [], "online": []}
    for _ in range(args.repeats):
        seconds, plain = timed(lambda: plain_attention(q, k, v), args.device)
        times["plain"].append(seconds)
        seconds, online = timed(lambda: online_attention(q, k, v, args.block), args.device)
        times["online"].append(seconds)
    counted = softmax_bytes(args.tokens, args.tokens, args.block)
    print(row("method", "seconds", "MiB held", widths=(34, 24, 12)))
    for name in ("plain", "online"):
        print(row(name, spread(times[name], 3),
                  f"{counted[name] / 2 ** 20:.2f}", widths=(34, 24, 12)))
    ratio = median(times["online"]) / median(times["plain"])
    print(f"online / plain time: {ratio:.2f}×; plain / online bytes: {counted['plain'] / counted['online']:.0f}×; "
          f"largest |online − plain| in the output: {float((online - plain).abs().max()):.1e}")


if __name__ == "__main__":
    main()
