"""The quadratic term made visible: one attention layer alone (scores QKᵀ/√d, softmax, the weighted sum of the
values: eq. 2.1) timed and its peak memory measured from 256 to 8,192 tokens, three ways, beside the whole model's
forward pass at the lengths it can be timed in a few seconds.

  dense    core.attention.attention(..., return_probs=True): the explicit path, every head's n × n scores and
           probabilities in float32 (what the app's maps are read from)
  online   core.attention.online_attention, head by head: the keys a block at a time with each row's running max,
           sum and output (eq. 6.10, FlashAttention's order of work in plain PyTorch), never the n × n matrix
  fused    core.attention.attention(...) without probabilities: torch's scaled_dot_product_attention, the core's
           fast path

q, k, v are random [1, heads, n, d_head] float32 (by default SmolLM2-135M's layer: 9 heads of 64), with no mask:
every query reads every key, all n² pairs (a causal mask would let the fused kernel skip about half of them).
The times of one length come from one fresh process: each method warmed up on 256 tokens, then timed --repeats
times, the three alternating, so that the machine's load falls on all three alike; medians and ranges. The peak is
what one call added to the resident memory of a fresh process of its own (the kernel's VmHWM, bench/common.py
PeakMemory), after a warm-up, --peak-repeats times. The exponent k of time ∝ n^k is fitted by least squares on log-log
over the top lengths (--fit-top), where the n² term dominates; the same for the peaks, a peak under core.machine.growth's
MEMORY_FLOOR (within the kernel's slack in counting resident pages) left out. core.machine.growth is the one fit; the JSON keeps
its results.

The whole model (--model, the real weights): one forward pass without a cache (the fused kernel in every layer,
causal), and alternating with it one layer's attention kernel on the model's own shapes, --repeats times per length
in one process after a warm-up; its exponent over all its lengths and between doublings, and the attention layers'
share of the pass (the kernel's median × the layers, over the pass's). The projections and the feed-forward network
grow as n, the attention kernels as n²: at short lengths the linear parts are most of the pass and its exponent is
near 1, rising with the attention layers' share.

With --publish the table goes to docs/benchmarks.md (section attention-cost) and the numbers to
assets/measured/attention_cost.json with its fitted exponents, which the cost lesson and the Inside tab read as they
are. --refit measures nothing: it fits the saved run's exponents again, writes them into the JSON and prints the table
(with --publish it writes the section again from the saved run).
Usage: OMP_NUM_THREADS=1 python bench/variants/attention_cost.py [--lengths 256 512 1024 2048 4096 8192] [--heads 9]
           [--d-head 64] [--block 256] [--repeats 5] [--peak-repeats 5] [--threads 1] [--fit-top 3]
           [--model smollm2-135m-instruct] [--model-lengths 256 512 1024 2048] [--publish]
       python bench/variants/attention_cost.py --refit [--publish]
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for common

from common import PeakMemory, figure, median, spread_figures as spread  # noqa: E402
from core.attention import attention, online_attention  # noqa: E402
from core.machine.growth import MEMORY_FLOOR, Growth, growth, memory_growth  # noqa: E402

METHODS = ("dense", "online", "fused")
LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
MODEL_LENGTHS = (256, 512, 1024, 2048)
ASSET = Path(__file__).resolve().parent.parent.parent / "assets" / "measured" / "attention_cost.json"
WARM = 256   # tokens of the warm-up call


def dense(q, k, v, block):
    return attention(q, k, v, return_probs=True)[0]          # [1, H, n, d]; probs [1, H, n, n] made and dropped


def online(q, k, v, block):
    return torch.stack([online_attention(q[0, h], k[0, h], v[0, h], block) for h in range(q.shape[1])])[None]


def fused(q, k, v, block):
    return attention(q, k, v)[0]


CALLS = {"dense": dense, "online": online, "fused": fused}


def inputs(tokens: int, heads: int, d_head: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, heads, tokens, d_head, generator=gen) for _ in range(3))


def measure(method: str, tokens: int, heads: int, d_head: int, block: int, threads: int) -> dict:
    """In a fresh process: the bytes one call of METHOD added to the peak resident memory, after a warm-up."""
    torch.set_num_threads(threads)
    q, k, v = inputs(tokens, heads, d_head)
    with torch.inference_mode():
        CALLS[method](q[:, :, :WARM], k[:, :, :WARM], v[:, :, :WARM], block)   # kernels loaded, buffers made
        with PeakMemory("cpu", required=True) as peak:
            out = CALLS[method](q, k, v, block)
    del out
    return {"added": peak.added}


def measure_times(tokens: int, heads: int, d_head: int, block: int, threads: int, repeats: int) -> dict:
    """In a fresh process: every method's call timed `repeats` times, the methods alternating, after a warm-up
    of each; {method: [seconds, one per repeat]}."""
    torch.set_num_threads(threads)
    q, k, v = inputs(tokens, heads, d_head)
    seconds = {m: [] for m in METHODS}
    with torch.inference_mode():
        for call in CALLS.values():
            call(q[:, :, :WARM], k[:, :, :WARM], v[:, :, :WARM], block)
        for _ in range(repeats):
            for method in METHODS:
                started = time.perf_counter()
                out = CALLS[method](q, k, v, block)
                seconds[method].append(time.perf_counter() - started)
                del out
    return seconds


def measure_model(name: str, tokens: int, repeats: int, threads: int) -> dict:
    """In a fresh process: the model's forward pass over `tokens` tokens (no cache, the fused kernel in every layer)
    and, alternating with it, one layer's attention kernel on the model's own shapes (causal, grouped-query, as the
    pass calls it: core.attention.attention), each timed `repeats` times after a warm-up."""
    from common import long_ids
    from core import load_model
    from core.store import ensure
    torch.set_num_threads(threads)
    model = load_model(ensure(name), device="cpu", dtype=torch.float32)
    ids = long_ids(model.tokenizer, tokens)
    cfg = model.config
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, cfg.n_heads, tokens, cfg.head_dim, generator=gen)
    k, v = (torch.randn(1, cfg.n_kv_heads, tokens, cfg.head_dim, generator=gen) for _ in range(2))
    seconds, kernel = [], []
    with torch.inference_mode():
        model(ids[:, :WARM], return_logits=False)
        attention(q[:, :, :WARM], k[:, :, :WARM], v[:, :, :WARM], is_causal=True)
        for _ in range(repeats):
            started = time.perf_counter()
            model(ids, return_logits=False)
            seconds.append(time.perf_counter() - started)
            started = time.perf_counter()
            attention(q, k, v, is_causal=True)
            kernel.append(time.perf_counter() - started)
    return {"seconds": seconds, "attention_seconds": kernel, "layers": cfg.n_layers, "heads": cfg.n_heads,
            "kv_heads": cfg.n_kv_heads, "d_head": cfg.head_dim}


def layer_runs(args) -> dict:
    """{n: {method: {"seconds": [one per repeat], "added": [one per peak repeat]}}}: the times from one fresh process
    per length, the methods alternating; each peak from a fresh process of its own."""
    runs = {}
    for n in args.lengths:
        times = child("measure_times", n, args.heads, args.d_head, args.block, args.threads, args.repeats)
        runs[n] = {m: {"seconds": times[m], "added": []} for m in METHODS}
        for _ in range(args.peak_repeats):
            for method in METHODS:
                runs[n][method]["added"].append(
                    child("measure", method, n, args.heads, args.d_head, args.block, args.threads)["added"])
        print(f"{n:>6} tokens: " + ", ".join(f"{m} {1e3 * median(r['seconds']):,.1f} ms, "
                                             f"{median(r['added']) / 2 ** 20:,.1f} MiB" for m, r in runs[n].items()),
              flush=True)
    return runs


def model_runs(args) -> dict:
    out = {}
    for n in args.model_lengths:
        out[n] = child("measure_model", args.model, n, args.repeats, args.threads)
        print(f"{n:>6} tokens: the whole model {1e3 * median(out[n]['seconds']):,.0f} ms", flush=True)
    return out


def child(function: str, *args) -> dict:
    """bench/variants/attention_cost.py's FUNCTION(*args) in a fresh Python process, read back from the line it
    prints."""
    import subprocess
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            f"from attention_cost import {function}; print('RESULT', json.dumps({function}(*{args!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{function}{args!r} failed:\n{done.stderr[-3000:]}")


def asset(args, runs: dict, model: dict) -> dict:
    from common import LOAD_AT_START, command, load_average, load_phrase, machine
    loads = [LOAD_AT_START, load_average()]
    return {"date": datetime.date.today().isoformat(), "machine": machine(), "command": command(),
            "threads": args.threads, "heads": args.heads, "d_head": args.d_head, "block": args.block,
            "repeats": args.repeats, "fit_top": args.fit_top, "mask": "none: every query reads every key",
            "method": "times: one process per length, the methods alternating after a warm-up on 256 tokens; peak: "
                      "what one call added to the peak RSS (the kernel's VmHWM) of a fresh process, after a warm-up",
            "peak_repeats": args.peak_repeats, "load": load_phrase(*loads),
            "load_average": loads,
            "layer": [{"n": n, **per} for n, per in runs.items()],
            "model": None if not model else {
                "name": args.model, "layers": next(iter(model.values()))["layers"],
                "heads": next(iter(model.values()))["heads"], "d_head": next(iter(model.values()))["d_head"],
                "kv_heads": next(iter(model.values()))["kv_heads"],
                "rows": [{"n": n, "seconds": r["seconds"], "attention_seconds": r["attention_seconds"]}
                         for n, r in model.items()]}}


def fits(data: dict) -> dict:
    """The exponents of a run's medians, by core.machine.growth (the one fit), as the JSON keeps them for the page to read:
    each method's time, fastest time and peak over the fit_top longest lengths (a peak under core.machine.growth's
    MEMORY_FLOOR left out), and the whole pass's time over all its lengths and between doublings."""
    rows = sorted(data["layer"], key=lambda r: r["n"])[-data["fit_top"]:]
    top = [r["n"] for r in rows]
    layer = {m: {"time": growth(top, [median(r[m]["seconds"]) for r in rows]).record(),
                 "fastest": growth(top, [min(r[m]["seconds"]) for r in rows]).record(),
                 "peak": memory_growth(top, [median(r[m]["added"]) for r in rows]).record()} for m in METHODS}
    model = None
    if data.get("model"):
        m_rows = sorted(data["model"]["rows"], key=lambda r: r["n"])
        lengths, seconds = [r["n"] for r in m_rows], [median(r["seconds"]) for r in m_rows]
        model = {"pass": growth(lengths, seconds).record(),
                 "steps": [growth(lengths[i:i + 2], seconds[i:i + 2]).record() for i in range(len(lengths) - 1)]}
    return {"method": "k in value ∝ n^k, log-log least squares (core.machine.growth) on the medians; 'fastest' on the "
                      "fastest run at each length", "layer": layer, "model": model}


def peak_words(peak: Growth) -> str:
    """'n^1.99', or what stands in for a fit that points under the floor left short."""
    floor = f"{peak.floor / 2 ** 20:g} MiB"
    if not peak.fitted:
        return f"– (a peak under {floor})"
    if peak.left_out:
        return (f"n^{peak.exponent:.2f} (over {', '.join(f'{n:,}' for n in peak.lengths)} tokens: at "
                f"{', '.join(f'{n:,}' for n in peak.left_out)} a peak under {floor}, left out)")
    return f"n^{peak.exponent:.2f}"


def table(data: dict) -> str:
    """The markdown: the layer's medians (ranges), the fitted exponents, the model beside it."""
    lengths = [r["n"] for r in data["layer"]]
    top = lengths[-data["fit_top"]:]
    lines = [f"One attention layer alone, {data['heads']} heads of d_head {data['d_head']}, float32, no mask (all n² "
             f"pairs), {data['threads']} thread(s); online in blocks of {data['block']} keys. Time of one call (ms), "
             f"median (range) of {data['repeats']} runs, the methods alternating in one process per length after a "
             f"warm-up; what one call added to the peak RSS (MiB, the kernel's VmHWM), each in a fresh process "
             f"after a warm-up, median (range) of {data['peak_repeats']}; the kernel updates a process's count of "
             f"resident pages in batches, so a figure under {MEMORY_FLOOR / 2 ** 20:g} MiB (even one below zero) is "
             "within its slack.", "",
             "| tokens n | dense: ms | online: ms | fused (SDPA): ms | dense: MiB | online: MiB | fused: MiB |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["layer"]:
        cells = [spread(r[m]["seconds"], 1e3) for m in METHODS] + [spread(r[m]["added"], 2 ** -20) for m in METHODS]
        lines.append(f"| {r['n']:,} | " + " | ".join(cells) + " |")
    fitted = data["fits"]["layer"]
    parts = []
    for m in METHODS:
        t, fastest, peak = (Growth.from_record(fitted[m][kind]) for kind in ("time", "fastest", "peak"))
        parts.append(f"{m}: time ∝ n^{t.exponent:.2f} (on the fastest runs n^{fastest.exponent:.2f}), "
                     f"peak ∝ {peak_words(peak)}")
    lines += ["", f"Fitted over {top[0]:,}–{top[-1]:,} tokens (log-log least squares on the medians): "
              + "; ".join(parts) + "."]
    model = data.get("model")
    if model:
        rows = model["rows"]
        lines += ["", f"The whole model, {model['name']} ({model['layers']} layers), one forward pass without a cache "
                      f"(the fused kernel, causal), and alternating with it one layer's attention kernel on the "
                      f"model's own shapes ({model['heads']} query and {model['kv_heads']} key/value heads, causal), "
                      f"median (range) of {data['repeats']} in one process per length; the attention layers' share: "
                      "the kernel's median × the layers, over the pass's.", "",
                  "| tokens n | whole pass: ms | one layer's attention kernel: ms | attention layers' share |",
                  "|---:|---:|---:|---:|"]
        shares = []
        for r in rows:
            share = median(r["attention_seconds"]) * model["layers"] / median(r["seconds"])
            shares.append(share)
            lines.append(f"| {r['n']:,} | {spread(r['seconds'], 1e3)} | {spread(r['attention_seconds'], 1e3)} | "
                         f"{share:.0%} |")
        lengths = [r["n"] for r in rows]
        whole = Growth.from_record(data["fits"]["model"]["pass"])
        steps = "; ".join(f"{g.lengths[0]:,}→{g.lengths[-1]:,}: n^{g.exponent:.2f}"
                          for g in map(Growth.from_record, data["fits"]["model"]["steps"]))
        lines += ["", f"The whole pass: time ∝ n^{whole.exponent:.2f} over {lengths[0]:,}–"
                      f"{lengths[-1]:,} tokens; between doublings {steps}. The projections and the feed-forward "
                      "network grow as n, the attention kernels as n²: the attention layers' share went from "
                      f"{shares[0]:.0%} to {shares[-1]:.0%} (a ratio of times taken alternately, so the machine's "
                      "load falls on both; the pass's own exponents carry that load's swings)."]
    return "\n".join(lines)


def refit(publish_again: bool) -> None:
    """The saved run's exponents fitted again from its rows and written into it; its table printed, and with
    publish_again its section written again under the saved run's own command, date and machine."""
    from common import DOC, publish
    data = json.loads(ASSET.read_text(encoding="utf-8"))
    data["fits"] = fits(data)
    ASSET.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote the exponents into {ASSET}")
    markdown = table(data)
    print(markdown)
    run = {"command": data["command"], "date": data["date"], "machine": data["machine"],
           "load_average": data.get("load_average", [None, None])}
    shown = re.search(r"<!-- bench:attention-cost start -->\n.*?\n\n(.*?)\n<!-- bench:attention-cost end -->",
                      DOC.read_text(encoding="utf-8"), re.S)
    if shown and shown.group(1) == markdown.strip():
        print(f"{DOC}'s section attention-cost already states these figures")
    elif publish_again:
        publish("attention-cost", markdown, run=run)
    else:
        print(f"{DOC}'s section attention-cost differs from the saved run's table: --refit --publish writes it again")


def main() -> None:
    from common import add_publish, publish
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per method and length, alternating")
    parser.add_argument("--peak-repeats", type=int, default=5,
                        help="fresh processes per method and length for the peak, the methods alternating")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fit-top", type=int, default=3, help="the exponent is fitted over this many longest lengths")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="'' leaves the whole model out")
    parser.add_argument("--model-lengths", type=int, nargs="+", default=list(MODEL_LENGTHS))
    add_publish(parser)
    parser.add_argument("--refit", action="store_true",
                        help=f"measure nothing: fit the exponents of the saved run ({ASSET.name}) again, write them "
                             "into it and print its table; with --publish write the section again from it")
    args = parser.parse_args()
    if args.refit:
        return refit(args.publish)
    if min(args.lengths) < WARM or min(args.heads, args.d_head, args.block, args.repeats, args.threads,
                                       args.peak_repeats) < 1 \
            or not 2 <= args.fit_top <= len(args.lengths):
        raise SystemExit(f"--lengths must be at least the warm-up's {WARM} tokens, --heads, --d-head, --block, --repeats "
                         "and --threads must be ≥ 1, and --fit-top between 2 and the number of lengths")
    args.lengths = sorted(set(args.lengths))
    print(f"one attention layer, {args.heads} heads × {args.d_head}, {args.threads} thread(s), {args.repeats} "
          f"alternating runs per method")
    runs = layer_runs(args)
    model = model_runs(args) if args.model else {}
    data = asset(args, runs, model)
    data["fits"] = fits(data)
    markdown = table(data)
    print(markdown)
    if args.publish:
        publish("attention-cost", markdown)
        ASSET.parent.mkdir(parents=True, exist_ok=True)
        ASSET.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {ASSET}")


if __name__ == "__main__":
    main()
