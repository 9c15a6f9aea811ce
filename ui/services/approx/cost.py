"""What the approximations cost in time, two ways. Published: one attention layer alone from 256 to 16,384 tokens,
each method beside exact attention, as bench/variants/approx_cost.py measured and shipped it
(assets/measured/approx_cost.json, the keys its docstring lists), with the lengths from which each approximation
is faster than its exact reference, as the bench found them. Live: the same kernels timed here, now, at short
lengths only, on random queries, keys and values of the loaded model's attention shape: each method beside SDPA, a
few calls alternating, medians. Long lengths take seconds a call, more than a page may spend: they are the
bench's. Never imports gradio."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from core.approx import METHODS, Approx, approximate
from core.attention import attention
from ui.services.checks import UserError

COST_MEASURED = Path(__file__).resolve().parents[3] / "assets" / "measured" / "approx_cost.json"
COST_COMMAND = "OMP_NUM_THREADS=1 python bench/variants/approx_cost.py --publish"   # writes COST_MEASURED
LIVE_LENGTHS = (256, 512)
LIVE_REPEATS = 5
APPROXIMATIONS = ("topk", "bigbird", "performer", "linformer")   # what the live timing runs of core.approx's kernels
EXACT = {"eager": "exact, the explicit path (n × n weights)", "sdpa": "exact, torch's fused kernel (SDPA)"}


@dataclass(frozen=True)
class MethodTimes:
    """One method's published times: the median and the range of its runs at each length it reached."""
    method: str
    words: str
    causal: bool
    lengths: tuple[int, ...]
    seconds: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]


@dataclass(frozen=True)
class PublishedCost:
    """The shipped bench run: where and how it ran, each method's times (the causal ones, then the bidirectional),
    and each approximation's crossover as the bench wrote it ({method, reference, n, interpolated_n, ratio, error,
    up_to, stays_below, words})."""
    date: str
    machine: str
    device: str
    threads: int
    command: str
    load: str
    shape: dict
    budgets: dict
    repeats: int
    methods: dict[str, MethodTimes]
    crossovers: tuple[dict, ...]

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def crossing(self, method: str) -> dict | None:
        return next((c for c in self.crossovers if c["method"] == method), None)


def published_cost(path: Path | None = None) -> PublishedCost | None:
    """The shipped run (COST_MEASURED, or `path`), or None where it has not been published; a damaged file is a
    UserError naming it and the command that writes it again."""
    path = COST_MEASURED if path is None else path
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        rows = sorted(raw["rows"], key=lambda r: int(r["n"]))
        methods = {}
        for name in [*raw["causal"], *raw["bidirectional"]]:
            reached = [r for r in rows if name in r["methods"]]
            if not reached:
                continue
            runs = [[float(s) for s in r["methods"][name]["seconds"]] for r in reached]
            methods[name] = MethodTimes(name, str(raw["methods"].get(name, name)), name in raw["causal"],
                                        tuple(int(r["n"]) for r in reached),
                                        tuple(statistics.median(s) for s in runs), tuple(min(s) for s in runs),
                                        tuple(max(s) for s in runs))
        for method in APPROXIMATIONS:      # the budgets the live timing reuses, checked as the core checks them
            Approx(method, **raw["budgets"].get(method, {}))
        return PublishedCost(str(raw["date"]), str(raw["machine"]), str(raw["device"]), int(raw["threads"]),
                             str(raw["command"]), str(raw.get("load", "")), dict(raw["shape"]), dict(raw["budgets"]),
                             int(raw["repeats"]), methods, tuple(dict(c) for c in raw["crossover"]))
    except (OSError, ValueError, KeyError, TypeError, statistics.StatisticsError) as error:
        raise UserError(f"{path.name} is not the run `{COST_COMMAND}` writes ({type(error).__name__}: {error}); run "
                        "that command again to remake it.") from None


NOT_PUBLISHED = (f"The cost figure has not been published yet: `{COST_COMMAND}` writes it "
                 f"(assets/measured/{COST_MEASURED.name}). The live timing below is this machine's, at short lengths "
                 "only.")


def published_words(cost: PublishedCost | None) -> str:
    """What the published run measured, where each approximation becomes faster than exact attention, and on which
    machine: this CPU's run says that a GPU's is not measured here, unless the run was a GPU's."""
    if cost is None:
        return NOT_PUBLISHED
    shape, lengths = cost.shape, sorted({n for m in cost.methods.values() for n in m.lengths})
    where = "; ".join(crossing_words(c) for c in cost.crossovers)
    device = (f"Measured on a GPU ({cost.machine})." if cost.on_gpu else
              f"Measured on the CPU the bench ran on: {cost.machine}"
              + ("" if "thread" in cost.machine else f", {cost.threads} thread{'' if cost.threads == 1 else 's'}")
              + ". What a GPU would change is not measured here.")
    return (f"Published: one attention layer alone at SmolLM2-135M's shape ({shape['heads']} query heads, "
            f"{shape['kv_heads']} key/value heads, d_head {shape['d_head']}), {shape.get('dtype', 'float32')}, causal "
            f"(Linformer and its reference bidirectional), random inputs, {lengths[0]:,}–{lengths[-1]:,} tokens, "
            f"median of {cost.repeats} runs with the methods alternating; {cost.date}"
            + (f", {cost.load}" if cost.load else "") + f". Where each approximation becomes faster: {where}. "
            "Those errors are on random inputs, where attention is diffuse and its output small, so they are far "
            f"larger than on a model's heads (the maps above are the loaded model's own). {device} Written by "
            f"`{cost.command}`.")


def crossing_words(c: dict) -> str:
    """One approximation's crossover as the bench found it: 'bigbird is faster than sdpa from 2,048 (≈ 1,700
    interpolated on log-log), its output's relative error there 0.31' or 'topk is not faster than sdpa up to 16,384'."""
    if c.get("n") is None:
        return (f"{c['method']} is not faster than {c['reference']}"
                + ("" if c.get("up_to") is None else f" up to {c['up_to']:,} tokens"))
    error = "" if c.get("error") is None else f", its output's relative error there {c['error']:.2g}"
    where = c["words"] if not c["words"][:1].isdigit() else f"from {c['words']}"     # "already at 256, …"
    return f"{c['method']} is faster than {c['reference']} {where}{error}"


def published_table(cost: PublishedCost | None) -> dict | None:
    """The published run as the `attention_cost` endpoint returns it."""
    if cost is None:
        return None
    return {"date": cost.date, "machine": cost.machine, "device": cost.device, "threads": cost.threads,
            "command": cost.command, "load": cost.load, "shape": cost.shape, "budgets": cost.budgets,
            "repeats": cost.repeats,
            "methods": {m.method: {"words": m.words, "causal": m.causal, "lengths": list(m.lengths),
                                   "median_seconds": list(m.seconds), "min_seconds": list(m.low),
                                   "max_seconds": list(m.high)} for m in cost.methods.values()},
            "crossover": list(cost.crossovers)}


# ---- live, at short lengths ----

@dataclass(frozen=True)
class LiveCost:
    """Each method's calls at each length, timed here: seconds[method][i] holds every repeat at lengths[i]."""
    model: str
    heads: int
    kv_heads: int
    d_head: int
    dtype: str
    device: str
    threads: int
    causal: bool
    lengths: tuple[int, ...]
    repeats: int
    budgets: dict
    seconds: dict[str, tuple[tuple[float, ...], ...]]

    def median(self, method: str) -> list[float]:
        return [statistics.median(s) for s in self.seconds[method]]

    def ratio(self, method: str) -> list[float]:
        """The method's median over SDPA's at each length."""
        return [a / b for a, b in zip(self.median(method), self.median("sdpa"))]


def live_budgets(cost: PublishedCost | None) -> dict:
    """The published run's budgets, so that the live numbers compare with it; core.approx's defaults without one."""
    chosen = {}
    for method in APPROXIMATIONS:
        given = (cost.budgets.get(method, {}) if cost is not None else {})
        chosen[method] = {name: given.get(name, default) for name, default in METHODS[method].items()
                          if name in given or name not in ("seed", "fit")}
    return chosen


def live_calls(causal: bool, budgets: dict) -> dict:
    """method → call(q, k, v): exact attention both ways and each approximation's kernel (core.approx.approximate);
    Linformer only without a causal mask (it has no causal form)."""
    approxes = {m: Approx(m, **budgets[m]) for m in APPROXIMATIONS if causal is False or m != "linformer"}
    calls = {"eager": lambda q, k, v: attention(q, k, v, is_causal=causal, return_probs=True)[0],
             "sdpa": lambda q, k, v: attention(q, k, v, is_causal=causal)[0]}
    for method, approx in approxes.items():
        calls[method] = (lambda a: lambda q, k, v: approximate(q, k, v, a, 0, is_causal=causal)[0])(approx)
    return calls


def timed(call, q, k, v, device) -> float:
    started = time.perf_counter()
    call(q, k, v)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def live_cost(model, name: str, budgets: dict, lengths=LIVE_LENGTHS, repeats: int = LIVE_REPEATS) -> LiveCost:
    """Every method timed at each length on seeded random q [1, H, n, d], k, v [1, H_kv, n, d] in the loaded model's
    dtype and device: one warm-up call each, then `repeats` rounds with the methods alternating, so the machine's
    load falls on all alike."""
    cfg = model.attention_stack()[0].cfg
    calls = live_calls(cfg.causal, budgets)
    seconds = {m: [] for m in calls}
    with torch.inference_mode():
        for n in lengths:
            gen = torch.Generator().manual_seed(n)
            q = torch.randn(1, cfg.n_heads, n, cfg.head_dim, generator=gen)
            k, v = (torch.randn(1, cfg.n_kv_heads, n, cfg.head_dim, generator=gen) for _ in range(2))
            q, k, v = (t.to(model.device, model.dtype) for t in (q, k, v))
            for call in calls.values():
                timed(call, q, k, v, model.device)
            runs = {m: [] for m in calls}
            for _ in range(repeats):
                for method, call in calls.items():
                    runs[method].append(timed(call, q, k, v, model.device))
            for method, values in runs.items():
                seconds[method].append(tuple(values))
    return LiveCost(name, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, str(model.dtype).removeprefix("torch."),
                    str(model.device), torch.get_num_threads(), cfg.causal, tuple(lengths), repeats,
                    {m: budgets[m] for m in calls if m in budgets}, {m: tuple(s) for m, s in seconds.items()})


def milliseconds(seconds: float) -> str:
    """Three significant figures, no exponent: 0.153, 18.3, 1,031."""
    ms = 1e3 * seconds
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def live_words(live: LiveCost) -> str:
    """The live timing, a line per method, labelled as what it is: this machine, now, short lengths only."""
    head = (f"**Live, this machine, short lengths only**: one attention layer at {live.model}'s shape ({live.heads} "
            f"query heads, {live.kv_heads} key/value heads, d_head {live.d_head}), {live.dtype} on {live.device} with "
            f"{live.threads} thread(s), seeded random inputs, {'causal' if live.causal else 'no mask'}; median "
            f"(range) of {live.repeats} calls, the methods alternating after a warm-up. At lengths this short fixed "
            "costs weigh most; where the lines cross is the published run's.")
    rows = []
    for method, runs in live.seconds.items():
        cells = [f"{n:,} tokens {milliseconds(statistics.median(values))} ms ({milliseconds(min(values))}–"
                 f"{milliseconds(max(values))}), {ratio:.2f}× SDPA"
                 for n, values, ratio in zip(live.lengths, runs, live.ratio(method))]
        name = EXACT.get(method) or Approx(method, **live.budgets[method]).describe()
        rows.append(f"- {name}: " + "; ".join(cells))
    return head + "\n\n" + "\n".join(rows)


def live_table(live: LiveCost) -> dict:
    """The live timing as the `attention_cost` endpoint returns it."""
    return {"label": "live, this machine, short lengths only", "model": live.model,
            "shape": {"heads": live.heads, "kv_heads": live.kv_heads, "d_head": live.d_head, "dtype": live.dtype},
            "device": live.device, "threads": live.threads, "causal": live.causal, "lengths": list(live.lengths),
            "repeats": live.repeats, "budgets": live.budgets,
            "methods": {m: {"seconds": [list(s) for s in runs], "median_seconds": live.median(m),
                            "ratio_to_sdpa": live.ratio(m)} for m, runs in live.seconds.items()}}
