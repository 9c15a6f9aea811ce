"""Load test of the app as users reach it: `python app.py` in a subprocess, driven through gradio_client.

  concurrent  --sessions clients at once, each calling generate, attention, positional_encoding and mask_demo
              (each client starting at a different one) for at most ROUNDS rounds or until --seconds have passed
  short       --short-sessions clients one after another, each a new connection making one /attention call
  switch      --switches calls of load_model, cycling through the default model, minilm-l6 and a third installed
              model when there is one (the server keeps two models in memory, so a third forces reloads)

For each phase it prints the p50 and p95 latency per endpoint, the errors (every one is a failure, except "queue
full" from clients beyond the queue's limit, counted apart), and the server's resident memory before the phase,
at its peak (sampled every 0.2 s) and after, then one SUMMARY line per phase for the README. The server is always
stopped at the end; the exit status is 1 when any call failed.

With --backend ray the app runs its model work on a local Ray Serve instance (`python app.py --backend ray
--replicas N`), so both backends can be compared side by side; the RSS printed is then the front's alone (the
replicas are Ray's worker processes).

Usage: python bench/load.py [--sessions 16] [--short-sessions 200] [--switches 10] [--seconds 300]
                            [--model smollm2-135m-instruct] [--port 0 (a free one)] [--backend local|ray]
                            [--replicas 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "assets" / "examples"
ROUNDS = 3  # rounds of the four endpoints per concurrent session, at most
START_TIMEOUT_S = 600  # the first start may pull the default model
SWITCH_MODEL = "minilm-l6"
GENERATE_TOKENS = 16


# ---------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, log_path: Path, backend: list[str] = ()) -> subprocess.Popen:
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:  # a file, not a pipe: a full pipe would stall the server
        return subprocess.Popen(
            [sys.executable, "app.py", "--model", model, "--host", "127.0.0.1", "--port", str(port), *backend],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )


def wait_until_up(proc: subprocess.Popen, url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the app exited with status {proc.returncode} before serving:\n{tail(log_path)}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the app did not answer at {url} within {START_TIMEOUT_S} s:\n{tail(log_path)}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def rss_bytes(pid: int) -> int | None:
    """The process's resident set (VmRSS), or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil  # noqa: PLC0415 - where there is no /proc

        return psutil.Process(pid).memory_info().rss
    except Exception:  # noqa: BLE001 - no psutil, or the process is gone
        return None


class MemorySampler:
    """The server's RSS every `interval` seconds in a thread; `peak` since the last reset()."""

    def __init__(self, pid: int, interval: float = 0.2):
        self.pid, self.interval = pid, interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            value = rss_bytes(self.pid)
            if value is not None:
                self.peak = max(self.peak, value)

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def reset(self) -> int:
        now = rss_bytes(self.pid) or 0
        self.peak = now
        return now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------- calls


class Results:
    """Latencies per endpoint and the errors of one phase, filled by many threads."""

    def __init__(self):
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: list[tuple[str, str]] = []
        self.queue_full: list[str] = []
        self._lock = threading.Lock()

    def call(self, client, endpoint: str, timeout: float, **kwargs) -> None:
        from gradio_client.exceptions import AppError  # noqa: PLC0415
        from gradio_client.utils import QueueError  # noqa: PLC0415

        started = time.perf_counter()
        job = client.submit(api_name=f"/{endpoint}", **kwargs)
        try:
            job.result(timeout=max(1.0, timeout))
        except QueueError:
            with self._lock:
                self.queue_full.append(endpoint)
            return
        except TimeoutError:
            job.cancel()
            self.error(endpoint, f"no answer within {timeout:.0f} s")
            return
        except AppError as exc:
            self.error(endpoint, f"AppError: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
            self.error(endpoint, f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self.latency[endpoint].append(time.perf_counter() - started)

    def error(self, endpoint: str, message: str) -> None:
        with self._lock:
            self.errors.append((endpoint, message[:300]))


def arguments(model: str, texts: dict[str, str]) -> dict[str, dict]:
    """Each endpoint's arguments by name (README's API table), on the example texts the page opens with."""
    return {
        "generate": dict(model_name=model, prompt_text=texts["generate"], chat_mode=True,
                         max_new_tokens=GENERATE_TOKENS, temperature_value=0.0, top_k_value=0, top_p_value=1.0,
                         seed_value=0),
        "attention": dict(model_name=model, text_value=texts["attention"], layer_index=0, head_index="mean of heads",
                          hide_special_tokens=False, window_query_start=0, window_key_start=0, window_size=64),
        "positional_encoding": dict(model_name=model, n_positions=128, d_model=64, start_position=0, offset=5,
                                    layer_index=0, head_index=0, text_value=texts["attention"]),
        "mask_demo": dict(model_name=model, text_value=texts["masks"], layer_index=0, head_index=0, window_start=0,
                          window_size=12, longer_text=texts["padding_long"], shorter_text=texts["padding_short"]),
    }


def read_texts() -> dict[str, str]:
    names = ("generate", "attention", "masks", "padding_long", "padding_short")
    return {name: (EXAMPLES / f"{name}.txt").read_text(encoding="utf-8").strip() for name in names}


def connect(url: str, results: Results):
    from gradio_client import Client  # noqa: PLC0415

    started = time.perf_counter()
    client = Client(url, verbose=False)
    with results._lock:
        results.latency["(connect)"].append(time.perf_counter() - started)
    return client


def concurrent_phase(url: str, args, texts: dict[str, str], results: Results) -> str:
    calls = arguments(args.model, texts)
    order = list(calls)
    deadline = time.monotonic() + args.seconds

    def session(index: int) -> None:
        try:
            client = connect(url, results)
        except Exception as exc:  # noqa: BLE001
            results.error("(connect)", f"{type(exc).__name__}: {exc}")
            return
        mine = order[index % len(order):] + order[: index % len(order)]  # sessions start on different endpoints
        for _ in range(ROUNDS):
            for endpoint in mine:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                results.call(client, endpoint, left, **calls[endpoint])

    with ThreadPoolExecutor(args.sessions) as pool:
        list(pool.map(session, range(args.sessions)))
    return f"{args.sessions} sessions at once, {ROUNDS} rounds of {len(order)} endpoints at most"


def short_phase(url: str, args, texts: dict[str, str], results: Results) -> str:
    call = arguments(args.model, texts)["attention"]
    deadline = time.monotonic() + args.seconds
    done = 0
    for _ in range(args.short_sessions):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            client = connect(url, results)
        except Exception as exc:  # noqa: BLE001
            results.error("(connect)", f"{type(exc).__name__}: {exc}")
            continue
        results.call(client, "attention", left, **call)
        client.close()
        done += 1
    return f"{done} sessions in a row, one /attention each"


def installed_models() -> list[str]:
    folder = ROOT / "weights"
    return sorted(p.name for p in folder.iterdir() if (p / "config.json").is_file()) if folder.is_dir() else []


def switch_phase(url: str, args, texts: dict[str, str], results: Results) -> str:
    names = [args.model] + [n for n in (SWITCH_MODEL,) if n != args.model]
    third = [n for n in installed_models() if n not in names]
    names += third[:1]
    deadline = time.monotonic() + args.seconds
    client = connect(url, results)
    done = 0
    for i in range(args.switches):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        results.call(client, "load_model", left, model_name=names[(i + 1) % len(names)])
        done += 1
    # leave the server on the model it started with, as a user would find it
    results.call(client, "load_model", max(1.0, deadline - time.monotonic()), model_name=args.model)
    return f"{done} switches of load_model through {', '.join(names)}"


# ---------------------------------------------------------------- report


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with few calls it is one of the measured latencies, never an interpolation."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def report(phase: str, what: str, seconds: float, results: Results, rss: tuple[int, int, int]) -> str:
    before, peak, after = rss
    print(f"\n== {phase}: {what}, {seconds:.1f} s")
    print(f"  {'endpoint':<22}{'calls':>6}{'p50 s':>9}{'p95 s':>9}{'max s':>9}")
    for endpoint, values in sorted(results.latency.items()):
        print(f"  {endpoint:<22}{len(values):>6}{percentile(values, 50):>9.2f}{percentile(values, 95):>9.2f}"
              f"{max(values):>9.2f}")
    print(f"  errors: {len(results.errors)}; queue full (beyond the queue's limit): {len(results.queue_full)}")
    for endpoint, message in sorted(set(results.errors))[:10]:
        print(f"    {endpoint}: {message}")
    print(f"  server RSS: {mb(before)} before, {mb(peak)} peak, {mb(after)} after")
    latencies = ", ".join(
        f"{endpoint} p50 {percentile(v, 50):.2f} s / p95 {percentile(v, 95):.2f} s ({len(v)})"
        for endpoint, v in sorted(results.latency.items()) if not endpoint.startswith("(")
    )
    return (f"SUMMARY {phase}: {what}; {latencies}; errors {len(results.errors)}, queue full "
            f"{len(results.queue_full)}; RSS {mb(before)} → {mb(peak)} peak → {mb(after)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=16, help="concurrent sessions (default 16)")
    parser.add_argument("--short-sessions", type=int, default=200, help="short sessions in a row (default 200)")
    parser.add_argument("--switches", type=int, default=10, help="load_model calls (default 10)")
    parser.add_argument("--seconds", type=float, default=300.0, help="time limit of each phase (default 300)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the model the app starts on")
    parser.add_argument("--port", type=int, default=0, help="port for the app (default: a free one)")
    parser.add_argument("--backend", choices=("local", "ray"), default="local",
                        help="the app's model work in its own process (default) or on a local Ray Serve instance")
    parser.add_argument("--replicas", type=int, default=2, help="with --backend ray: replicas of the model (default 2)")
    args = parser.parse_args()
    for name in ("sessions", "short_sessions", "switches"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be 0 or more")
    if args.seconds <= 0:
        parser.error("--seconds must be positive")

    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}/"
    texts = read_texts()
    log_path = Path(tempfile.gettempdir()) / f"attention-explorer-load-{port}.log"
    started = time.perf_counter()
    backend = ["--backend", "ray", "--replicas", str(args.replicas)] if args.backend == "ray" else []
    proc = start_server(args.model, port, log_path, backend)
    summaries, failed = [], False
    sampler = None
    try:
        wait_until_up(proc, url, log_path)
        print(f"app up at {url} ({args.model}, backend {' '.join(backend[1:]) or 'local'}) in "
              f"{time.perf_counter() - started:.1f} s; server log: {log_path}")
        sampler = MemorySampler(proc.pid).start()
        phases = [
            ("concurrent", concurrent_phase, args.sessions),
            ("short", short_phase, args.short_sessions),
            ("switch", switch_phase, args.switches),
        ]
        for phase, run, count in phases:
            if count == 0:
                continue
            results = Results()
            before = sampler.reset()
            t0 = time.perf_counter()
            what = run(url, args, texts, results)
            seconds = time.perf_counter() - t0
            time.sleep(0.5)  # let the sampler see the end of the phase
            after = rss_bytes(proc.pid) or 0
            summaries.append(report(phase, what, seconds, results, (before, max(sampler.peak, after), after)))
            failed |= bool(results.errors)
            if proc.poll() is not None:
                print(f"the app died during the {phase} phase (status {proc.returncode}):\n{tail(log_path)}")
                failed = True
                break
    finally:
        if sampler is not None:
            sampler.stop()
        stop_server(proc)
    print()
    for line in summaries:
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
