"""Shared by the benchmark scripts: loading both implementations on the same weights, timing, peak memory,
printing, and publishing a section of docs/benchmarks.md."""
from __future__ import annotations

import datetime
import gc
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import load_model  # noqa: E402
TEXT = (Path(__file__).resolve().parent.parent / "assets" / "examples" / "attention.txt")
CONFIGS = Path(__file__).resolve().parent / "configs"


def random_weights_folder(name: str) -> Path:
    """A folder with the model's config.json (bench/configs/NAME.json) and seeded random weights: the same
    shapes, so the same speed, where the real weights cannot be had (a GPU machine with no network)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    path = CONFIGS / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"no config for {name!r} in {CONFIGS}; random weights need one")
    folder = Path(tempfile.gettempdir()) / f"attention-explorer-random-{name}"
    if (folder / "model.safetensors").is_file():  # made by an earlier run: the same seed, the same weights
        return folder
    raw = json.loads(path.read_text())
    raw.pop("eos_token_id", None)  # random weights may stop anywhere; the timings want every token
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def load_both(name: str, device: str, dtype: torch.dtype, attn_implementation: str = "sdpa",
              random_weights: bool = False):
    from transformers import AutoModelForCausalLM
    if random_weights:
        folder = random_weights_folder(name)
    else:
        from core.store import ensure
        folder = ensure(name)
    ours = load_model(folder, device=device, dtype=dtype)
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation)
    return ours, theirs.to(device).eval(), folder


def long_ids(tokenizer, n: int) -> torch.Tensor:
    """n real tokens of English text (the example text repeated), [1, n]; seeded random ids without a tokenizer."""
    if tokenizer is None:
        return torch.randint(3, 1000, (1, n), generator=torch.Generator().manual_seed(n))
    text = TEXT.read_text(encoding="utf-8") if TEXT.is_file() else "Attention lets every token look at every other token. "
    ids = tokenizer(text, add_special_tokens=False).input_ids
    while len(ids) < n:
        ids = ids + ids
    return torch.tensor([ids[:n]])


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str) -> tuple[float, object]:
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return time.perf_counter() - start, result


def median(values) -> float:
    return statistics.median(values)


def figure(x: float) -> str:
    """Three significant figures, thousands separated, no exponent."""
    if x == 0 or abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


def spread_figures(values, scale: float = 1.0) -> str:
    """The median (range) of values × scale, each in three figures (figure); "–" for none."""
    v = [x * scale for x in values]
    return f"{figure(median(v))} ({figure(min(v))}–{figure(max(v))})" if v else "–"


def spread(values, digits: int = 1) -> str:
    """The median and the range of repeated runs, e.g. '28.3 (27.1–29.0)'."""
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A field of /proc/PID/status (VmHWM, VmRSS) in bytes, of this process by default; None where there is no
    such file (not Linux, or the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_high_water(pid: int | str = "self") -> bool:
    """Reset the kernel's peak RSS (VmHWM) of process PID (this one by default) to its current RSS: Linux's
    `echo 5 > /proc/PID/clear_refs` (another process: the same user, or root). False where it cannot (another
    kernel, /proc read-only, another user's process, or the process is gone)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class PeakMemory:
    """The peak memory of the code run inside `with PeakMemory(device) as peak:`, by one method everywhere: on the
    CPU the kernel's high-water mark of a process's resident memory (VmHWM, exact, not sampled), reset to the
    current RSS on entry; on a GPU torch's peak allocation on the device. The process is this one, or with
    pid=N another one of the same user (a server the benchmark drives: its high-water mark over the block).
    After the block: .before (RSS or allocated bytes on entry), .peak (the highest during the block, bytes) and
    .added = peak - before; all None where the kernel cannot reset its high-water mark, or with required=True
    a SystemExit on entry saying why. Run it in a fresh process (measured_in_child) with the work warmed up
    first, so that the peak is the work's own and not loading's or a first call's."""

    def __init__(self, device: str = "cpu", pid: int | None = None, required: bool = False):
        if pid is not None and device.startswith("cuda"):
            raise ValueError("PeakMemory(pid=...) reads another process's VmHWM: device must be 'cpu', "
                             f"not {device!r} (torch's allocator counts this process only)")
        self.cuda = device.startswith("cuda")
        self.pid: int | str = "self" if pid is None else pid
        self.required = required
        self.before = self.peak = self.added = None
        self.how = "torch's peak allocation on the GPU" if self.cuda else "peak RSS (the kernel's VmHWM)"

    def __enter__(self):
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        elif reset_high_water(self.pid) and status_bytes("VmHWM", self.pid) is not None:
            self.before = status_bytes("VmRSS", self.pid)
        elif self.required:
            who = "this process" if self.pid == "self" else f"process {self.pid}"
            raise SystemExit(f"cannot measure the peak memory of {who}: its high-water mark (VmHWM in "
                             f"/proc/{self.pid}/status) could not be read or reset by writing 5 to "
                             f"/proc/{self.pid}/clear_refs. This needs Linux, a writable /proc, and the same "
                             f"user as the process (or root); peaks are not sampled instead, as sampling misses "
                             f"short ones")
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        elif self.before is not None:
            self.peak = status_bytes("VmHWM", self.pid)
        if self.peak is not None and self.before is not None:
            self.added = self.peak - self.before
        return False


def row(*cells, widths=(34, 16, 16, 10)) -> str:
    return "".join(str(c).ljust(w) for c, w in zip(cells, widths))


def measured_in_child(module: str, *args, timeout: int = 1800, env: dict | None = None) -> dict:
    """`measure(*args)` of bench/MODULE.py run in a fresh Python process (so that its peak memory is its own), read
    back from the line it prints; args are plain values (str, int, bool); env: the child's environment (this
    process's when None). Stops with the child's error output."""
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            f"from {module} import measure; print('RESULT', json.dumps(measure(*{args!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{module}.measure{args!r} failed:\n{done.stderr[-3000:]}")


# ---- publishing: every published benchmark figure is written by the script that measured it. `publish(name, body)`
# replaces the section NAME of docs/benchmarks.md (between its two marker lines) with the body, headed by the date,
# the machine and the exact command that produced it; a figure typed by hand has no place in that file.

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
DOCS = DOC.parent


def load_average() -> float | None:
    """The 1-minute load average (runnable processes, all cores together); None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


LOAD_AT_START = load_average()   # when the script imported this module: the run's start, for section()'s head line


def machine() -> str:
    """The CPU model, its core count and the library versions: what a reader needs to compare a figure."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = os.cpu_count()
    parts = [f"{cpu}, {cores} core{'' if cores == 1 else 's'}", f"Python {platform.python_version()}"]
    try:
        import torch
        threads = torch.get_num_threads()
        parts.append(f"torch {torch.__version__}, {threads} thread{'' if threads == 1 else 's'}")
        if torch.cuda.is_available():
            parts.append(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return "; ".join(parts)


def command() -> str:
    """The command line that ran this script, as a user would type it from the repository's root."""
    argv = [Path(sys.argv[0]).resolve().relative_to(DOC.parent.parent).as_posix()
            if Path(sys.argv[0]).resolve().is_relative_to(DOC.parent.parent) else sys.argv[0], *sys.argv[1:]]
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "ATTN_MALLOC_MMAP_KB", "ATTN_SESSIONS",
                                                   "ATTN_KEPT_BUDGET_MB") if k in os.environ)
    return (env + " " if env else "") + "python " + shlex.join(argv)


def load_phrase(start: float | None, end: float | None) -> str:
    """'load average 0.52 → 1.87': the 1-minute load average when the run started and when it published, so that a
    reader sees whether the machine was busy; '' where the OS gives none."""
    if start is None or end is None:
        return ""
    return f"load average {start:.2f} → {end:.2f}"


def add_publish(parser) -> None:
    """The --publish switch every benchmark script shares."""
    parser.add_argument("--publish", action="store_true",
                        help="write this run's section into the docs (publish in bench/common.py)")


def md_table(header, rows, align=None) -> str:
    """A markdown table from a header and rows of cells (anything str() can print)."""
    align = align or ["---"] * len(header)
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def stamp(today: datetime.date | None = None) -> dict:
    """Where and how this run ran, as a saved run records it: the command, the date, the machine and the load
    average when the script started and now."""
    return {"command": command(), "date": (today or datetime.date.today()).isoformat(), "machine": machine(),
            "load_average": [LOAD_AT_START, load_average()]}


def written_by(run: dict) -> str:
    """A section's head line from a stamp (or a saved run holding one)."""
    load = load_phrase(*run["load_average"])
    return f"_Written by `{run['command']}` on {run['date']}; {run['machine']}{'; ' + load if load else ''}._"


def section(name: str, body: str, today: datetime.date | None = None, run: dict | None = None) -> str:
    """The block of section NAME: its markers around the head line (of `run`'s stamp, else this run's) and body."""
    head = written_by(run or stamp(today))
    return f"<!-- bench:{name} start -->\n{head}\n\n{body.strip()}\n<!-- bench:{name} end -->"


def publish(name: str, body: str, doc: Path = DOC, run: dict | None = None) -> Path:
    """Replace section NAME of `doc` with `body` (markdown), or append it under a heading of its name; headed by
    `run`'s stamp where a saved run is published again, else by this run's."""
    if not re.fullmatch(r"[a-z0-9-]+", name):
        raise ValueError(f"section name {name!r}: lower-case letters, digits and hyphens only")
    text = doc.read_text(encoding="utf-8") if doc.is_file() else "# Benchmarks\n"
    block = section(name, body, run=run)
    pattern = re.compile(rf"<!-- bench:{name} start -->.*?<!-- bench:{name} end -->", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + f"\n\n## {name}\n\n{block}\n"
    doc.write_text(text, encoding="utf-8")
    print(f"published section {name!r} in {doc}")
    return doc
