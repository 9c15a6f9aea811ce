"""The peak memory of one head's attention softmax(q·kᵀ/√d_head)·v on random q, k, v [n, d_head], float32, three
ways, each call in a fresh process: plain (the n × n scores and weights), online (core/attention.py
online_attention, eq. 6.10: the keys a block at a time with each row's running max, sum and output, FlashAttention's
order of work in plain PyTorch) and fused (torch's scaled_dot_product_attention, what the core's fast path calls).

Peak = the kernel's high-water mark of the process's resident memory (VmHWM), reset after q, k, v are made and every
method has been warmed up on 256 tokens, minus the RSS at that moment: what the call added, its output [n, d_head]
included (bench/common.py PeakMemory). The methods alternate, one fresh process per call; medians and ranges of the
repeats. Every call runs with glibc's mmap threshold fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_, glibc's own starting
value), so that a freed block of 128 KiB or more is handed back to the kernel at once and the peak is the tensors';
the online method runs again with glibc's moving threshold, as a process gets it by default: a freed block then
stays in the heap up to the trim threshold (twice the largest block freed so far, at most 64 MiB), which the peak
shows too. Beside them, core.attention.softmax_bytes: the formula, from the shapes, of what plain and online hold
beyond q, k, v and the output; its plain / online ratio against the measured one.
With --publish: the table goes to docs/benchmarks.md (publish in bench/common.py) and the numbers to
assets/measured/online_softmax.json, which the Inside tab and the cost lesson read.
Usage: OMP_NUM_THREADS=1 python bench/variants/online_softmax.py [--lengths 512 1024 2048 4096 8192]
           [--block 256] [--d-head 64] [--repeats 5] [--threads 1] [--publish]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for common
from common import PeakMemory, measured_in_child, median  # noqa: E402
from core.attention import online_attention, softmax_bytes  # noqa: E402

METHODS = ("plain", "online", "fused")
LENGTHS = (512, 1024, 2048, 4096, 8192)
ASSET = Path(__file__).resolve().parent.parent.parent / "assets" / "measured" / "online_softmax.json"


def plain_attention(q, k, v, block=None):
    return torch.softmax((q @ k.T) * q.shape[1] ** -0.5, dim=-1) @ v    # [n, n] scores and weights held


def online(q, k, v, block):
    return online_attention(q, k, v, block)


def fused_attention(q, k, v, block=None):
    # [batch 1, heads 1, n, d_head], the core's fast path's layout: CPU's fused kernel wants the 4-d form
    return F.scaled_dot_product_attention(q[None, None], k[None, None], v[None, None])[0, 0]


CALLS = {"plain": plain_attention, "online": online, "fused": fused_attention}


def measure(method: str, tokens: int, block: int, d_head: int, threads: int) -> dict:
    """In a fresh process: the bytes one call of METHOD adds to the resident memory at its peak (None where the
    kernel cannot reset its high-water mark)."""
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(tokens, d_head, generator=gen) for _ in range(3))
    for call in CALLS.values():                    # every kernel loaded and every first-call buffer made
        call(q[:256], k[:256], v[:256], min(block, 256))
    with torch.inference_mode(), PeakMemory("cpu") as peak:
        out = CALLS[method](q, k, v, block)
    del out
    return {"added": peak.added, "how": peak.how}


FIXED_MMAP = 128 * 1024          # glibc's starting mmap threshold, in bytes, fixed for the main measurement


def allocator_env(fixed: bool) -> dict:
    """This environment without any malloc setting, and with glibc's mmap threshold fixed at FIXED_MMAP when asked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "ATTN_MALLOC_", "GLIBC_TUNABLES"))}
    return {**env, "MALLOC_MMAP_THRESHOLD_": str(FIXED_MMAP)} if fixed else env


def measured(lengths, block: int, d_head: int, repeats: int, threads: int, methods=METHODS,
             moving: tuple[str, ...] = ("online",)) -> dict:
    """{n: {column: [added bytes, one per repeat]}}: each method with the mmap threshold fixed, and the MOVING
    ones again as "METHOD, moving threshold"; the columns alternate, each call in a fresh process."""
    columns = [(m, True) for m in methods] + [(m, False) for m in moving]
    runs = {n: {column_name(m, fixed): [] for m, fixed in columns} for n in lengths}
    for n in lengths:
        for _ in range(repeats):
            for method, fixed in columns:
                added = measured_in_child("variants.online_softmax", method, n, block, d_head, threads,
                                          env=allocator_env(fixed))["added"]
                if added is None:
                    raise SystemExit("this kernel cannot reset its peak RSS (/proc/self/clear_refs); "
                                     "the measurement needs Linux")
                runs[n][column_name(method, fixed)].append(added)
    return runs


def column_name(method: str, fixed: bool) -> str:
    return method if fixed else f"{method}, moving threshold"


def mib(n_bytes: float) -> str:
    return f"{n_bytes / 2 ** 20:,.1f}"


def spread_mib(values) -> str:
    return f"{mib(median(values))} ({mib(min(values))}–{mib(max(values))})"


def table(runs: dict, block: int, d_head: int, repeats: int, threads: int) -> str:
    """The markdown table: measured medians (ranges) in MiB, the ratios, and the formula beside them."""
    lines = [f"One head, q, k, v [n, {d_head}] float32, block {block}, {threads} thread(s). **Measured**: what one "
             "call adds to the process's peak RSS (the kernel's VmHWM, reset after set-up and warm-up), its output "
             f"[n, {d_head}] included, each call in a fresh process, median (range) of {repeats} alternating runs, "
             f"MiB; glibc's mmap threshold fixed at {FIXED_MMAP // 1024} KiB, and for the online method also as "
             "glibc moves it by default (freed blocks kept up to its trim threshold). **Formula**: "
             "`core.attention.softmax_bytes`, the tensors each method holds at once beyond q, k, v and the output, "
             "counted from the shapes (MiB).",
             "",
             "| tokens n | plain | online | fused (SDPA) | online, moving threshold | plain / online | plain / fused | "
             "formula plain | formula online | formula plain / online |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, per in runs.items():
        med = {m: median(v) for m, v in per.items()}
        counted = softmax_bytes(n, n, block, d_head)
        moving = per.get(column_name("online", False))
        lines.append(f"| {n:,} | {spread_mib(per['plain'])} | {spread_mib(per['online'])} | "
                     f"{spread_mib(per['fused'])} | {spread_mib(moving) if moving else '–'} | "
                     f"{med['plain'] / med['online']:.1f}× | {med['plain'] / med['fused']:.0f}× | "
                     f"{mib(counted['plain'])} | {mib(counted['online'])} | "
                     f"{counted['plain'] / counted['online']:.1f}× |")
    return "\n".join(lines)


def asset(runs: dict, block: int, d_head: int, repeats: int, threads: int) -> dict:
    """What the app shows without measuring: the medians and ranges in bytes, with the date, machine and command."""
    from common import command, machine
    return {"date": datetime.date.today().isoformat(), "machine": machine(), "command": command(),
            "method": "peak RSS (the kernel's VmHWM, reset after set-up and warm-up) added by one call, its output "
                      "included, each call in a fresh process",
            "allocator": f"glibc's mmap threshold fixed at {FIXED_MMAP // 1024} KiB; 'online, moving threshold': "
                         "glibc's default",
            "block": block, "d_head": d_head, "dtype": "float32", "threads": threads, "repeats": repeats,
            "rows": [{"n": n, **{m: {"median": median(v), "min": min(v), "max": max(v), "values": v}
                                 for m, v in per.items()}}
                     for n, per in runs.items()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--publish", action="store_true",
                        help=f"write the table to docs/benchmarks.md and the numbers to {ASSET.name}")
    args = parser.parse_args()
    if min(args.lengths) < 256 or args.d_head < 1 or args.repeats < 1 or args.threads < 1 or args.block < 1:
        raise SystemExit("--lengths must be ≥ 256 (the warm-up's size); --block, --d-head, --repeats and --threads ≥ 1")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(512, args.d_head, generator=gen) for _ in range(3))
    difference = float((online(q, k, v, args.block) - plain_attention(q, k, v)).abs().max())
    runs = measured(args.lengths, args.block, args.d_head, args.repeats, args.threads)
    markdown = table(runs, args.block, args.d_head, args.repeats, args.threads)
    print(markdown)
    print(f"largest |online − plain| in the output at 512 tokens: {difference:.1e}")
    if args.publish:
        from common import publish
        publish("online-softmax", markdown)
        ASSET.parent.mkdir(parents=True, exist_ok=True)
        ASSET.write_text(json.dumps(asset(runs, args.block, args.d_head, args.repeats, args.threads), indent=1)
                         + "\n", encoding="utf-8")
        print(f"wrote {ASSET}")


if __name__ == "__main__":
    main()
