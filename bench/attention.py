"""Time and peak memory of capturing every layer's and head's attention, this core against transformers'
output_attentions=True, at 512, 1024 and 2048 tokens, side by side in one run. Each measurement runs in a
fresh process so that peak memory (the kernel's high-water mark of the resident set, VmHWM, reset just before the
capture: bench/common.py PeakMemory) belongs to that capture alone.

This core's capture (core/analysis/capture.py): every layer × head pooled to ≤ 128² for the overview, full resolution
in float16 up to 512 tokens, above that one layer recomputed on demand (its time is printed too).
transformers: all L·H·n² probabilities in float32, as output_attentions returns them.
Times are medians (and ranges) of alternating runs, each in a fresh process. On a GPU, peak memory is
torch's peak allocation on the device. With --publish the table goes to docs/benchmarks.md (section attention).
Usage:
    python bench/attention.py [--model smollm2-135m-instruct] [--lengths 512 1024 2048] [--device cpu|cuda]
                              [--repeats 5] [--random-weights] [--publish]
"""
from __future__ import annotations

import argparse
import time

import torch


def measure(impl: str, model_name: str, length: int, device: str = "cpu", random_weights: bool = False) -> dict:
    """Run in a child process: load, warm up, then capture once; its peak memory by PeakMemory."""
    from common import PeakMemory, load_both, long_ids, sync
    from core.analysis.capture import capture
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    ours, theirs, _ = load_both(model_name, device, dtype, attn_implementation="eager", random_weights=random_weights)
    ids = long_ids(ours.tokenizer, length).to(device)
    if impl == "ours":
        del theirs
        capture(ours, ids[:, :64])  # warm-up
        run = lambda: capture(ours, ids)  # noqa: E731
    else:
        del ours
        with torch.inference_mode():
            theirs(ids[:, :64], output_attentions=True)
        run = lambda: theirs(ids, output_attentions=True).attentions  # noqa: E731
    with torch.inference_mode(), PeakMemory(device) as memory:
        sync(device)
        start = time.perf_counter()
        result = run()
        sync(device)
        seconds = time.perf_counter() - start
    if memory.peak is None:
        raise SystemExit("peak memory needs the kernel's resettable high-water mark (Linux's /proc/self/clear_refs)")
    out = {"seconds": seconds, "peak": memory.peak, "before": memory.before}
    if impl == "ours":
        start = time.perf_counter()
        result.head(ours.config.n_layers - 1, 0)
        sync(device)
        out["one_layer_on_demand"] = time.perf_counter() - start
    return out


def main() -> None:
    from common import add_publish, md_table, measured_in_child, median, publish
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--random-weights", action="store_true",
                        help="the model's shapes with seeded random weights (bench/configs/), for machines without it")
    add_publish(parser)
    args = parser.parse_args()
    gib = 1024 ** 3
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    where = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    print(f"model {args.model}{' (random weights)' if args.random_weights else ''}, {where}, {dtype}, "
          f"threads {torch.get_num_threads()}, medians (ranges) of {args.repeats} alternating runs")
    print(f"{'tokens':<8}{'ours s':>20}{'theirs s':>22}{'speed-up':>10}{'ours peak':>12}{'theirs peak':>13}"
          f"{'mem ratio':>11}{'one layer':>11}")
    summary, table = [], []
    for n in args.lengths:
        runs = {"ours": [], "theirs": []}
        for _ in range(args.repeats):
            for impl in runs:
                runs[impl].append(measured_in_child("attention", impl, args.model, n, args.device, args.random_weights))
        secs = {k: [r["seconds"] for r in v] for k, v in runs.items()}
        peaks = {k: median([r["peak"] for r in v]) for k, v in runs.items()}
        speed = median(secs["theirs"]) / median(secs["ours"])
        mem = peaks["ours"] / peaks["theirs"]
        one_layer = median([r["one_layer_on_demand"] for r in runs["ours"]])
        cells = [f"{median(v):.2f} ({min(v):.2f}–{max(v):.2f})" for v in (secs["ours"], secs["theirs"])]
        print(f"{n:<8}{cells[0]:>20}{cells[1]:>22}{speed:>9.2f}x{peaks['ours'] / gib:>10.2f}GB"
              f"{peaks['theirs'] / gib:>11.2f}GB{mem:>11.2f}{one_layer:>10.2f}s")
        summary.append(f"{n}: {speed:.2f}x faster, {mem:.2f} of the memory")
        peak_spread = {k: f"{median([r['peak'] for r in v]) / gib:.2f} ({min(r['peak'] for r in v) / gib:.2f}–"
                          f"{max(r['peak'] for r in v) / gib:.2f}) GiB" for k, v in runs.items()}
        table.append([f"{n:,}", f"{cells[0]} s, {peak_spread['ours']}", f"{cells[1]} s, {peak_spread['theirs']}",
                      f"{speed:.2f}× faster, {mem:.2f} of the memory", f"{one_layer:.2f} s"])
    if args.device.startswith("cuda"):
        print("peak = torch's highest allocation on the GPU during the capture, model weights included")
    else:
        print("peak = the process's highest resident memory during the capture (the kernel's VmHWM, reset just "
              "before it), model weights included")
    if args.publish:
        how = ("torch's highest allocation on the GPU during the capture" if args.device.startswith("cuda") else
               "the process's peak resident memory during the capture (the kernel's VmHWM, reset just before it)")
        publish("attention", f"{args.model}, {where}, {dtype}, {torch.get_num_threads()} thread(s): capturing every "
                             f"layer and head, time and peak memory, each capture in a fresh process, median (range) "
                             f"of {args.repeats} alternating runs. Peak: {how}, model weights included. Last column: "
                             "this core recomputing one layer at full resolution when asked (median).\n\n" +
                md_table(["tokens", "this core: time, peak", "transformers `output_attentions=True`: time, peak",
                          "ratio", "one layer on demand"], table, ["---:", "---:", "---:", "---", "---:"]))
    print(f"SUMMARY attention capture vs transformers output_attentions ({where}, {dtype}): " + "; ".join(summary) +
          " (target at 2048: ≥ 3x faster, ≤ 0.33 of the memory)")


if __name__ == "__main__":
    main()
