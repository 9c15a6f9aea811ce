"""Every published benchmark figure is written here by the script that measured it: `publish(name, body)` replaces
the section NAME of docs/benchmarks.md (between its two marker lines) with the body, headed by the date, the
machine and the exact command that produced it. A figure typed by hand has no place in that file.

    from bench.publish import publish
    publish("online-softmax", table_markdown)          # at the end of a script's run, when asked with --publish
"""
from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


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
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "ATTN_MALLOC_MMAP_KB") if k in os.environ)
    return (env + " " if env else "") + "python " + shlex.join(argv)


def section(name: str, body: str, today: datetime.date | None = None) -> str:
    today = today or datetime.date.today()
    head = f"_Written by `{command()}` on {today.isoformat()}; {machine()}._"
    return f"<!-- bench:{name} start -->\n{head}\n\n{body.strip()}\n<!-- bench:{name} end -->"


def publish(name: str, body: str, doc: Path = DOC) -> Path:
    """Replace section NAME of `doc` with `body` (markdown), or append it under a heading of its name."""
    if not re.fullmatch(r"[a-z0-9-]+", name):
        raise ValueError(f"section name {name!r}: lower-case letters, digits and hyphens only")
    text = doc.read_text(encoding="utf-8") if doc.is_file() else "# Benchmarks\n"
    block = section(name, body)
    pattern = re.compile(rf"<!-- bench:{name} start -->.*?<!-- bench:{name} end -->", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + f"\n\n## {name}\n\n{block}\n"
    doc.write_text(text, encoding="utf-8")
    print(f"published section {name!r} in {doc}")
    return doc
