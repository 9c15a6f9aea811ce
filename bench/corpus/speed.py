"""Speed and memory of the analyses over a corpus (core/analysis/over.py) on a real model, each beside the plain
way, in one run: medians (and ranges) of alternating runs (each side first in every other run), and the ratios.

  heads    head_scores_over on --texts texts × --tokens tokens (windows of the example text), against a plain
           batched forward pass (the stack only, no logits) of the same padded batches: token throughput ratio
  patch    patch_over at the head site (z, every layer × head) over --pairs IOI pairs (ioi_pairs, seed 0),
           against looping the single-pair patch_sweep over the same pairs
  lens     where transformer-lens is installed (its own environment: requirements-bench.txt), the same head
           scores from the patterns of its run_with_cache looped over the same texts one at a time, and run on
           all of them in one batch (they are of one length), checked against head_scores_over's per-item
           values (bench/corpus/lens.py); skipped, saying why, where it is not installed
  memory   peak RSS while the job runs (the kernel's high-water mark, reset just before it: common.PeakMemory)
           of a fresh process that loads the model and runs head_scores_over on --memory-texts random texts of
           --tokens tokens, against one on a tenth as many; the difference is what the corpus adds. Twice:
           with glibc's allocator as it comes, and with its mmap threshold fixed at
           --mmap-kb KiB (core/machine/allocator.py fix_mmap_threshold, the app's ATTN_MALLOC_MMAP_KB)
--parts picks which of the four to run (all by default); --threads sets torch's thread count (on a shared
machine 1 keeps the two sides' timings apart from the other jobs' load).
With --publish each part run writes its section of docs/benchmarks.md (corpus-heads, corpus-patch, corpus-lens,
corpus-memory; publish in bench/common.py).
--quick shrinks every size (12 texts, 2 pairs, 100 vs 10 texts, 32 tokens, batches of 320 tokens, so that the
smaller memory corpus still fills one batch): a check that it runs, whose ratios are rougher than the full run's.
Usage: python bench/corpus/speed.py [--model smollm2-135m-instruct] [--texts 48] [--tokens 64] [--pairs 100]
                                    [--memory-texts 1000] [--mmap-kb 32768] [--batch-tokens 4096] [--repeats 5]
                                    [--quick] [--random-weights] [--threads N] [--parts heads,patch,lens,memory]
                                    [--publish]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))     # bench/, for common (which adds the root)

import torch  # noqa: E402

from common import (PeakMemory, add_publish, long_ids, md_table, median, publish, random_weights_folder, row,  # noqa: E402
                    spread, timed)
from core import load_model  # noqa: E402
from core.analysis import patching  # noqa: E402
from core.analysis import over as overs  # noqa: E402
from core.corpus import jobs  # noqa: E402
from core.corpus.texts import ioi_pairs  # noqa: E402
from lens import check_agreement, lens_model, lens_scores  # noqa: E402
from core.machine import allocator  # noqa: E402

WIDTHS = (46, 24, 24, 9)
PARTS = ("heads", "patch", "lens", "memory")
QUICK = {"texts": 12, "tokens": 32, "pairs": 2, "memory_texts": 100, "batch_tokens": 320}


def model_folder(name: str, random_weights: bool):
    if random_weights:
        return random_weights_folder(name)
    from core.store import ensure
    return ensure(name)


def windows(tokenizer, n: int, tokens: int) -> list[torch.Tensor]:
    """n texts of `tokens` tokens: consecutive windows of the example text (repeated as it needs)."""
    return list(long_ids(tokenizer, n * tokens)[0].view(n, tokens))


def plain_forward(model, texts: list[torch.Tensor], batch_tokens: int = jobs.BATCH_TOKENS) -> None:
    """The same padded batches as head_scores_over, through the stack only (fused attention, no observer)."""
    pad = jobs.pad_id(model)
    with torch.inference_mode():
        for batch in jobs.length_batches([len(t) for t in texts], batch_tokens):
            ids, mask = jobs.padded([texts[i] for i in batch], pad)
            model(ids, attention_mask=None if mask.all() else mask, return_logits=False)


def looped_sweeps(model, pairs) -> None:
    for pair in pairs:
        patching.patch_sweep(model, pair.clean[None], pair.corrupted[None], pair.answer, pair.foil, "z")


def peak_rss(folder: str, n: int, tokens: int, batch_tokens: int) -> dict:
    """In this (child) process: load, warm up on one batch, then head_scores_over on n seeded random texts;
    RSS in MB before the job and its peak while the job runs, by common.PeakMemory: the kernel's high-water
    mark reset just before the job (the process's lifetime peak is loading's, and the first pass's one-off
    allocations the warm-up's). Where the kernel cannot read or reset it, this stops saying so: no sampling."""
    model = load_model(folder, device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    texts = [torch.randint(3, model.config.vocab_size, (tokens,), generator=gen) for _ in range(n)]
    overs.head_scores_over(model, texts[:batch_tokens // tokens], batch_tokens)
    with PeakMemory("cpu", required=True) as peak:
        overs.head_scores_over(model, texts, batch_tokens)
    if peak.peak is None:
        raise SystemExit("the job's peak RSS could not be read back from /proc/self/status (VmHWM) after the job")
    return {"loaded": peak.before / 2**20, "peak": peak.peak / 2**20, "how": peak.how}


def in_child(folder, n: int, tokens: int, batch_tokens: int, mmap_kb: int) -> dict:
    """peak_rss in a fresh process, its mmap threshold fixed at mmap_kb KiB first (0: glibc's moving one; the
    ATTN_MALLOC_* and MALLOC_* settings of this environment are ignored)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ATTN_MALLOC_", "MALLOC_"))}
    done = subprocess.run([sys.executable, __file__, "--child-rss", str(folder), str(n), str(tokens),
                           str(batch_tokens), str(mmap_kb), "--threads", str(torch.get_num_threads())],
                          check=False, capture_output=True, text=True, timeout=3600, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"the memory child ({n} texts) failed:\n{done.stderr[-3000:]}")


def alternating(jobs: dict, order: list[str], repeats: int) -> tuple[dict, dict]:
    """Wall and CPU seconds of each job, `repeats` times, in `order` and then reversed in every other run (so
    each side of a comparison goes first in turn): key → [seconds]. CPU seconds are this process's, less
    moved by other jobs on a shared machine."""
    times, cpu = {key: [] for key in order}, {key: [] for key in order}
    for repeat in range(repeats if order else 0):
        for key in order[::-1] if repeat % 2 else order:
            before = time.process_time()
            times[key].append(timed(jobs[key], "cpu")[0])
            cpu[key].append(time.process_time() - before)
    return times, cpu


def report_heads(times: dict, args) -> tuple[str, str]:
    tokens = args.texts * args.tokens
    ratio = median(times["plain"]) / median(times["scores"])
    print(row(f"head scores, {args.texts} texts × {args.tokens} tokens", spread(times["scores"], 2),
              spread(times["plain"], 2), f"{ratio:.2f}", widths=WIDTHS))
    print(f"  token throughput: head_scores_over {tokens / median(times['scores']):.0f} tok/s, plain forward "
          f"{tokens / median(times['plain']):.0f} tok/s (ratio = scores / plain, target ≥ 0.5, aim 0.7)")
    body = (f"`head_scores_over` on {args.texts} texts × {args.tokens} tokens against a plain batched forward of the "
            f"same padded batches (the stack only, no logits), {torch.get_num_threads()} thread(s), median (range) of "
            f"{args.repeats} alternating runs: **{ratio:.2f}** of its token throughput.\n\n" +
            md_table(["", "seconds", "tokens/s"],
                     [["`head_scores_over`", spread(times["scores"], 2), f"{tokens / median(times['scores']):.0f}"],
                      ["plain forward", spread(times["plain"], 2), f"{tokens / median(times['plain']):.0f}"]],
                     ["---", "---:", "---:"]))
    return f"head scores {ratio:.2f} of a plain forward's throughput on {args.texts}×{args.tokens} tokens", body


def report_patch(times: dict, cpu: dict, pairs, cfg) -> tuple[str, str]:
    ratio = median(times["looped"]) / median(times["patch_over"])
    print(row(f"patch_over z, {len(pairs)} IOI pairs ({cfg.n_layers}×{cfg.n_heads} heads)",
              spread(times["patch_over"], 2), spread(times["looped"], 2), f"{ratio:.2f}x", widths=WIDTHS))
    print("  ratio = looped patch_sweep time / patch_over time (≥ 1: never slower); per run, each side first "
          "in turn")
    print("  patch_over (s): " + " ".join(f"{t:.2f}" for t in times["patch_over"]) + "   looped (s): "
          + " ".join(f"{t:.2f}" for t in times["looped"]))
    cpu_ratio = median(cpu["looped"]) / median(cpu["patch_over"])
    print(f"  CPU time: patch_over {spread(cpu['patch_over'], 2)} s, looped {spread(cpu['looped'], 2)} s, "
          f"ratio {cpu_ratio:.2f}x")
    body = (f"The head site (`z`), every layer × head ({cfg.n_layers}×{cfg.n_heads}), over {len(pairs)} IOI pairs: "
            f"`patch_over` against looping the single-pair `patch_sweep` over the same pairs, "
            f"{torch.get_num_threads()} thread(s), median (range) of {len(times['looped'])} alternating runs: "
            f"**{ratio:.2f}×** in wall time, {cpu_ratio:.2f}× in the process's CPU time. Run by run the ratio was "
            + ", ".join(f"{a / b:.2f}" for a, b in zip(times["looped"], times["patch_over"])) + ".\n\n" +
            md_table(["", "wall s", "CPU s"],
                     [["`patch_over`", spread(times["patch_over"], 1), spread(cpu["patch_over"], 1)],
                      ["looped `patch_sweep`", spread(times["looped"], 1), spread(cpu["looped"], 1)]],
                     ["---", "---:", "---:"]))
    return (f"patch_over {median(times['patch_over']):.1f} s over {len(pairs)} pairs, {ratio:.2f}x the looped "
            f"sweeps ({cpu_ratio:.2f}x in CPU time)"), body


def report_lens(times: dict, cpu: dict, args, agreement: str) -> tuple[str, str]:
    ratios = {key: median(times[key]) / median(times["scores"]) for key in ("lens loop", "lens batched")}
    cpu_ratios = {key: median(cpu[key]) / median(cpu["scores"]) for key in ratios}
    print(row(f"head scores, transformer-lens, {args.texts} texts", spread(times["scores"], 2), "", "",
              widths=WIDTHS))
    print(row("  run_with_cache looped over the texts", "", spread(times["lens loop"], 2),
              f"{ratios['lens loop']:.2f}x", widths=WIDTHS))
    print(row(f"  run_with_cache on all {args.texts} in one batch", "", spread(times["lens batched"], 2),
              f"{ratios['lens batched']:.2f}x", widths=WIDTHS))
    print("  ratio = transformer-lens time / head_scores_over time (> 1: head_scores_over is faster); patterns "
          "only cached (names_filter)")
    print(f"  CPU time: head_scores_over {spread(cpu['scores'], 2)} s, loop {spread(cpu['lens loop'], 2)} s "
          f"({cpu_ratios['lens loop']:.2f}x), batched {spread(cpu['lens batched'], 2)} s "
          f"({cpu_ratios['lens batched']:.2f}x)")
    print(f"  {agreement}")
    body = (f"The same head scores from transformer-lens's `run_with_cache` patterns on {args.texts} texts × "
            f"{args.tokens} tokens, {torch.get_num_threads()} thread(s), median (range) of {len(times['scores'])} "
            f"alternating runs; {agreement}. Ratio = its time / `head_scores_over`'s.\n\n" +
            md_table(["", "wall s", "ratio", "CPU s", "CPU ratio"],
                     [["`head_scores_over`", spread(times["scores"], 2), "1", spread(cpu["scores"], 2), "1"]] +
                     [[f"`run_with_cache` {'looped over the texts' if key == 'lens loop' else 'on all in one batch'}",
                       spread(times[key], 2), f"{ratios[key]:.2f}×", spread(cpu[key], 2), f"{cpu_ratios[key]:.2f}×"]
                      for key in ratios], ["---", "---:", "---:", "---:", "---:"]))
    return (f"transformer-lens run_with_cache loop {ratios['lens loop']:.2f}x head_scores_over's time "
            f"({cpu_ratios['lens loop']:.2f}x in CPU time), batched {ratios['lens batched']:.2f}x "
            f"({cpu_ratios['lens batched']:.2f}x)"), body


def report_memory(folder, args) -> tuple[str, str]:
    small_n = max(1, args.memory_texts // 10)
    print(f"memory, head_scores_over on random texts of {args.tokens} tokens (peak RSS of a fresh process while "
          f"the job runs; batches of {args.batch_tokens // args.tokens} texts)")
    summary, rows = [], []
    for kb, said in ((0, "glibc as it comes"), (args.mmap_kb, f"mmap threshold fixed at {args.mmap_kb} KiB")):
        small = in_child(folder, small_n, args.tokens, args.batch_tokens, kb)
        large = in_child(folder, args.memory_texts, args.tokens, args.batch_tokens, kb)
        grown = large["peak"] - small["peak"]
        print(f"  {said}, by {large['how']}; before the job: {small['loaded']:.0f} MB")
        print(f"    {small_n} texts: {small['peak']:.0f} MB   {args.memory_texts} texts: {large['peak']:.0f} MB   "
              f"difference {grown:+.0f} MB (target ≤ 300)")
        summary.append(f"RSS {args.memory_texts} vs {small_n} texts {grown:+.0f} MB ({said})")
        rows.append([said, f"{small['loaded']:,.0f}", f"{small['peak']:,.0f}", f"{large['peak']:,.0f}",
                     f"**{grown:+,.0f}**"])
    body = (f"`head_scores_over` on {small_n:,} and on {args.memory_texts:,} seeded random texts of {args.tokens} "
            f"tokens (batches of {args.batch_tokens // args.tokens} texts), each in a fresh process, "
            f"{torch.get_num_threads()} thread(s): the peak RSS while the job runs (the kernel's high-water mark, "
            "VmHWM, reset just before the job), MB. One run each; the target: the larger corpus peaks within "
            "300 MB of the smaller.\n\n" +
            md_table(["allocator", "RSS before the job", f"peak, {small_n:,} texts", f"peak, {args.memory_texts:,} texts",
                      "difference"], rows, ["---", "---:", "---:", "---:", "---:"]))
    return ", ".join(summary), body


def arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--texts", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--memory-texts", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes: " + json.dumps(QUICK))
    parser.add_argument("--random-weights", action="store_true", help="seeded random weights of the same shapes")
    parser.add_argument("--batch-tokens", type=int, default=jobs.BATCH_TOKENS,
                        help="rows × longest text in one padded batch (head scores and memory)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which to run, comma-separated: {', '.join(PARTS)}")
    parser.add_argument("--mmap-kb", type=int, default=allocator.MMAP_KB,
                        help="the memory part's fixed mmap threshold, KiB (default: the app's)")
    parser.add_argument("--child-rss", nargs=5, help=argparse.SUPPRESS)
    add_publish(parser)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.child_rss:
        folder, n, tokens, batch_tokens, mmap_kb = args.child_rss
        if int(mmap_kb) and not allocator.fix_mmap_threshold(int(mmap_kb)):
            raise SystemExit("the mmap threshold could not be fixed here (glibc only): the fixed case would not be")
        print("RESULT", json.dumps(peak_rss(folder, int(n), int(tokens), int(batch_tokens))))
        return
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    parts = [part for part in args.parts.split(",") if part]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise SystemExit(f"--parts {args.parts!r}: choose among {', '.join(PARTS)}")
    if "memory" in parts and args.memory_texts // 10 * args.tokens < args.batch_tokens:
        raise SystemExit(f"--memory-texts {args.memory_texts}: its tenth must fill a batch of --batch-tokens "
                         f"{args.batch_tokens}, or the two runs differ in batch, not only in corpus")
    if args.repeats < 5:
        raise SystemExit("--repeats must be at least 5: a median of fewer runs says little")
    folder = model_folder(args.model, args.random_weights)
    model = load_model(folder, device="cpu", dtype=torch.float32)
    texts = windows(model.tokenizer, args.texts, args.tokens)
    pairs = ioi_pairs(model.tokenizer, args.pairs, seed=0)
    lens, lens_skipped = lens_model(folder, model.tokenizer) if "lens" in parts else (None, "")
    print(f"model {args.model} ({folder}), cpu, float32, threads {torch.get_num_threads()}, "
          f"medians (ranges) of {args.repeats} alternating runs{', QUICK sizes' if args.quick else ''}")
    sides = {"heads": ("scores", "plain"), "patch": ("patch_over", "looped"),
             "lens": ("scores", "lens loop", "lens batched")}
    jobs = {"scores": lambda: overs.head_scores_over(model, texts, args.batch_tokens),
            "plain": lambda: plain_forward(model, texts, args.batch_tokens),
            "patch_over": lambda: overs.patch_over(model, pairs, "z"),
            "looped": lambda: looped_sweeps(model, pairs),
            "lens loop": lambda: lens_scores(lens, texts),
            "lens batched": lambda: lens_scores(lens, texts, len(texts))}
    summary, bodies = [], {}
    if lens_skipped:
        print(f"lens: skipped: {lens_skipped}")
        summary.append("transformer-lens not installed")
        parts.remove("lens")
    if "heads" in parts:                                                                # warm-up
        overs.head_scores_over(model, texts[:2]), plain_forward(model, texts[:2])
    if "patch" in parts:
        looped_sweeps(model, pairs[:1])
    if "lens" in parts:          # warm-up at full size, whose results are checked before anything is timed
        ours = overs.head_scores_over(model, texts, args.batch_tokens)
        agreement = check_agreement(ours, jobs["lens loop"]())
        check_agreement(ours, jobs["lens batched"]())
    order = list(dict.fromkeys(key for part in parts if part in sides for key in sides[part]))
    times, cpu = alternating(jobs, order, args.repeats)
    if times:
        print(row("", "corpus job (s)", "plain way (s)", "ratio", widths=WIDTHS))
    if "heads" in parts:
        said, bodies["heads"] = report_heads(times, args)
        summary.append(said)
    if "patch" in parts:
        said, bodies["patch"] = report_patch(times, cpu, pairs, model.config)
        summary.append(said)
    if "lens" in parts:
        said, bodies["lens"] = report_lens(times, cpu, args, agreement)
        summary.append(said)
    if "memory" in parts:
        said, bodies["memory"] = report_memory(folder, args)
        summary.append(said)
    print(f"SUMMARY corpus{' (QUICK)' if args.quick else ''}, threads {torch.get_num_threads()}: " + "; ".join(summary))
    if args.publish:
        if args.quick:
            raise SystemExit("--publish with --quick: the quick sizes are a check that the script runs, not figures")
        for part, body in bodies.items():
            publish(f"corpus-{part}", body)


if __name__ == "__main__":
    main()
