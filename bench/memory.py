"""Does the server give memory back after heavy jobs? `python app.py` started once per allocator setting, each
time running the same integrated-gradients attributions (--attributions sessions at once, --steps steps, on the
Attention example's first 16 tokens) through gradio_client, with the server's RSS printed before, at the peak
(the server process's own high-water mark, VmHWM, reset before the attributions and read after them:
common.PeakMemory with its pid; Linux, the same user), right after and --settle seconds after.

  glibc default       ATTN_MALLOC_ARENAS=0 ATTN_MALLOC_TRIM=0 ATTN_MALLOC_MMAP_KB=0: up to 8 arenas per core,
                      never trimmed, glibc's moving mmap threshold
  environment         MALLOC_ARENA_MAX=2 set before the process starts (what re-executing app.py with it would do)
  mallopt             mallopt(M_ARENA_MAX, 2) first thing in app.py's main() (ui/memory.py), no trim
  trim                malloc_trim(0) after each heavy job, arenas as glibc bounds them
  mallopt + trim      both, glibc's moving mmap threshold (the app's default until 2026-12-03)
  app default         both, and the mmap threshold fixed at 32 MiB (ATTN_MALLOC_MMAP_KB unset: the app's default)

With --publish the table goes to docs/reliability.md (section memory).
Usage: python bench/memory.py [--attributions 3] [--steps 256] [--settle 60] [--model smollm2-135m-instruct]
                              [--only "glibc default,app default"] [--publish]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import DOCS, PeakMemory, add_publish, md_table, publish
from load import free_port, mb, read_texts, rss_bytes, start_server, stop_server, wait_until_up

OFF = dict(ATTN_MALLOC_ARENAS="0", ATTN_MALLOC_TRIM="0", ATTN_MALLOC_MMAP_KB="0", MALLOC_ARENA_MAX=None)
VARIANTS = {
    "glibc default": OFF,
    "environment": dict(OFF, MALLOC_ARENA_MAX="2"),
    "mallopt": dict(OFF, ATTN_MALLOC_ARENAS="2"),
    "trim": dict(OFF, ATTN_MALLOC_TRIM="1"),
    "mallopt + trim": dict(OFF, ATTN_MALLOC_ARENAS="2", ATTN_MALLOC_TRIM="1"),
    "app default": {name: None for name in OFF},  # nothing set: the app's own settings
}
SETTING = {
    "glibc default": "`ATTN_MALLOC_ARENAS=0 ATTN_MALLOC_TRIM=0 ATTN_MALLOC_MMAP_KB=0`",
    "environment": "`MALLOC_ARENA_MAX=2` in the environment, no trim",
    "mallopt": "`mallopt(M_ARENA_MAX, 2)` in `main()`, no trim",
    "trim": "`malloc_trim(0)` after each job, glibc's arenas",
    "mallopt + trim": "both, glibc's moving mmap threshold",
    "app default": "both, and the mmap threshold fixed at 32 MiB",
}
POSITION = 15  # 16 tokens: 256 steps × 16 tokens is the Heads tab's budget of 4,096


def attribute(url: str, model: str, text: str, steps: int) -> float:
    from gradio_client import Client  # noqa: PLC0415

    client = Client(url, verbose=False)  # a session of its own: the Heads tab keeps one attribution per session
    started = time.perf_counter()
    client.predict(model, text, POSITION, 0, 0, steps, "", "", "pad", api_name="/attribute")
    client.close()
    return time.perf_counter() - started


def measure(name: str, env: dict, args, text: str) -> dict:
    """One setting: the server's RSS before, peak (VmHWM), right after and --settle s after, bytes; job seconds."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log_path = Path(tempfile.gettempdir()) / f"attention-explorer-memory-{port}.log"
    proc = start_server(args.model, port, log_path, env=env)
    try:
        wait_until_up(proc, url, log_path)
        with PeakMemory("cpu", pid=proc.pid, required=True) as peak, ThreadPoolExecutor(args.attributions) as pool:
            seconds = list(pool.map(lambda _: attribute(url, args.model, text, args.steps), range(args.attributions)))
        if peak.peak is None:
            raise SystemExit(f"{name}: the server's VmHWM could not be read after the attributions (did it die? "
                             f"its log: {log_path})")
        before, after = peak.before, rss_bytes(proc.pid) or 0
        time.sleep(args.settle)
        settled = rss_bytes(proc.pid) or 0
    finally:
        stop_server(proc)
    return {"before": before, "peak": peak.peak, "after": after, "settled": settled, "seconds": seconds}


def line(name: str, m: dict, args) -> str:
    return (f"{name:<16} RSS {mb(m['before'])} before, {mb(m['peak'])} peak (VmHWM), {mb(m['after'])} after, "
            f"{mb(m['settled'])} {args.settle:.0f} s after ({(m['settled'] - m['before']) / 2**20:+,.0f} MB); "
            f"{args.attributions} attributions at {args.steps} steps: {', '.join(f'{s:.0f}' for s in m['seconds'])} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attributions", type=int, default=3, help="attributions, each from its own session")
    parser.add_argument("--steps", type=int, default=256, help="integrated gradients' steps (1–256)")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds after the last one to read RSS again")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--only", default="", help=f"comma-separated variants, of: {', '.join(VARIANTS)}")
    add_publish(parser)
    args = parser.parse_args()
    chosen = [v.strip() for v in args.only.split(",") if v.strip()] or list(VARIANTS)
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    text = read_texts()["attention"]
    rows = []
    for name in chosen:
        m = measure(name, VARIANTS[name], args, text)
        print(line(name, m, args), flush=True)
        rows.append([f"{name}: {SETTING[name]}", mb(m["before"]), mb(m["peak"]), mb(m["after"]),
                     f"{mb(m['settled'])} ({(m['settled'] - m['before']) / 2**20:+,.0f})",
                     ", ".join(f"{s:.0f}" for s in m["seconds"])])
    if args.publish:
        publish("memory", f"`python app.py` started once per allocator setting, {args.attributions} integrated-"
                          f"gradients attributions at {args.steps} steps from {args.attributions} sessions at once; "
                          f"the server's RSS before, its peak over the attributions (the server's VmHWM), right after "
                          f"and {args.settle:.0f} s after; one run per setting.\n\n" +
                md_table(["allocator setting", "RSS before", "peak", "right after", f"{args.settle:.0f} s after",
                          "attributions (s)"], rows, ["---", "---:", "---:", "---:", "---:", "---:"]),
                doc=DOCS / "reliability.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
