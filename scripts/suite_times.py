"""Where the test suite's time goes, from a run's JUnit XML: one row per test folder (and the slowest modules),
written into docs/testing.md's "suite-times" section by bench/common.py's publish, so the table is the run's, not typed.

    python -m pytest -q -rs -n 2 tests --junitxml=/tmp/suite.xml     # the README's command, plus the XML
    python scripts/suite_times.py /tmp/suite.xml --publish

The run's wall time is pytest's own, from the XML (its session's duration). Below the table comes every earlier run
of the same command that this section has published, read from docs/testing.md's git history: the wall time of one
run depends on the host, and the history shows on which hosts it was measured.

--publish also writes tests/module_seconds.json, each module's measured seconds, which tests/conftest.py's
scheduler reads to hand the two workers the longest modules first (so neither ends the run alone on one).

Times are each test's setup + call + teardown as pytest measured them; with several workers (pytest-xdist) they
add up to more than the wall time, which is why the wall time is given apart.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import machine, publish  # noqa: E402


def read(xml_path: Path) -> list[tuple[str, str, float, str]]:
    """(folder, module, seconds, outcome) per test case."""
    rows = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        folder = module[1] if len(module) > 2 and module[0] == "tests" else "tests"
        name = ".".join(module[:3]) if len(module) > 2 else ".".join(module)
        outcome = "skipped" if case.find("skipped") is not None else \
            "failed" if case.find("failure") is not None or case.find("error") is not None else "passed"
        rows.append((folder, name, float(case.get("time", 0.0)), outcome))
    return rows


def wall_seconds(xml_path: Path) -> float | None:
    """The run's wall time as pytest measured it: the test suite's `time`, its session's duration."""
    root = ET.parse(xml_path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return float(suite.get("time")) if suite is not None and suite.get("time") else None


# what publish wrote: its header line (the date and the machine) and the table's first line (the command and result)
HEADER = re.compile(r"^_Written by .*? on (\d{4}-\d{2}-\d{2}); ([^;]+);", re.M)
RESULT = re.compile(r"^From `([^`]+)` on a clean clone[^:]*: (.+?); the tests' own times add up to ([\d.]+) min; "
                    r"the run's wall time ([\d.]+) min\.", re.M)


def published_runs(doc: Path, command: str, root: Path = ROOT) -> list[tuple[str, str, str, str, str]]:
    """(date, machine, result, tests' own minutes, wall minutes) of every run of `command` this section has
    published, newest first, read from the git history of `doc` (one row per run, however many commits kept it)."""
    try:
        path = doc.relative_to(root).as_posix()
        log = subprocess.run(["git", "-C", str(root), "log", "--format=%H", "--", path],
                             capture_output=True, text=True, timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    runs = []
    for commit in log:
        shown = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{path}"],
                               capture_output=True, text=True, timeout=60)
        start = shown.stdout.find("<!-- bench:suite-times start -->")
        header, result = HEADER.search(shown.stdout, start), RESULT.search(shown.stdout, start)
        if start < 0 or not header or not result or result.group(1) != command:
            continue
        run = (header.group(1), header.group(2), result.group(2), result.group(3), result.group(4))
        if run not in runs:
            runs.append(run)
    return runs


def history(runs) -> str:
    lines = ["This run and every earlier one of the same command that this section published (from docs/testing.md's "
             "git history, newest first; the machine as each run's header named it):", "",
             "| Date | Machine | Result | Tests' own time (min) | Wall time (min) |", "|---|---|---|---:|---:|"]
    lines += [f"| {date} | {machine} | {result} | {own} | {wall} |" for date, machine, result, own, wall in runs]
    return "\n".join(lines)


def table(rows, wall: float | None, slowest: int = 10) -> str:
    by_folder = defaultdict(lambda: [0, 0.0])
    by_module = defaultdict(float)
    outcomes = defaultdict(int)
    for folder, module, seconds, outcome in rows:
        by_folder[folder][0] += 1
        by_folder[folder][1] += seconds
        by_module[module] += seconds
        outcomes[outcome] += 1
    total = sum(s for _, s in by_folder.values())
    lines = ["| Folder | Tests | Time (min) | Share |", "|---|---:|---:|---:|"]
    for folder, (n, seconds) in sorted(by_folder.items(), key=lambda kv: -kv[1][1]):
        name = "tests" if folder == "tests" else "tests/" + folder
        lines.append(f"| `{name}/` | {n} | {seconds / 60:.1f} | {seconds / total:.0%} |")
    lines.append(f"| all | {sum(n for n, _ in by_folder.values())} | {total / 60:.1f} | 100% |")
    lines += ["", f"The {slowest} slowest modules:", "", "| Module | Time (s) |", "|---|---:|"]
    for module, seconds in sorted(by_module.items(), key=lambda kv: -kv[1])[:slowest]:
        lines.append(f"| `{module.replace('.', '/')}.py` | {seconds:.0f} |")
    summary = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
    wall_text = f"; the run's wall time {wall / 60:.1f} min" if wall else ""
    return f"{summary}; the tests' own times add up to {total / 60:.1f} min{wall_text}.\n\n" + "\n".join(lines)


def module_seconds(rows) -> dict[str, float]:
    """Each module's seconds by its path (tests/core/test_x.py), as the scheduler names modules."""
    seconds = defaultdict(float)
    for _, module, s, _ in rows:
        seconds[module.replace(".", "/") + ".py"] += s
    return {module: round(s, 1) for module, s in sorted(seconds.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xml", type=Path)
    parser.add_argument("--run", default="python -m pytest -q -rs -n 2 tests",
                        help="the test command that made the XML, quoted in the section")
    parser.add_argument("--publish", action="store_true", help="write the table into docs/testing.md")
    args = parser.parse_args()
    rows = read(args.xml)
    body = f"From `{args.run}` on a clean clone (its JUnit XML, `--junitxml`): " + table(rows, wall_seconds(args.xml))
    this = RESULT.search(body)
    runs = [(datetime.date.today().isoformat(), machine().split("; ")[0], *this.groups()[1:])]
    runs += [run for run in published_runs(ROOT / "docs" / "testing.md", args.run) if run != runs[0]]
    body += "\n\n" + history(runs)
    print(body)
    if args.publish:
        publish("suite-times", body, doc=ROOT / "docs" / "testing.md")
        (ROOT / "tests" / "module_seconds.json").write_text(json.dumps(module_seconds(rows), indent=0) + "\n")


if __name__ == "__main__":
    main()
