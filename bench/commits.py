"""One benchmark script at two revisions of the repository, interleaved, and the ratio of every figure it prints.

Both revisions are checked out into temporary git worktrees under the system's temp folder (removed at the end;
the main work tree's checkout and index are never touched). The script runs as a fresh process in each,
alternating BEFORE, AFTER, BEFORE, AFTER ... --repeats times, so that a drift of the machine falls on both.
Each run is the revision's own copy of the script and core (PYTHONPATH and the working folder are its worktree);
both read the same weights: the store's folder (weights/ of this checkout, or $ATTN_WEIGHTS_DIR), linked into
each worktree's weights/ as well for revisions whose store predates that variable.

The figures are read from the script's printed output by a parser per script (PARSERS); transformers' own
figures, printed beside this core's by generate.py and attention.py, are a control: their ratio should be ~1.
For each figure: the median BEFORE and AFTER, the median AFTER/BEFORE ratio of the runs paired in order, the
range of those ratios, and n. With --publish the table goes to docs/benchmarks.md, section commits-SCRIPT (the
script's name without .py). Usage:
    python bench/commits.py BEFORE AFTER [--repeats 5] [--publish] -- SCRIPT [ARGS...]
    python bench/commits.py 4070e26 HEAD --repeats 3 -- bench/generate.py --tokens 64 --repeats 1
    python bench/commits.py 4070e26 HEAD -- bench/attention.py --lengths 512 --repeats 1 --random-weights
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from common import add_publish, md_table, median, publish  # noqa: E402

NUMBER = r"([\d.]+)"


def parse_generate(text: str) -> dict[str, tuple[float, str]]:
    """bench/generate.py: greedy tokens/s per variant, prefill seconds, tokens/s with and without the KV cache."""
    figures, in_greedy = {}, False
    for line in text.splitlines():
        if line.startswith("greedy tokens/s"):
            in_greedy = True
            continue
        greedy = re.match(rf"^  (this core(?:, compiled)?|transformers)\s+{NUMBER} \(", line)
        if in_greedy and greedy:
            figures[f"greedy, {greedy[1]}"] = (float(greedy[2]), "tokens/s")
            continue
        in_greedy = in_greedy and line.startswith("  ")
        prefill = re.match(rf"^prefill (\d+) tokens \(s\)\s+{NUMBER} \([^)]*\)\s*{NUMBER} \(", line)
        if prefill:
            figures[f"prefill {prefill[1]}, this core"] = (float(prefill[2]), "s")
            figures[f"prefill {prefill[1]}, transformers"] = (float(prefill[3]), "s")
        cache = re.match(rf"^tokens/s at (\d+) context\s+cache {NUMBER}\s+none {NUMBER}", line)
        if cache:
            figures[f"context {cache[1]}, KV cache"] = (float(cache[2]), "tokens/s")
            figures[f"context {cache[1]}, no cache"] = (float(cache[3]), "tokens/s")
        same = re.match(r"^  same 32 greedy tokens as transformers: (True|False)", line)
        if same:
            figures["same greedy tokens as transformers"] = (float(same[1] == "True"), "1 = yes")
    return figures


def parse_attention(text: str) -> dict[str, tuple[float, str]]:
    """bench/attention.py: per length, capture seconds and peak memory of both, one layer on demand."""
    figures = {}
    pattern = (rf"^(\d+)\s+{NUMBER} \([^)]*\)\s+{NUMBER} \([^)]*\)\s+{NUMBER}x\s+{NUMBER}GB\s+{NUMBER}GB"
               rf"\s+{NUMBER}\s+{NUMBER}s$")
    for line in text.splitlines():
        found = re.match(pattern, line.strip())
        if found:
            n = found[1]
            figures[f"capture {n}, this core"] = (float(found[2]), "s")
            figures[f"capture {n}, transformers"] = (float(found[3]), "s")
            figures[f"peak {n}, this core"] = (float(found[5]), "GB")
            figures[f"peak {n}, transformers"] = (float(found[6]), "GB")
            figures[f"one layer on demand {n}"] = (float(found[8]), "s")
    return figures


PARSERS = {"generate.py": parse_generate, "attention.py": parse_attention}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def resolve(revision: str) -> str:
    try:
        return git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"{revision!r} is not a commit of this repository; "
                         "give a hash, a branch or e.g. HEAD~1") from None


def weights_root() -> Path:
    """The store's folder, as core/store/folders.py reads it: $ATTN_WEIGHTS_DIR, else weights/ of this checkout."""
    return Path(os.environ.get("ATTN_WEIGHTS_DIR") or ROOT / "weights").expanduser().resolve()


def add_worktree(commit: str, folder: Path) -> Path:
    """A detached checkout of `commit` at `folder` whose weights/ links to the store's model folders."""
    git("worktree", "add", "--detach", "--quiet", str(folder), commit)
    weights = folder / "weights"
    weights.mkdir(exist_ok=True)
    for model in weights_root().iterdir():
        if model.is_dir() and not model.name.startswith(".") and not (weights / model.name).exists():
            (weights / model.name).symlink_to(model, target_is_directory=True)
    return folder


def run_once(worktree: Path, script: str, args: list[str]) -> tuple[str, float]:
    """One fresh process of the worktree's script; its stdout and wall-clock seconds. A failure ends the comparison."""
    env = {**os.environ, "PYTHONPATH": str(worktree), "ATTN_WEIGHTS_DIR": str(weights_root()),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, script, *args], cwd=worktree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{script} {' '.join(args)} failed in {worktree} (exit {done.returncode}):\n"
                         f"{(done.stderr or done.stdout)[-3000:]}")
    return done.stdout, seconds


def ratio_cell(before: list[float], after: list[float]) -> str:
    """Median AFTER/BEFORE of the runs paired in order, and the range of the pairs' ratios."""
    ratios = [a / b for b, a in zip(before, after) if b]
    if not ratios:
        return "n/a (BEFORE is 0)"
    return f"{median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f})"


def report(labels: tuple[str, str], runs: dict[str, list[dict]]) -> list[list[str]]:
    """Prints the comparison; returns its rows (figure, unit, median BEFORE, median AFTER, ratio cell, n)."""
    before, after = runs[labels[0]], runs[labels[1]]
    names = [name for name in before[0] if all(name in r for r in before + after)]
    missing = sorted({name for r in before + after for name in r} - set(names))
    print(f"{'figure':<38}{'unit':<10}{'BEFORE ' + labels[0]:>18}{'AFTER ' + labels[1]:>18}"
          f"{'AFTER/BEFORE (range)':>26}{'n':>4}")
    rows = []
    for name in names:
        b, a = [r[name][0] for r in before], [r[name][0] for r in after]
        rows.append([name, before[0][name][1], f"{median(b):.4g}", f"{median(a):.4g}", ratio_cell(b, a),
                     str(min(len(b), len(a)))])
        print(f"{name:<38}{before[0][name][1]:<10}{median(b):>18.4g}{median(a):>18.4g}{ratio_cell(b, a):>26}"
              f"{min(len(b), len(a)):>4}")
    if missing:
        print(f"printed by one revision only (not compared): {', '.join(missing)}")
    return rows


def main() -> None:
    argv = sys.argv[1:]
    if "--" not in argv:
        raise SystemExit("usage: python bench/commits.py BEFORE AFTER [--repeats 5] -- SCRIPT [ARGS...] "
                         "(the benchmark script and its arguments come after '--')")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", help="the earlier revision (hash, branch, HEAD~1, ...)")
    parser.add_argument("after", help="the later revision")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each revision, alternating")
    add_publish(parser)
    args = parser.parse_args(argv[:split])
    if not argv[split + 1:]:
        raise SystemExit("no benchmark script after '--'; e.g. -- bench/generate.py --tokens 64 --repeats 1")
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be at least 1, got {args.repeats}")
    script, script_args = argv[split + 1], argv[split + 2:]
    script = str(Path(script).resolve().relative_to(ROOT)) if Path(script).is_absolute() else script
    parse = PARSERS.get(Path(script).name, lambda text: {})
    commits = {args.before: resolve(args.before), args.after: resolve(args.after)}
    labels = (args.before, args.after)
    if labels[0] == labels[1]:  # the same revision twice: an A/A run that shows the noise alone
        labels = (f"{args.before} (1)", f"{args.after} (2)")
    print(f"{script} {' '.join(script_args)}: BEFORE {args.before} = {commits[args.before][:10]}, "
          f"AFTER {args.after} = {commits[args.after][:10]}, {args.repeats} alternating runs each; "
          f"weights from {weights_root()}")
    if Path(script).name not in PARSERS:
        print(f"no parser for {Path(script).name} (known: {', '.join(PARSERS)}); comparing the runs' wall time only")

    runs: dict[str, list[dict]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory(prefix="bench-commits-") as temp:
        trees = {}
        try:
            for label, revision in zip(labels, (args.before, args.after)):
                trees[label] = add_worktree(commits[revision], Path(temp) / f"tree-{len(trees)}")
                if not (trees[label] / script).is_file():
                    raise SystemExit(f"{script} does not exist at {revision} ({commits[revision][:10]})")
            for repeat in range(args.repeats):
                for label in labels:
                    out, seconds = run_once(trees[label], script, script_args)
                    figures = parse(out)
                    if Path(script).name in PARSERS and not figures:
                        raise SystemExit(f"no figures found in {script}'s output at {label}; the parser "
                                         f"{parse.__name__} expects its usual table. Output:\n{out[-2000:]}")
                    figures["whole run, wall clock"] = (seconds, "s")
                    runs[label].append(figures)
                    print(f"  run {repeat + 1}/{args.repeats} {label}: {seconds:.1f} s, {len(figures)} figures",
                          flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
            git("worktree", "prune")
    rows = report(labels, runs)
    if args.publish:
        publish(f"commits-{Path(script).stem}",
                f"`{script} {' '.join(script_args)}` at BEFORE {args.before} ({commits[args.before][:10]}) and AFTER "
                f"{args.after} ({commits[args.after][:10]}), {args.repeats} alternating fresh runs each; medians, and "
                "the median (range) of the AFTER / BEFORE ratios of the runs paired in order. transformers' figures "
                "are the control: their ratio shows the machine's drift.\n\n" +
                md_table(["figure", "unit", f"BEFORE {args.before}", f"AFTER {args.after}", "AFTER / BEFORE (range)",
                          "n"], rows, ["---", "---", "---:", "---:", "---:", "---:"]))


if __name__ == "__main__":
    main()
