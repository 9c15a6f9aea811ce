"""Load test of the app as users reach it: `python app.py` in a subprocess, driven through gradio_client.

  concurrent  --sessions clients at once, each calling generate, attention, positional_encoding and mask_demo
              (each client starting at a different one) for at most ROUNDS rounds or until --seconds have passed
  short       --short-sessions clients one after another, each a new connection making one /attention call
  switch      --switches calls of load_model, cycling through the default model, minilm-l6 and a third installed
              model when there is one (the server keeps two models in memory, so a third forces reloads); the
              server's RSS is read after each whole cycle through them
  patching    --patching-sessions clients one after another, each a new connection calling /patch_sweep,
              /logit_attribution and /flow_graph on the Patching tab's first preset (the IOI pair); the server's
              RSS growth divided by the sessions is what each one keeps (its States and its kept results)
  composition --compositions /composition_over calls at once (the Heads tab's "what feeds a head" job), each from
              a session of its own: the chosen head's keys traced over --composition-texts induction texts; first,
              one call on one text warms the server up (warm_up_composition)
  heavy       (with --heavy) long jobs, each client a session of its own: --heavy-sweeps /ablation_sweep calls,
              --heavy-attributions /attribute calls at --heavy-steps steps (on the Attention example's first 16
              tokens: the steps × tokens budget), --heavy-generations /generate calls of --heavy-tokens tokens
              (sampled, so that they run long), all at once, while short /attention calls from
              --heavy-short-sessions other sessions, taking turns, start about every --heavy-short-every seconds
              until the long jobs are done (few sessions: the short phase measures what each new one keeps);
              first, one short call of each kind warms the server up (see warm_up)

For each phase it prints the p50 and p95 latency per endpoint, the errors (every one is a failure, except "queue
full" from clients beyond the queue's limit, counted apart), and the server's resident memory before the phase,
at its peak (the server process's own high-water mark, VmHWM, reset as the phase starts and read as it ends:
common.PeakMemory with its pid; Linux, the same user), right after and --settle seconds after (the memory the
allocator gave back),
then one SUMMARY line per phase. With --publish the phases' table goes into the docs (publish in bench/common.py):
section load-ray with --backend ray, else load (load-heavy when the heavy phase runs alone, load-composition
when the composition phase does, load-bounds when
ATTN_SESSIONS or ATTN_KEPT_BUDGET_MB is set), or the one --section names; in whichever of docs/reliability.md and
docs/scaling.md holds that section's markers (else scaling.md for Ray, reliability.md for the local backend). The heavy phase also prints each long job's duration (from
submission: queueing included) and each generation's time to its first token and tokens/s. The server is always
stopped at the end; the exit status is 1 when any call failed.

With --backend ray the app runs its model work on a local Ray Serve instance (`python app.py --backend ray
--replicas N`), so both backends can be compared side by side; the RSS printed is then the front's alone (the
replicas are Ray's worker processes).

Usage: python bench/load.py [--sessions 16] [--short-sessions 200] [--switches 10] [--patching-sessions 20]
                            [--compositions 0 [--composition-texts 20] [--composition-layer L (the last)]]
                            [--seconds 300] [--settle 60]
                            [--model smollm2-135m-instruct] [--port 0 (a free one)] [--backend local|ray]
                            [--replicas 2] [--publish [--section NAME]]
                            [--heavy [--heavy-sweeps 2] [--heavy-attributions 1] [--heavy-steps 256]
                             [--heavy-generations 8] [--heavy-tokens 512] [--heavy-short-every 1]
                             [--heavy-short-sessions 4]
                             [--heavy-seconds 1200]]
  only the heavy phase: python bench/load.py --sessions 0 --short-sessions 0 --switches 0 --patching-sessions 0 --heavy
  only the patching phase: python bench/load.py --sessions 0 --short-sessions 0 --switches 0 --patching-sessions 20
  only the composition phase: python bench/load.py --sessions 0 --short-sessions 0 --switches 0 --patching-sessions 0
                             --compositions 8
"""

from __future__ import annotations

import argparse
import os
import re
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

from common import DOCS, PeakMemory, add_publish, md_table, publish, status_bytes

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "assets" / "examples"
ROUNDS = 3  # rounds of the four endpoints per concurrent session, at most
START_TIMEOUT_S = 600  # the first start may pull the default model
SWITCH_MODEL = "minilm-l6"
GENERATE_TOKENS = 16
ATTRIBUTION_POSITION = 15  # the heavy phase's attributions read 16 tokens: 256 steps × 16 is the tab's budget
STATS = re.compile(r"\*\*(\d+)\*\* tokens in ([\d.]+) s, \*\*([\d.]+) tokens/s\*\*; (.*)")  # the Generate stats line


# ---------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, log_path: Path, backend: list[str] = (),
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python app.py` on the loopback; env: variables to add to (or, with None values, take from) this one's."""
    env = {k: v for k, v in dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1",
                                 **(env or {})).items() if v is not None}
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
    """The process's resident set now (VmRSS), or None once it is gone: a point reading, never a peak (peaks are
    the kernel's high-water mark, PeakMemory)."""
    return status_bytes("VmRSS", pid)


# ---------------------------------------------------------------- calls


class Results:
    """Latencies per endpoint and the errors of one phase, filled by many threads."""

    def __init__(self):
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: list[tuple[str, str]] = []
        self.queue_full: list[str] = []
        self.notes: list[str] = []  # lines a phase adds to its report
        self.sessions = 0  # sessions a phase opened one after another: its RSS growth is reported per session
        self.session_rss: list[int] = []  # the server's RSS after each of them, where the phase reads it
        self._lock = threading.Lock()

    def call(self, client, endpoint: str, timeout: float, watch=None, **kwargs):
        """One call; its latency, or its error, is recorded. watch(job, deadline), when given, runs in this thread
        while the job does (it may follow the job's outputs). Returns the job's result, or None if it failed."""
        from gradio_client.exceptions import AppError  # noqa: PLC0415
        from gradio_client.utils import QueueError  # noqa: PLC0415

        started = time.perf_counter()
        job = client.submit(api_name=f"/{endpoint}", **kwargs)
        try:
            if watch is not None:
                watch(job, time.monotonic() + timeout)
            result = job.result(timeout=max(1.0, timeout - (time.perf_counter() - started)))
        except QueueError:
            with self._lock:
                self.queue_full.append(endpoint)
            return None
        except TimeoutError:
            job.cancel()
            self.error(endpoint, f"no answer within {timeout:.0f} s")
            return None
        except AppError as exc:
            self.error(endpoint, f"AppError: {exc}")
            return None
        except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
            self.error(endpoint, f"{type(exc).__name__}: {exc}")
            return None
        with self._lock:
            self.latency[endpoint].append(time.perf_counter() - started)
        return result

    def error(self, endpoint: str, message: str) -> None:
        with self._lock:
            self.errors.append((endpoint, message[:300]))


def arguments(model: str, texts: dict[str, str]) -> dict[str, dict]:
    """Each endpoint's arguments by name (docs/app.md's API table), on the example texts the page opens with."""
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
    results.sessions = done
    return f"{done} sessions in a row, one /attention each"


def patching_phase(url: str, args, texts: dict[str, str], results: Results) -> str:
    """New sessions one after another, each calling the Patching tab's three endpoints on its first preset."""
    sys.path.insert(0, str(ROOT))
    from ui.services.patching import DEFAULT_THRESHOLD, PRESETS  # noqa: PLC0415 - the tab's own pair

    name, (clean, corrupted) = next(iter(PRESETS.items()))
    pair = dict(model_name=args.model, clean_prompt=clean, corrupted_prompt=corrupted, answer_token="",
                foil_token="")
    calls = [("patch_sweep", dict(pair, site="resid_pre", mode="denoise", layer_index=0)),
             ("logit_attribution", pair),
             ("flow_graph", dict(model_name=args.model, clean_prompt=clean, threshold=DEFAULT_THRESHOLD))]
    deadline = time.monotonic() + args.seconds
    done = 0
    for _ in range(args.patching_sessions):
        if deadline - time.monotonic() <= 0:
            break
        try:
            client = connect(url, results)
        except Exception as exc:  # noqa: BLE001
            results.error("(connect)", f"{type(exc).__name__}: {exc}")
            continue
        for endpoint, call in calls:
            results.call(client, endpoint, max(1.0, deadline - time.monotonic()), **call)
        client.close()
        done += 1
        results.session_rss.append(rss_bytes(args.server_pid) or 0)
    results.sessions = done
    return f"{done} sessions in a row, each /patch_sweep, /logit_attribution and /flow_graph on {name!r}"


def installed_models() -> list[str]:
    folder = ROOT / "weights"
    return sorted(p.name for p in folder.iterdir() if (p / "config.json").is_file()) if folder.is_dir() else []


def switch_phase(url: str, args, texts: dict[str, str], results: Results) -> str:
    names = [args.model] + [n for n in (SWITCH_MODEL,) if n != args.model]
    third = [n for n in installed_models() if n not in names]
    names += third[:1]
    deadline = time.monotonic() + args.seconds
    client = connect(url, results)
    done, cycles = 0, []
    for i in range(args.switches):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        results.call(client, "load_model", left, model_name=names[(i + 1) % len(names)])
        done += 1
        if done % len(names) == 0:  # every model loaded once more: back on the one it started with
            cycles.append(rss_bytes(args.server_pid) or 0)
    if cycles:
        results.notes.append(f"switch: server RSS after each cycle through the {len(names)} models: "
                             + ", ".join(mb(c) for c in cycles))
    # leave the server on the model it started with, as a user would find it
    results.call(client, "load_model", max(1.0, deadline - time.monotonic()), model_name=args.model)
    return f"{done} switches of load_model through {', '.join(names)}"


def last_layer(model: str) -> int:
    """The last layer of an installed model (its config.json as the core reads it): the composition phase's default
    head traces every earlier layer's heads."""
    sys.path.insert(0, str(ROOT))
    from core.loading import read_config  # noqa: PLC0415

    return read_config(ROOT / "weights" / model)[0].n_layers - 1


def composition_call(args, n: int) -> dict:
    return dict(model_name=args.model, layer_index=args.composition_layer, head_index=0, side="key", n=n)


def warm_up_composition(url: str, args, results: Results) -> None:
    """One /composition_over on one text, so that the phase's "before" is a server that has run the job once (the
    weights' pages read in, the job's code paths imported); its latency is not the phase's."""
    warm = Results()
    client = connect(url, warm)
    warm.call(client, "composition_over", 300, **composition_call(args, 1))
    client.close()
    results.errors.extend(warm.errors)


def composition_phase(url: str, args, texts: dict[str, str], results: Results) -> str:
    """--compositions /composition_over calls at once, each from a session of its own (the server runs them in its
    heavy slots, the others waiting in the queue)."""
    call = composition_call(args, args.composition_texts)
    deadline = time.monotonic() + args.seconds

    def session(_: int) -> None:
        try:
            client = connect(url, results)
        except Exception as exc:  # noqa: BLE001
            results.error("(connect)", f"{type(exc).__name__}: {exc}")
            return
        results.call(client, "composition_over", max(1.0, deadline - time.monotonic()), **call)
        client.close()

    with ThreadPoolExecutor(args.compositions) as pool:
        list(pool.map(session, range(args.compositions)))
    return (f"{args.compositions} /composition_over calls at once, each from its own session: L{args.composition_layer}"
            f" H0's keys over {args.composition_texts} induction texts")


def first_token(started: float, record: dict):
    """A watch for Results.call on /generate: the seconds from `started` to the first output that has a token
    (text in the continuation, or a stats line counting one: a first token may end the text)."""

    def written(output) -> bool:
        found = STATS.search(output[1] or "") if output and len(output) > 1 else None
        return bool(output and output[0]) or bool(found and int(found[1]) > 0)

    def watch(job, deadline: float) -> None:
        while time.monotonic() < deadline:
            done = job.done()
            if any(written(output) for output in job.outputs()):
                record["first"] = time.perf_counter() - started
                return
            if done:
                return
            time.sleep(0.05)

    return watch


def warm_up(url: str, args, texts: dict[str, str], results: Results) -> None:
    """One short call of each kind the heavy phase makes, so that its "before" counts the pages of the memory-mapped
    weights (read on first use, then kept by the kernel's page cache) as a server that has served once holds them;
    the latencies are not the phase's."""
    calls, warm = arguments(args.model, texts), Results()
    client = connect(url, warm)
    warm.call(client, "attention", 300, **calls["attention"])
    warm.call(client, "generate", 300, **dict(calls["generate"], max_new_tokens=4))
    warm.call(client, "attribute", 300, model_name=args.model, text_value=texts["attention"],
              position_index=ATTRIBUTION_POSITION, layer_index=0, head_index=0, steps_value=1)
    client.close()
    results.errors.extend(warm.errors)


def heavy_phase(url: str, args, texts: dict[str, str], results: Results) -> str:
    """Long jobs from sessions of their own, all at once, while short /attention calls keep coming. The sweeps
    read their full 128 tokens (the Attention example, repeated); the generations continue the example text,
    sampled, so that few end before their token budget."""
    deadline = time.monotonic() + args.heavy_seconds
    model, sweep_text = args.model, " ".join([texts["attention"]] * 4)
    generations: list[dict] = []
    heavy_done = threading.Event()

    def sweep(_: int) -> None:
        client = connect(url, results)
        results.call(client, "ablation_sweep", deadline - time.monotonic(), model_name=model, text_value=sweep_text,
                     ablation_kind="zero", score_name="previous_token")

    def attribute(_: int) -> None:
        client = connect(url, results)
        results.call(client, "attribute", deadline - time.monotonic(), model_name=model, text_value=sweep_text,
                     position_index=ATTRIBUTION_POSITION, layer_index=0, head_index=0, steps_value=args.heavy_steps)

    def generate(index: int) -> None:
        client = connect(url, results)
        record: dict = {"client": index}
        started = time.perf_counter()
        call = dict(arguments(model, texts)["generate"], prompt_text=texts["attention"], chat_mode=False,
                    max_new_tokens=args.heavy_tokens, temperature_value=0.8, top_p_value=0.95, seed_value=index)
        result = results.call(client, "generate", deadline - time.monotonic(), watch=first_token(started, record),
                              **call)
        record["seconds"] = time.perf_counter() - started
        found = STATS.search(result[1]) if result else None
        if found:
            record.update(tokens=int(found[1]), writing=float(found[2]), tokens_per_s=float(found[3]),
                          stop=found[4].strip())
        with results._lock:
            generations.append(record)

    def short_calls() -> None:
        call = arguments(model, texts)["attention"]
        clients = [connect(url, results) for _ in range(args.heavy_short_sessions)]
        turn = 0
        while clients and not heavy_done.is_set() and time.monotonic() < deadline:
            tick = time.monotonic()
            results.call(clients[turn % len(clients)], "attention", deadline - time.monotonic(), **call)
            turn += 1
            heavy_done.wait(max(0.0, args.heavy_short_every - (time.monotonic() - tick)))
        for client in clients:
            client.close()

    jobs = ([(sweep, i) for i in range(args.heavy_sweeps)] + [(attribute, i) for i in range(args.heavy_attributions)]
            + [(generate, i) for i in range(args.heavy_generations)])
    with ThreadPoolExecutor(len(jobs) + 1) as pool:
        shorts = pool.submit(short_calls)
        for future in [pool.submit(fn, i) for fn, i in jobs]:
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001 - a client that could not connect
                results.error("(connect)", f"{type(exc).__name__}: {exc}")
        heavy_done.set()
        shorts.result()
    for record in sorted(generations, key=lambda r: r["client"]):
        first = f"{record['first']:.1f} s" if "first" in record else "never"
        made = (f"{record['tokens']} tokens at {record['tokens_per_s']:.1f} tokens/s ({record['stop']})"
                if "tokens" in record else "no stats (failed)")
        results.notes.append(f"generation {record['client']}: first token after {first}, {made}, "
                             f"{record['seconds']:.1f} s from submission")
    firsts = [r["first"] for r in generations if "first" in r]
    if firsts:
        results.notes.append(f"generations' time to first token: p50 {percentile(firsts, 50):.1f} s, max "
                             f"{max(firsts):.1f} s; {len(generations) - len(firsts)} never wrote one")
    return (f"{args.heavy_sweeps} ablation sweeps, {args.heavy_attributions} attributions at {args.heavy_steps} "
            f"steps, {args.heavy_generations} generations of {args.heavy_tokens} tokens, each from its own session, "
            f"with short /attention calls every {args.heavy_short_every:g} s from {args.heavy_short_sessions} "
            "other sessions")


# ---------------------------------------------------------------- report


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with few calls it is one of the measured latencies, never an interpolation."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def report(phase: str, what: str, seconds: float, results: Results,
           rss: tuple[int, int | None, int, int | None], settle: float, table: list | None = None) -> str:
    """rss: the server's RSS before the phase, its peak during it (VmHWM; None where it could not be read back:
    the server died), right after, and --settle seconds after (None: not read). Appends the phase's markdown row
    (and its notes) to `table` when one is given."""
    before, peak, after, settled = rss
    top = mb(peak) if peak is not None else "unknown (the server is gone)"
    print(f"\n== {phase}: {what}, {seconds:.1f} s")
    print(f"  {'endpoint':<22}{'calls':>6}{'p50 s':>9}{'p95 s':>9}{'max s':>9}")
    for endpoint, values in sorted(results.latency.items()):
        print(f"  {endpoint:<22}{len(values):>6}{percentile(values, 50):>9.2f}{percentile(values, 95):>9.2f}"
              f"{max(values):>9.2f}")
    refused = ", ".join(f"{e} {results.queue_full.count(e)}" for e in sorted(set(results.queue_full)))
    print(f"  errors: {len(results.errors)}; queue full (beyond the queue's limit): {len(results.queue_full)}"
          + (f" ({refused})" if refused else ""))
    for endpoint, message in sorted(set(results.errors))[:10]:
        print(f"    {endpoint}: {message}")
    for line in results.notes:
        print(f"  {line}")
    later = f", {mb(settled)} {settle:.0f} s after" if settled is not None else ""
    print(f"  server RSS: {mb(before)} before, {top} peak (VmHWM), {mb(after)} after{later}")
    per_session = ""
    if results.sessions:
        grown = ((settled if settled is not None else after) - before) / results.sessions
        per_session = f"; RSS per session {grown / 2**20:+.2f} MB"
        print(f"  RSS growth per session: {grown / 2**20:+.2f} MB ({results.sessions} sessions"
              + (f", {settle:.0f} s after" if settled is not None else ", right after") + ")")
    if len(results.session_rss) >= 3:  # the first session warms up (the allocator keeps its activations' memory)
        first, last = results.session_rss[0], results.session_rss[-1]
        marginal = (last - first) / (len(results.session_rss) - 1)
        per_session += f" ({marginal / 2**20:+.2f} MB each after the first)"
        print(f"  after the first session: {marginal / 2**20:+.2f} MB per further session (RSS {mb(first)} after "
              f"the first, {mb(last)} after the last)")
    latencies = ", ".join(
        f"{endpoint} p50 {percentile(v, 50):.2f} s / p95 {percentile(v, 95):.2f} s ({len(v)})"
        for endpoint, v in sorted(results.latency.items()) if not endpoint.startswith("(")
    )
    later = f" → {mb(settled)} {settle:.0f} s after" if settled is not None else ""
    if table is not None:
        calls = ", ".join(f"{e} {len(v)}" for e, v in sorted(results.latency.items()) if not e.startswith("("))
        lat = ", ".join(f"{e} {percentile(v, 50):.2f} / {percentile(v, 95):.2f} / {max(v):.2f} s"
                        for e, v in sorted(results.latency.items()))
        table.append(([f"{phase}: {what} ({seconds:.0f} s)", calls, lat,
                       f"{len(results.errors)} (queue full: {len(results.queue_full)})",
                       f"{mb(before)} → {top} → {mb(after)}" + (f" → {mb(settled)}" if settled is not None else ""),
                       per_session.removeprefix("; RSS per session ") or "–"], list(results.notes)))
    return (f"SUMMARY {phase}: {what}; {latencies}; errors {len(results.errors)}, queue full "
            f"{len(results.queue_full)}; RSS {mb(before)} → {top} peak (VmHWM) → {mb(after)}{later}{per_session}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=16, help="concurrent sessions (default 16)")
    parser.add_argument("--short-sessions", type=int, default=200, help="short sessions in a row (default 200)")
    parser.add_argument("--switches", type=int, default=10, help="load_model calls (default 10)")
    parser.add_argument("--patching-sessions", type=int, default=20,
                        help="sessions in a row, each calling the Patching tab's three endpoints (default 20)")
    parser.add_argument("--compositions", type=int, default=0,
                        help="/composition_over calls at once, each from its own session (default 0: no such phase)")
    parser.add_argument("--composition-texts", type=int, default=20,
                        help="induction texts each composition reads (default 20, the Heads tab's)")
    parser.add_argument("--composition-layer", type=int, default=None,
                        help="the traced head's layer (default: the model's last; head 0, its keys)")
    parser.add_argument("--seconds", type=float, default=300.0, help="time limit of each phase (default 300)")
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds after each phase at which RSS is read again (default 60; 0: not read)")
    heavy = parser.add_argument_group("the heavy phase (off unless --heavy)")
    heavy.add_argument("--heavy", action="store_true", help="run the heavy phase after the others")
    heavy.add_argument("--heavy-sweeps", type=int, default=2, help="/ablation_sweep clients (default 2)")
    heavy.add_argument("--heavy-attributions", type=int, default=1, help="/attribute clients (default 1)")
    heavy.add_argument("--heavy-steps", type=int, default=256, help="integrated gradients' steps (default 256)")
    heavy.add_argument("--heavy-generations", type=int, default=8, help="/generate clients (default 8)")
    heavy.add_argument("--heavy-tokens", type=int, default=512, help="tokens each generation asks for (default 512)")
    heavy.add_argument("--heavy-short-every", type=float, default=1.0,
                       help="seconds between the starts of the short /attention calls (default 1)")
    heavy.add_argument("--heavy-short-sessions", type=int, default=4,
                       help="sessions the short /attention calls take turns in (default 4)")
    heavy.add_argument("--heavy-seconds", type=float, default=1200.0,
                       help="time limit of the heavy phase (default 1200)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="the model the app starts on")
    parser.add_argument("--port", type=int, default=0, help="port for the app (default: a free one)")
    parser.add_argument("--backend", choices=("local", "ray"), default="local",
                        help="the app's model work in its own process (default) or on a local Ray Serve instance")
    parser.add_argument("--replicas", type=int, default=2, help="with --backend ray: replicas of the model (default 2)")
    add_publish(parser)
    parser.add_argument("--section", default=None, help="with --publish: the section's name (default: see above)")
    args = parser.parse_args()
    for name in ("sessions", "short_sessions", "switches", "patching_sessions", "compositions", "heavy_sweeps",
                 "heavy_attributions", "heavy_generations"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be 0 or more")
    for name in ("seconds", "heavy_seconds", "heavy_short_every", "heavy_steps", "heavy_tokens",
                 "heavy_short_sessions", "composition_texts"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.settle < 0:
        parser.error("--settle must be 0 or more")
    if args.compositions and args.composition_layer is None:
        args.composition_layer = last_layer(args.model)

    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}/"
    texts = read_texts()
    log_path = Path(tempfile.gettempdir()) / f"attention-explorer-load-{port}.log"
    started = time.perf_counter()
    backend = ["--backend", "ray", "--replicas", str(args.replicas)] if args.backend == "ray" else []
    proc = start_server(args.model, port, log_path, backend)
    args.server_pid = proc.pid  # the phases that read the server's RSS after each session
    summaries, failed, table, start_s = [], False, [], None
    try:
        wait_until_up(proc, url, log_path)
        start_s = time.perf_counter() - started
        print(f"app up at {url} ({args.model}, backend {' '.join(backend[1:]) or 'local'}) in "
              f"{time.perf_counter() - started:.1f} s; server log: {log_path}")
        phases = [
            ("concurrent", concurrent_phase, args.sessions),
            ("short", short_phase, args.short_sessions),
            ("switch", switch_phase, args.switches),
            ("patching", patching_phase, args.patching_sessions),
            ("composition", composition_phase, args.compositions),
            ("heavy", heavy_phase, int(args.heavy)),
        ]
        for phase, run, count in phases:
            if count == 0:
                continue
            results = Results()
            if phase == "composition":
                cold = rss_bytes(proc.pid) or 0
                warm_up_composition(url, args, results)
                print(f"\ncomposition phase: warmed up (one /composition_over on one text): RSS {mb(cold)} → "
                      f"{mb(rss_bytes(proc.pid) or 0)}")
            if phase == "heavy":
                cold = rss_bytes(proc.pid) or 0
                warm_up(url, args, texts, results)
                print(f"\nheavy phase: warmed up (one /attention, a 4-token /generate, a 1-step /attribute): RSS "
                      f"{mb(cold)} → {mb(rss_bytes(proc.pid) or 0)}, the weights' memory-mapped pages read in")
            with PeakMemory("cpu", pid=proc.pid, required=True) as peak:  # the server's, not this client's
                t0 = time.perf_counter()
                what = run(url, args, texts, results)
                seconds = time.perf_counter() - t0
            after = rss_bytes(proc.pid) or 0
            settled = None
            if args.settle > 0 and proc.poll() is None:
                time.sleep(args.settle)  # idle: what the allocator gives back
                settled = rss_bytes(proc.pid)
            summaries.append(report(phase, what, seconds, results, (peak.before or 0, peak.peak, after, settled),
                                   args.settle, table))
            failed |= bool(results.errors)
            if proc.poll() is not None:
                print(f"the app died during the {phase} phase (status {proc.returncode}):\n{tail(log_path)}")
                failed = True
                break
    finally:
        stop_server(proc)
    print()
    for line in summaries:
        print(line)
    if args.publish and table:
        publish_table(args, table, start_s, failed)
    return 1 if failed else 0


def publish_table(args, table: list, start_s: float | None, failed: bool) -> None:
    """The run's phases as one markdown table, its notes (the heavy phase's per-job lines) below, into the docs."""
    bounds = any(os.environ.get(k) for k in ("ATTN_SESSIONS", "ATTN_KEPT_BUDGET_MB"))
    others = args.sessions or args.short_sessions or args.switches or args.patching_sessions
    heavy_alone = args.heavy and not (others or args.compositions)
    composition_alone = args.compositions and not (others or args.heavy)
    name = args.section or ("load-ray" if args.backend == "ray" else "load-heavy" if heavy_alone
                            else "load-composition" if composition_alone
                            else "load-bounds" if bounds else "load")
    holding = [doc for doc in (DOCS / "reliability.md", DOCS / "scaling.md")
               if f"<!-- bench:{name} start -->" in doc.read_text(encoding="utf-8")]
    doc = holding[0] if holding else DOCS / ("scaling.md" if args.backend == "ray" else "reliability.md")
    where = (f"the Ray backend ({args.replicas} replicas; the RSS is the front's alone)" if args.backend == "ray"
             else "the local backend")
    body = (f"`python app.py` on {args.model}, {where}, up in {start_s:.0f} s; latencies p50 / p95 / max per endpoint "
            f"(nearest rank); server RSS before the phase → its peak (the server's VmHWM over the phase) → right "
            f"after" + (f" → {args.settle:.0f} s after" if args.settle > 0 else "") + "."
            + (" **Some calls failed** (see the errors column)." if failed else "") + "\n\n" +
            md_table(["phase", "calls", "latency p50 / p95 / max", "errors", "server RSS", "RSS per session"],
                     [row for row, _ in table], ["---", "---", "---", "---", "---", "---"]))
    notes = [note for _, phase_notes in table for note in phase_notes]
    if notes:
        body += "\n\n" + "\n".join(f"- {note}" for note in notes)
    publish(name, body, doc=doc)


if __name__ == "__main__":
    sys.exit(main())
