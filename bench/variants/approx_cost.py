"""Where an approximation of attention wins: one attention layer alone at SmolLM2-135M's shape (bench/configs: 9 query
heads, 3 key/value heads, d_head 64, d_model 576), float32, causal, timed and its peak memory measured from 256 to
16,384 tokens, each approximation of core/approx.py beside exact attention on the same random inputs; the fitted
exponents, the length from which each approximation is faster than the fused exact kernel and its error there, and
one decode step against a long cache.

Causal methods, each one call on q [1, 9, n, 64], k, v [1, 3, n, 64] (random N(0, 1)):
  eager       core.attention.attention(..., is_causal=True, return_probs=True): the explicit path, n × n float32
  sdpa        core.attention.attention(..., is_causal=True): torch's fused scaled_dot_product_attention
  online      core.attention.online_attention (eq. 6.10) head by head, a block of queries at a time over the keys up
              to that block's end (its causal mask on the last ones), so the work is causal too
  topk        core.approx.approximate with Approx("topk"): it scores every key to find each query's top k, so it stays
              quadratic in time and memory
  bigbird     Approx("bigbird"): its block-sparse path (bigbird_blocks), linear in n
  performer   Approx("performer"): FAVOR+ with its causal prefix sums, linear in n
  sdpa_kv     the exact layer's keys and values from x [1, n, 576] through the full [W_K; W_V] [384, 576], then sdpa:
              the reference lowrank_kv is compared with
  lowrank_kv  the same x through the truncated SVD of [W_K; W_V], down [r, 576] then up [384, r] (Approx.factors),
              then approximate (exact attention on those keys and values): the projection differs, so both rows
              time the projection
Bidirectional (Linformer has no causal form), a second table:
  sdpa_bi     core.attention.attention(q, k, v): the fused kernel, no mask
  linformer   Approx("linformer"): keys and values projected along the sequence to `rank` rows

Times: one fresh process per length, every method warmed up on 256 tokens, then timed --repeats times, the methods
alternating, so that the machine's load falls on all alike; medians and ranges. Errors: ‖ẑ − z‖ / ‖z‖ of the output
over all heads and queries against exact attention on the same inputs (sdpa's output; sdpa_kv's for lowrank_kv,
sdpa_bi's for linformer), from the last timed repeat, with each head's (core.approx.head_errors). On random Gaussian
inputs attention is diffuse and z small, so these errors are not a real model's heads'. Peaks: what one call added
to the resident memory (the kernel's VmHWM, bench/common.py PeakMemory) of a fresh process of its own (forked from a
server that has only imported torch and the core), after a warm-up, --peak-repeats times, the methods alternating.
On a GPU (--device cuda, or auto where torch sees one) the times are taken between torch.cuda.synchronize calls and
the peak is torch.cuda.max_memory_allocated.

What is skipped, by a stated rule: a method runs at length n only if it ran at every shorter length, its peak
predicted from its largest measured one as growing like n² (a bound for the methods that grow slower) stays under
the cap (--memory-share of the memory available when the run starts; on the CPU each child also runs under an
address-space limit of that size, so a wrong prediction fails in words instead of crowding the machine), and its
predicted time at n, likewise as n², over its repeats and peaks stays under --method-seconds.

Decode: one query (the newest token) against a cache of --decode-lengths tokens, each method timed --decode-repeats
times alternating in a fresh process, beside the bytes each step reads from the cache, counted from the shapes of
the tensors it reads (not a memory peak): exact attention and top-k read every key and value; BigBird through the
core's kernel masks every key (it reads them all), read by its blocks (bigbird_blocks) it gathers only the key blocks
its pattern gives the newest query's block; Performer through the core's kernel recomputes the features of every key,
kept as a running state (performer_state) it reads the m × d state and the m normaliser per key/value head;
lowrank_kv reads r numbers per token and expands them to keys and values.

The JSON (assets/measured/approx_cost.json), which the page and a lesson read:
  date, machine, command, device, threads, load_average [start, end], load   where and how it ran
  shape {heads, kv_heads, d_head, d_model, dtype}; budgets {topk: {k}, bigbird: {block, global_blocks,
      random_blocks}, performer: {features}, lowrank_kv: {rank}, linformer: {rank}, online: {block}}
  repeats, peak_repeats, decode_repeats; methods {name: words}; causal [names], bidirectional [names]
  rule {memory_available, memory_share, cap, method_seconds, words}: what decided the skips
  rows [{n, methods: {name: {seconds [one per repeat], peaks [bytes, one per fresh process], error, head_errors
      [per head] or null}}, skipped: {name: why}}]
  fits {name: {time, peak}}: core.machine.growth records {exponent, lengths, left_out, floor} over the lengths
      ≥ fit_from that the method reached; linear_check {name: {limit, exponent, lengths, holds}}
  crossover [{method, reference, n (smallest measured length where the method's median time is below the
      reference's, or null), interpolated_n (log-log between the two bracketing lengths, or null), ratio, error there,
      up_to (the longest length both reached), stays_below, words}]
  decode {contexts, rows [{method, context, seconds [...], bytes_read}]}

Usage: OMP_NUM_THREADS=1 python bench/variants/approx_cost.py [--lengths 256 ... 16384] [--repeats 5]
           [--peak-repeats 5] [--decode-lengths 4096 16384] [--device auto|cpu|cuda] [--publish]
       python bench/variants/approx_cost.py --from-saved [--publish]   (the saved run's tables, measuring nothing)
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for common

from common import PeakMemory, figure, median, spread_figures as spread, timed  # noqa: E402
from core.approx import (Approx, approximate, bigbird_blocks_pattern, favor_features, head_errors,  # noqa: E402
                         seed_for)
from core.attention import attention, causal_mask, online_attention  # noqa: E402
from core.machine.growth import MEMORY_FLOOR, Growth, growth, memory_growth  # noqa: E402

CAUSAL = ("eager", "sdpa", "online", "topk", "bigbird", "performer", "sdpa_kv", "lowrank_kv")
BIDIRECTIONAL = ("sdpa_bi", "linformer")
METHODS = CAUSAL + BIDIRECTIONAL
REFERENCE = {"eager": "sdpa", "online": "sdpa", "topk": "sdpa", "bigbird": "sdpa", "performer": "sdpa",
             "lowrank_kv": "sdpa_kv", "linformer": "sdpa_bi"}     # what each is timed and measured against
APPROXIMATIONS = ("topk", "bigbird", "performer", "lowrank_kv", "linformer")
LINEAR, LINEAR_LIMIT = ("bigbird", "performer"), 1.2    # the methods whose time exponent should stay at most this
DECODE_METHODS = ("sdpa", "eager", "online", "topk", "bigbird", "bigbird_blocks", "performer", "performer_state",
                  "lowrank_kv")
LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
DECODE_LENGTHS = (4096, 16384)
WARM = 256   # tokens of the warm-up call
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "smollm2-135m-instruct.json"
ASSET = Path(__file__).resolve().parent.parent.parent / "assets" / "measured" / "approx_cost.json"
WORDS = {
    "eager": "explicit path, n × n probabilities", "sdpa": "fused exact (SDPA)", "online": "online softmax (eq. 6.10)",
    "topk": "top-k (scores every key: quadratic)", "bigbird": "BigBird (block-sparse, linear)",
    "performer": "Performer (causal prefix sums, linear)", "sdpa_kv": "[W_K; W_V] projection + SDPA",
    "lowrank_kv": "rank-r projection + SDPA", "sdpa_bi": "fused exact, bidirectional",
    "linformer": "Linformer (bidirectional)", "bigbird_blocks": "BigBird, its blocks gathered",
    "performer_state": "Performer, running state"}


@dataclass(frozen=True)
class Setup:
    """The layer's shape, each method's budget and where it runs; passed to every child as a dict."""
    heads: int
    kv_heads: int
    d_head: int
    d_model: int
    topk: int = 256
    block: int = 64
    global_blocks: int = 1
    random_blocks: int = 2
    features: int = 256
    rank: int = 64
    linformer_rank: int = 256
    online_block: int = 256
    threads: int = 1
    device: str = "cpu"
    cap: int | None = None      # bytes a child may add; on the CPU its address-space limit

    def approx(self, method: str) -> Approx:
        budget = {"topk": {"k": self.topk}, "performer": {"features": self.features}, "lowrank_kv": {"rank": self.rank},
                  "bigbird": {"block": self.block, "global_blocks": self.global_blocks,
                              "random_blocks": self.random_blocks},
                  "linformer": {"rank": self.linformer_rank}}[method]
        return Approx(method, **budget)

    def budgets(self) -> dict:
        return {"topk": {"k": self.topk}, "bigbird": {"block": self.block, "global_blocks": self.global_blocks,
                                                      "random_blocks": self.random_blocks},
                "performer": {"features": self.features}, "lowrank_kv": {"rank": self.rank},
                "linformer": {"rank": self.linformer_rank}, "online": {"block": self.online_block}}


def smollm2_shape() -> dict:
    """SmolLM2-135M's attention shape, read from its config (bench/configs)."""
    raw = json.loads(CONFIG.read_text(encoding="utf-8"))
    return {"heads": raw["num_attention_heads"], "kv_heads": raw["num_key_value_heads"], "d_head": raw["head_dim"],
            "d_model": raw["hidden_size"]}


def resolve_device(choice: str) -> str:
    """'auto' → 'cuda' where torch sees a GPU, else 'cpu'; 'cuda' without one is refused in words."""
    if choice not in ("auto", "cpu", "cuda"):
        raise SystemExit(f"--device must be auto, cpu or cuda, not {choice!r}")
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU here (torch.cuda.is_available() is False); use --device cpu")
    return choice


# ---- the inputs and the calls ----

def split_kv(kv: torch.Tensor, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, n, 2·H_kv·d] → k, v [1, H_kv, n, d], keys first as in [W_K; W_V]."""
    heads = kv.view(kv.shape[0], kv.shape[1], 2 * kv_heads, -1).transpose(1, 2)
    return heads[:, :kv_heads], heads[:, kv_heads:]


def inputs(n: int, s: Setup) -> dict:
    """Seeded random q [1, H, n, d], k, v [1, H_kv, n, d], x [1, n, d_model], [W_K; W_V] [2·H_kv·d, d_model] scaled so
    that its keys are N(0, 1) like k, and its rank-r factors (down [r, d_model], up [2·H_kv·d, r])."""
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(1, s.heads, n, s.d_head, generator=gen)
    k, v = (torch.randn(1, s.kv_heads, n, s.d_head, generator=gen) for _ in range(2))
    x = torch.randn(1, n, s.d_model, generator=gen)
    w_kv = torch.randn(2 * s.kv_heads * s.d_head, s.d_model, generator=gen) / math.sqrt(s.d_model)
    down, up = s.approx("lowrank_kv").factors(0, w_kv)
    out = {"q": q, "k": k, "v": v, "x": x, "w_kv": w_kv, "down": down, "up": up}
    return {name: t.to(s.device) for name, t in out.items()}


def online(inp: dict, s: Setup) -> torch.Tensor:
    """online_attention per head and per block of queries [a, b), over keys [0, b) (the causal mask on them)."""
    q, k, v = inp["q"][0], inp["k"][0], inp["v"][0]
    n, group = q.shape[1], q.shape[0] // k.shape[0]
    spans = [(a, min(a + s.online_block, n)) for a in range(0, n, s.online_block)]
    masks = [causal_mask(b - a, b, q.device) for a, b in spans]
    return torch.stack([torch.cat([online_attention(q[h, a:b], k[h // group, :b], v[h // group, :b], s.online_block,
                                                    mask=mask) for (a, b), mask in zip(spans, masks)])
                        for h in range(q.shape[0])])[None]


def kv_from_x(inp: dict, s: Setup, lowrank: bool) -> tuple[torch.Tensor, torch.Tensor]:
    kv = (inp["x"] @ inp["down"].T) @ inp["up"].T if lowrank else inp["x"] @ inp["w_kv"].T   # [1, n, 2·H_kv·d]
    return split_kv(kv, s.kv_heads)


CALLS = {
    "eager": lambda inp, s: attention(inp["q"], inp["k"], inp["v"], is_causal=True, return_probs=True)[0],
    "sdpa": lambda inp, s: attention(inp["q"], inp["k"], inp["v"], is_causal=True)[0],
    "online": online,
    **{m: (lambda m: lambda inp, s: approximate(inp["q"], inp["k"], inp["v"], s.approx(m), layer=0,
                                                 is_causal=True)[0])(m) for m in ("topk", "bigbird", "performer")},
    "sdpa_kv": lambda inp, s: attention(inp["q"], *kv_from_x(inp, s, False), is_causal=True)[0],
    "lowrank_kv": lambda inp, s: approximate(inp["q"], *kv_from_x(inp, s, True), s.approx("lowrank_kv"), layer=0,
                                             is_causal=True)[0],
    "sdpa_bi": lambda inp, s: attention(inp["q"], inp["k"], inp["v"])[0],
    "linformer": lambda inp, s: approximate(inp["q"], inp["k"], inp["v"], s.approx("linformer"), layer=0)[0],
}


def relative_error(exact: torch.Tensor, approx: torch.Tensor) -> tuple[float, list[float]]:
    """‖ẑ − z‖ / ‖z‖ over every head and query, and each head's (core.approx.head_errors)."""
    total = float((approx.float() - exact.float()).norm() / exact.float().norm().clamp_min(1e-30))
    return total, [float(e) for e in head_errors(exact, approx, None, None)[1][0]]


# ---- what runs in a fresh process ----

def prepare(s: Setup) -> None:
    torch.set_num_threads(s.threads)
    if s.cap is not None and s.device == "cpu":     # so that a wrong prediction fails in words, not by crowding
        from common import status_bytes
        limit = status_bytes("VmSize") + s.cap
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def measure_times(n: int, methods: list[str], setup: dict, repeats: int) -> dict:
    """In a fresh process: each method timed `repeats` times at n tokens, the methods alternating after a warm-up on
    WARM tokens; the errors from the last repeat. {seconds: {m: [...]}, errors: {m: e}, head_errors: {m: [...]},
    failed: {m: why}} (a method that fails, e.g. out of its memory cap, leaves the alternation)."""
    s = Setup(**setup)
    prepare(s)
    inp, warm = inputs(n, s), inputs(min(WARM, n), s)
    seconds, failed, last = {m: [] for m in methods}, {}, {}
    with torch.inference_mode():
        for m in methods:
            CALLS[m](warm, s)
        for repeat in range(repeats):
            for m in [m for m in methods if m not in failed]:
                try:
                    took, out = timed(lambda: CALLS[m](inp, s), s.device)
                except (RuntimeError, MemoryError) as error:
                    failed[m] = f"failed at {n:,} tokens: {str(error).splitlines()[0][:200]}"
                    continue
                seconds[m].append(took)
                if repeat == repeats - 1 and (m in REFERENCE.values() or m in REFERENCE):
                    last[m] = out
                del out
    errors, per_head = {}, {}
    for m, ref in REFERENCE.items():
        if m in last and ref in last:
            errors[m], per_head[m] = relative_error(last[ref], last[m])
    return {"seconds": {m: t for m, t in seconds.items() if m not in failed}, "errors": errors,
            "head_errors": per_head, "failed": failed}


def measure_peak(method: str, n: int, setup: dict) -> dict:
    """In a fresh process: the bytes one call of `method` at n tokens added to the peak (VmHWM on the CPU, torch's
    allocation on a GPU), after a warm-up; {added} or {failed: why}."""
    s = Setup(**setup)
    prepare(s)
    inp = inputs(n, s)
    with torch.inference_mode():
        CALLS[method](inputs(min(WARM, n), s), s)
        try:
            with PeakMemory(s.device, required=True) as peak:
                out = CALLS[method](inp, s)
        except (RuntimeError, MemoryError) as error:
            return {"failed": f"failed at {n:,} tokens: {str(error).splitlines()[0][:200]}"}
    del out
    return {"added": peak.added}


# ---- one decode step ----

def decode_state(n: int, s: Setup) -> dict:
    """What each method keeps for a cache of n tokens, and the newest token's query, key and value: q1 [1, H, 1, d],
    the cache k, v [1, H_kv, n, d] (its last place the newest token), lowrank's latents c [1, n, r], BigBird's key
    places for the newest query's block, Performer's state over the cache (φ(K)ᵀV [1, H_kv, m, d], Σφ(K) [1, H_kv, m])."""
    inp = inputs(n, s)
    q1 = inp["q"][:, :, -1:]
    pattern = bigbird_blocks_pattern(-(-n // s.block), s.global_blocks, s.random_blocks, seed_for(0, 0), True)
    blocks = pattern[-1].nonzero().flatten()
    places = (blocks[:, None] * s.block + torch.arange(s.block)).flatten()
    places = places[places < n].to(s.device)
    _, k_f = favor_features(q1, inp["k"], s.d_head ** -0.5, s.features, seed_for(0, 0))
    return {"q1": q1, "k": inp["k"], "v": inp["v"], "latent": inp["x"] @ inp["down"].T, "up": inp["up"],
            "places": places, "state": k_f.transpose(-1, -2) @ inp["v"], "normaliser": k_f.sum(-2),
            "k_new": inp["k"][:, :, -1:], "v_new": inp["v"][:, :, -1:]}


def bigbird_decode(st: dict, s: Setup) -> torch.Tensor:
    """The newest query over the key blocks its block reads (its own, the one before, the global and random ones)."""
    return attention(st["q1"], st["k"][:, :, st["places"]], st["v"][:, :, st["places"]])[0]


def performer_readout(q_f: torch.Tensor, state: torch.Tensor, normaliser: torch.Tensor) -> torch.Tensor:
    """D⁻¹ φ(q)(φ(K)ᵀV) for q_f [1, H, 1, m] against the state [1, H_kv, m, d] and normaliser [1, H_kv, m]."""
    group = q_f.shape[1] // state.shape[1]
    state, normaliser = state.repeat_interleave(group, 1), normaliser.repeat_interleave(group, 1)
    return (q_f @ state) / (q_f @ normaliser[..., None]).clamp_min(1e-30)


def performer_step(st: dict, s: Setup) -> torch.Tensor:
    """A decoder's step with a running state: the newest query's and key's features, the key and value added to the
    state, the query read out. The key's features here carry their own stabiliser (a decoder keeps a running max and
    rescales its state when it rises); the work is the same."""
    q_f, k_f = favor_features(st["q1"], st["k_new"], s.d_head ** -0.5, s.features, seed_for(0, 0))
    state = st["state"] + k_f.transpose(-1, -2) @ st["v_new"]
    normaliser = st["normaliser"] + k_f[:, :, 0]
    return performer_readout(q_f, state, normaliser)


def lowrank_decode(st: dict, s: Setup) -> torch.Tensor:
    k, v = split_kv(st["latent"] @ st["up"].T, s.kv_heads)                 # the cache's r numbers expanded
    return approximate(st["q1"], k, v, s.approx("lowrank_kv"), layer=0)[0]


def online_decode(st: dict, s: Setup) -> torch.Tensor:
    q, k, v = st["q1"][0], st["k"][0], st["v"][0]
    group = q.shape[0] // k.shape[0]
    return torch.stack([online_attention(q[h], k[h // group], v[h // group], s.online_block)
                        for h in range(q.shape[0])])[None]


DECODE_CALLS = {
    "sdpa": lambda st, s: attention(st["q1"], st["k"], st["v"])[0],
    "eager": lambda st, s: attention(st["q1"], st["k"], st["v"], return_probs=True)[0],
    "online": online_decode,
    # one newest query reads every earlier key: causal is the whole cache (BigBird's pattern still causal)
    "topk": lambda st, s: approximate(st["q1"], st["k"], st["v"], s.approx("topk"), layer=0)[0],
    "bigbird": lambda st, s: approximate(st["q1"], st["k"], st["v"], s.approx("bigbird"), layer=0, is_causal=True)[0],
    "bigbird_blocks": bigbird_decode,
    "performer": lambda st, s: approximate(st["q1"], st["k"], st["v"], s.approx("performer"), layer=0)[0],
    "performer_state": performer_step,
    "lowrank_kv": lowrank_decode,
}


def bytes_read(method: str, st: dict) -> int:
    """The bytes one step reads from what the method keeps, from the shapes of the tensors it reads."""
    whole = st["k"].nbytes + st["v"].nbytes
    if method == "bigbird_blocks":
        return whole * len(st["places"]) // st["k"].shape[-2]
    if method == "performer_state":
        return st["state"].nbytes + st["normaliser"].nbytes
    if method == "lowrank_kv":
        return st["latent"].nbytes
    return whole


def measure_decode(n: int, setup: dict, repeats: int) -> dict:
    """In a fresh process: one decode step against a cache of n tokens, each method timed `repeats` times alternating
    after a warm-up; {seconds: {m: [...]}, bytes_read: {m: bytes}}."""
    s = Setup(**setup)
    prepare(s)
    st = decode_state(n, s)
    seconds = {m: [] for m in DECODE_METHODS}
    with torch.inference_mode():
        for m in DECODE_METHODS:
            DECODE_CALLS[m](st, s)
        for _ in range(repeats):
            for m in DECODE_METHODS:
                seconds[m].append(timed(lambda: DECODE_CALLS[m](st, s), s.device)[0])
    return {"seconds": seconds, "bytes_read": {m: bytes_read(m, st) for m in DECODE_METHODS}}


# ---- the children ----

def _in_child(conn, function: str, args: tuple) -> None:
    try:
        conn.send(("ok", globals()[function](*args)))
    except BaseException as error:     # noqa: BLE001 - said to the parent in words
        conn.send(("error", f"{type(error).__name__}: {error}"))
    conn.close()


def child(function: str, *args, device: str = "cpu", timeout: float = 3600) -> dict:
    """FUNCTION(*args) of this module in a fresh process: forked from a server that has only imported torch and this
    module (so no earlier call's memory or threads), spawned on a GPU; its result sent back."""
    context = multiprocessing.get_context("spawn" if device == "cuda" else "forkserver")
    if device != "cuda":
        context.set_forkserver_preload(["__main__", "torch"])
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_in_child, args=(send, function, args))
    process.start()
    send.close()
    try:
        if not receive.poll(timeout):
            process.kill()
            raise SystemExit(f"{function}{args!r} took longer than {timeout:.0f} s")
        status, result = receive.recv()
    except EOFError:
        status, result = "error", f"the process ended without a result (exit code {process.join() or process.exitcode})"
    process.join()
    if status != "ok":
        return {"failed": result}
    return result


# ---- the runs ----

def plan(n: int, rows: list[dict], methods, s: Setup, args) -> tuple[list[str], dict]:
    """Which methods run at n, and why each of the others does not (the rule in the module's docstring)."""
    run, skipped = [], {}
    for m in methods:
        seen = [r for r in rows if m in r["methods"]]
        gone = [r for r in rows if m in r["skipped"]]
        if gone:
            skipped[m] = f"not run past {gone[0]['n']:,} tokens"
            continue
        if not seen:
            run.append(m)
            continue
        last = seen[-1]
        grow = (n / last["n"]) ** 2
        peak = max(0, median(last["methods"][m]["peaks"])) * grow
        seconds = median(last["methods"][m]["seconds"]) * grow * (args.repeats + args.peak_repeats + 2)
        if s.cap is not None and peak > s.cap:
            skipped[m] = (f"its peak, {median(last['methods'][m]['peaks']) / 2 ** 30:.2f} GiB at {last['n']:,} tokens, "
                          f"grown as n² would be {peak / 2 ** 30:.1f} GiB, over the cap of {s.cap / 2 ** 30:.1f} GiB")
        elif seconds > args.method_seconds:
            skipped[m] = (f"its time at {last['n']:,} tokens grown as n² would make its runs here take about "
                          f"{seconds:.0f} s, over --method-seconds {args.method_seconds:.0f}")
        else:
            run.append(m)
    return run, skipped


def length_row(n: int, rows: list[dict], s: Setup, args) -> dict:
    """One length: the times in one fresh process, then each method's peak in fresh processes, alternating."""
    run, skipped = plan(n, rows, METHODS, s, args)
    times = child("measure_times", n, run, asdict(s), args.repeats, device=s.device) if run else {"seconds": {}}
    if "failed" in times and isinstance(times["failed"], str):
        raise SystemExit(f"timing {n:,} tokens failed: {times['failed']}")
    skipped.update(times.get("failed", {}))
    run = [m for m in run if m in times["seconds"]]
    peaks = {m: [] for m in run}
    for _ in range(args.peak_repeats):
        for m in [m for m in run if m not in skipped]:
            result = child("measure_peak", m, n, asdict(s), device=s.device)
            if "failed" in result:
                skipped[m] = result["failed"]
            else:
                peaks[m].append(result["added"])
    return {"n": n, "skipped": skipped,
            "methods": {m: {"seconds": times["seconds"][m], "peaks": peaks[m], "error": times["errors"].get(m),
                            "head_errors": times["head_errors"].get(m)} for m in run if m not in skipped}}


def layer_runs(s: Setup, args) -> list[dict]:
    rows = []
    for n in args.lengths:
        started = time.perf_counter()
        rows.append(length_row(n, rows, s, args))
        r = rows[-1]
        print(f"{n:>6} tokens ({time.perf_counter() - started:.0f} s): "
              + ", ".join(f"{m} {1e3 * median(x['seconds']):,.1f} ms" for m, x in r["methods"].items())
              + "".join(f"; {m} skipped: {why}" for m, why in r["skipped"].items()), flush=True)
    return rows


def decode_runs(s: Setup, args) -> dict:
    rows = []
    for n in args.decode_lengths:
        result = child("measure_decode", n, asdict(s), args.decode_repeats, device=s.device)
        if "failed" in result:
            raise SystemExit(f"the decode step at {n:,} tokens failed: {result['failed']}")
        rows += [{"method": m, "context": n, "seconds": result["seconds"][m], "bytes_read": result["bytes_read"][m]}
                 for m in DECODE_METHODS]
        print(f"decode, {n:,} cached tokens: " + ", ".join(f"{m} {1e3 * median(result['seconds'][m]):.2f} ms"
                                                           for m in DECODE_METHODS), flush=True)
    return {"contexts": list(args.decode_lengths), "rows": rows}


# ---- what the rows say ----

def fits(rows: list[dict], fit_from: int) -> dict:
    """Each method's time and peak exponents (core.machine.growth) over the lengths ≥ fit_from it reached, and the
    linear methods' check: time exponent ≤ LINEAR_LIMIT."""
    out, check = {}, {}
    for m in METHODS:
        reached = [r for r in rows if m in r["methods"] and r["n"] >= fit_from]
        lengths = [r["n"] for r in reached]
        out[m] = {"time": growth(lengths, [median(r["methods"][m]["seconds"]) for r in reached]).record(),
                  "peak": memory_growth(lengths, [median(r["methods"][m]["peaks"]) if r["methods"][m]["peaks"]
                                                  else 0 for r in reached]).record()}
    for m in LINEAR:
        t = out[m]["time"]
        check[m] = {"limit": LINEAR_LIMIT, "exponent": t["exponent"], "lengths": t["lengths"],
                    "holds": t["exponent"] is not None and t["exponent"] <= LINEAR_LIMIT}
    return {"fit_from": fit_from, "methods": out, "linear_check": check}


def crossover(rows: list[dict], method: str, reference: str) -> dict:
    """The smallest measured length at which the method's median time is below the reference's, the length
    interpolated on log-log between it and the length before, the ratio and the error there."""
    pairs = [(r["n"], median(r["methods"][method]["seconds"]), median(r["methods"][reference]["seconds"]),
              r["methods"][method]["error"]) for r in rows if method in r["methods"] and reference in r["methods"]]
    found = {"method": method, "reference": reference, "n": None, "interpolated_n": None, "ratio": None,
             "error": None, "up_to": pairs[-1][0] if pairs else None, "stays_below": False}
    for i, (n, t, ref, error) in enumerate(pairs):
        if t < ref:
            found.update(n=n, ratio=t / ref, error=error, stays_below=all(a < b for _, a, b, _ in pairs[i:]))
            if i:
                n0, t0, ref0, _ = pairs[i - 1]
                above, below = math.log(t0 / ref0), math.log(t / ref)      # > 0 before, < 0 at n
                found["interpolated_n"] = math.exp(math.log(n0) + above / (above - below) * math.log(n / n0))
            break
    found["words"] = crossover_words(found)
    return found


def crossover_words(c: dict) -> str:
    if c["up_to"] is None:
        return "not measured beside its reference"
    if c["n"] is None:
        return f"none up to {c['up_to']:,}"
    if c["interpolated_n"] is None:
        where = f"already at {c['n']:,}, the shortest length measured"
    else:
        where = f"{c['n']:,} (≈ {c['interpolated_n']:,.0f} interpolated on log-log)"
    return where + ("" if c["stays_below"] else ", not below at every longer length")


def crossovers(rows: list[dict]) -> list[dict]:
    return [crossover(rows, m, REFERENCE[m]) for m in APPROXIMATIONS]


# ---- the page ----

def by_length(rows: list[dict], methods, cell) -> list[str]:
    lines = ["| tokens n | " + " | ".join(methods) + " |", "|---:|" + "---:|" * len(methods)]
    for r in rows:
        lines.append(f"| {r['n']:,} | " + " | ".join(cell(r, m) if m in r["methods"] else "–" for m in methods) + " |")
    return lines


def ratio_cell(r: dict, m: str) -> str:
    ref = REFERENCE.get(m)
    if ref not in r["methods"]:
        return "–"
    ratio = median(r["methods"][m]["seconds"]) / median(r["methods"][ref]["seconds"])
    error = r["methods"][m]["error"]
    return f"{ratio:.2f}×" + ("" if error is None else f" ({error:.2g})")


def exponent(record: dict) -> str:
    g = Growth.from_record(record)
    if not g.fitted:
        return "– (fewer than two lengths)" if not g.left_out else f"– (peaks under {g.floor / 2 ** 20:g} MiB)"
    return f"n^{g.exponent:.2f} over {g.lengths[0]:,}–{g.lengths[-1]:,}"


def skipped_lines(rows: list[dict]) -> list[str]:
    lines, said = [], set()
    for r in rows:
        for m, why in r["skipped"].items():
            if m not in said:
                said.add(m)
                lines.append(f"- {m}: from {r['n']:,} tokens on, {why}.")
    return lines


def reached(rows: list[dict], m: str) -> str:
    lengths = [r["n"] for r in rows if m in r["methods"]]
    return f"{lengths[0]:,}–{lengths[-1]:,}" if lengths else "none"


def table(data: dict) -> str:
    """The markdown: times, ratios and errors, peaks, exponents, crossover lengths, the bidirectional table and the
    decode step."""
    rows, sh, b, ms = data["rows"], data["shape"], data["budgets"], 2 ** 20
    lines = [f"One attention layer alone at SmolLM2-135M's shape ({sh['heads']} query heads, {sh['kv_heads']} key/value "
             f"heads, d_head {sh['d_head']}, d_model {sh['d_model']}), {sh['dtype']}, causal, random N(0, 1) inputs, on "
             f"{data['device']} with {data['threads']} thread(s). Budgets: top-k k = {b['topk']['k']}; BigBird block "
             f"{b['bigbird']['block']}, {b['bigbird']['global_blocks']} global and {b['bigbird']['random_blocks']} random "
             f"block(s); Performer {b['performer']['features']} features; low-rank KV rank {b['lowrank_kv']['rank']}; "
             f"Linformer rank {b['linformer']['rank']}; online softmax in blocks of {b['online']['block']}. "
             f"Time of one call (ms), median (range) of {data['repeats']} runs, the methods alternating in one fresh "
             f"process per length after a warm-up on {WARM} tokens. sdpa_kv and lowrank_kv include their key/value "
             "projection from x (lowrank_kv through its rank-r factors), so they are compared with each other.", ""]
    lines += by_length(rows, CAUSAL, lambda r, m: spread(r["methods"][m]["seconds"], 1e3))
    lines += ["", "Each method's median time over its reference's at the same length (eager, online, top-k, BigBird, "
                  "Performer over sdpa; lowrank_kv over sdpa_kv), with in brackets its output's relative error "
                  "‖ẑ − z‖/‖z‖ against exact attention on the same inputs (over all heads and queries). Random "
                  "inputs make attention diffuse and z small, so these errors are far larger than on a real model's "
                  "heads; they say the method runs the sum it should, not how well it serves a model.", ""]
    shown = ("eager", "online", "topk", "bigbird", "performer", "lowrank_kv")
    lines += by_length(rows, shown, ratio_cell)
    lines += ["", f"What one call added to the peak memory (MiB; {data['peak_measure']}), each in a fresh process after "
                  f"a warm-up, median (range) of {data['peak_repeats']}; under {MEMORY_FLOOR / 2 ** 20:g} MiB is within the "
                  "kernel's slack.", ""]
    lines += by_length(rows, CAUSAL, lambda r, m: spread(r["methods"][m]["peaks"], 1 / ms))
    fitted = data["fits"]["methods"]
    lines += ["", f"Fitted exponents (core.machine.growth, log-log least squares on the medians, over the lengths from "
                  f"{data['fits']['fit_from']:,} each method reached):", ""]
    lines += [f"- {m} ({WORDS[m]}): time {exponent(fitted[m]['time'])}; peak {exponent(fitted[m]['peak'])}"
              for m in METHODS]
    for m, c in data["fits"]["linear_check"].items():
        span = f"{c['lengths'][0]:,}–{c['lengths'][-1]:,}" if c["lengths"] else "no lengths"
        lines.append(f"- check, {m}'s time exponent at most {c['limit']} over {span}: "
                     + (f"holds (n^{c['exponent']:.2f})" if c["holds"] else
                        "no fit" if c["exponent"] is None else f"fails (n^{c['exponent']:.2f})"))
    exact = Growth.from_record(fitted["sdpa"]["time"])
    if exact.fitted:
        lines.append(f"- for scale: sdpa's work grows as n², so its exponent here, n^{exact.exponent:.2f}, shows how "
                     "far this run's memory traffic and the machine's load (the head line's load average) bend an "
                     "exponent away from the arithmetic's")
    lines += ["", "Where an approximation wins: the smallest measured length at which its median time is below its "
                  "reference's (sdpa, the fused exact kernel; sdpa_kv for lowrank_kv; sdpa_bi for Linformer), the "
                  "length interpolated on log-log between it and the length before, and its error there.", "",
              "| method | faster than | from n | ratio there | error there | lengths reached |", "|---|---|---|---:|---:|---|"]
    for c in data["crossover"]:
        ratio = "–" if c["ratio"] is None else f"{c['ratio']:.2f}×"
        error = "–" if c["error"] is None else f"{c['error']:.2g}"
        lines.append(f"| {c['method']} | {c['reference']} | {c['words']} | {ratio} | {error} | "
                     f"{reached(rows, c['method'])} |")
    lines += ["", "Not run, by the rule (a method runs at n only if it ran at every shorter length, its peak grown as "
                  f"n² from its largest measured one stays under the cap, {data['rule']['cap'] / 2 ** 30:.1f} GiB = "
                  f"{data['rule']['memory_share']:.0%} of the {data['rule']['memory_available'] / 2 ** 30:.1f} GiB "
                  "available when the run started, and its runs' predicted time under "
                  f"{data['rule']['method_seconds']:.0f} s):", ""]
    lines += skipped_lines(rows) or ["- nothing: every method reached every length."]
    lines += ["", "Bidirectional (Linformer has no causal form): the fused kernel without a mask beside Linformer, "
                  "time (ms), ratio (error), peak (MiB).", ""]
    lines += by_length(rows, BIDIRECTIONAL, lambda r, m: spread(r["methods"][m]["seconds"], 1e3))
    lines += [""] + by_length(rows, ("linformer",), ratio_cell)
    lines += [""] + by_length(rows, BIDIRECTIONAL, lambda r, m: spread(r["methods"][m]["peaks"], 1 / ms))
    lines += ["", decode_table(data["decode"])]
    return "\n".join(lines)


def decode_table(decode: dict) -> str:
    contexts = decode["contexts"]
    cells = {(r["method"], r["context"]): r for r in decode["rows"]}
    lines = [f"One decode step: the newest query against a cache of {' and '.join(f'{n:,}' for n in contexts)} tokens, "
             "median (range) of the steps' times (ms), alternating in a fresh process per context, its ratio to sdpa, "
             "and the bytes the step reads from what the method keeps, counted from the shapes of the tensors it "
             "reads (a count of bytes read, not a memory peak). BigBird and Performer run twice: through the core's "
             "kernel (which masks or featurises every key of the cache) and as a decoder would keep them (the key "
             "blocks the newest query's block reads, gathered; the running state φ(K)ᵀV and Σφ(K)). lowrank_kv reads "
             "r numbers a token and expands them into keys and values every step.", "",
             "| method | " + " | ".join(f"{n:,}: ms | {n:,}: × sdpa | {n:,}: bytes read" for n in contexts) + " |",
             "|---|" + "---:|---:|---:|" * len(contexts)]
    for m in DECODE_METHODS:
        parts = []
        for n in contexts:
            r, ref = cells[(m, n)], cells[("sdpa", n)]
            parts += [spread(r["seconds"], 1e3), f"{median(r['seconds']) / median(ref['seconds']):.2f}×",
                      f"{r['bytes_read']:,}"]
        lines.append(f"| {m} ({WORDS[m]}) | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def summary(data: dict) -> str:
    top = data["rows"][-1]
    ratios = ", ".join(f"{m} {median(top['methods'][m]['seconds']) / median(top['methods']['sdpa']['seconds']):.2f}x"
                       for m in ("topk", "bigbird", "performer") if m in top["methods"] and "sdpa" in top["methods"])
    cross = "; ".join(f"{c['method']} {c['words']}" for c in data["crossover"])
    return f"SUMMARY at {top['n']:,} tokens over sdpa: {ratios or 'sdpa not measured'}; crossover: {cross}"


def run_record(args, s: Setup, rows: list[dict], decode: dict, available: int) -> dict:
    from common import LOAD_AT_START, command, load_average, load_phrase, machine
    loads = [LOAD_AT_START, load_average()]
    return {"date": datetime.date.today().isoformat(), "machine": machine(), "command": command(),
            "device": s.device, "threads": s.threads, "load_average": loads, "load": load_phrase(*loads),
            "shape": {"heads": s.heads, "kv_heads": s.kv_heads, "d_head": s.d_head, "d_model": s.d_model,
                      "dtype": "float32"},
            "budgets": s.budgets(), "repeats": args.repeats, "peak_repeats": args.peak_repeats,
            "decode_repeats": args.decode_repeats, "methods": {m: WORDS[m] for m in METHODS + DECODE_METHODS},
            "causal": list(CAUSAL), "bidirectional": list(BIDIRECTIONAL),
            "peak_measure": PeakMemory(s.device).how,
            "rule": {"memory_available": available, "memory_share": args.memory_share, "cap": s.cap,
                     "method_seconds": args.method_seconds,
                     "words": "a method runs at n only if it ran at every shorter length, its peak grown as n² from "
                              "its largest measured one stays under the cap (memory_share of memory_available), and "
                              "its runs' time grown as n² stays under method_seconds"},
            "rows": rows, "fits": fits(rows, args.fit_from), "crossover": crossovers(rows), "decode": decode}


def memory_available(device: str) -> int:
    """Bytes free for this run: MemAvailable on the CPU, the GPU's free memory on a GPU."""
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("cannot read MemAvailable from /proc/meminfo: the memory cap needs Linux")


def from_saved(publish_again: bool) -> None:
    """The saved run's tables printed (its fits and crossovers worked out again from its rows); with publish_again,
    written into docs/benchmarks.md under the saved run's own stamp."""
    from common import publish
    data = json.loads(ASSET.read_text(encoding="utf-8"))
    data["fits"], data["crossover"] = fits(data["rows"], data["fits"]["fit_from"]), crossovers(data["rows"])
    markdown = table(data)
    print(markdown)
    print(summary(data))
    if publish_again:
        ASSET.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        publish("approx-cost", markdown, run={k: data[k] for k in ("command", "date", "machine", "load_average")})


def arguments(argv=None):
    from common import add_publish
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--decode-lengths", type=int, nargs="+", default=list(DECODE_LENGTHS))
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per method and length, alternating")
    parser.add_argument("--peak-repeats", type=int, default=5, help="fresh processes per method and length")
    parser.add_argument("--decode-repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--memory-share", type=float, default=0.6,
                        help="the cap on a method's predicted peak: this share of the memory available at the start")
    parser.add_argument("--method-seconds", type=float, default=300,
                        help="the most a method's runs at one length may be predicted to take")
    parser.add_argument("--fit-from", type=int, default=2048, help="exponents are fitted over the lengths from this")
    parser.add_argument("--topk", type=int, default=256)
    parser.add_argument("--block", type=int, default=64, help="BigBird's block")
    parser.add_argument("--global-blocks", type=int, default=1)
    parser.add_argument("--random-blocks", type=int, default=2)
    parser.add_argument("--features", type=int, default=256, help="Performer's random features")
    parser.add_argument("--rank", type=int, default=64, help="lowrank_kv's rank")
    parser.add_argument("--linformer-rank", type=int, default=256)
    parser.add_argument("--online-block", type=int, default=256)
    parser.add_argument("--from-saved", action="store_true",
                        help=f"measure nothing: print the saved run's ({ASSET.name}) tables; with --publish write them")
    add_publish(parser)
    args = parser.parse_args(argv)
    whole = ("repeats", "peak_repeats", "decode_repeats", "threads", "topk", "block", "features", "rank",
             "linformer_rank", "online_block")
    bad = [name for name in whole if getattr(args, name) < 1] + [name for name in ("global_blocks", "random_blocks")
                                                                 if getattr(args, name) < 0]
    if bad or min(args.lengths + args.decode_lengths) < 1 or not 0 < args.memory_share <= 1:
        raise SystemExit(f"{', '.join('--' + b.replace('_', '-') for b in bad) or '--lengths or --memory-share'}: "
                         "counts and lengths must be whole numbers ≥ 1 (the blocks ≥ 0), --memory-share in (0, 1]")
    args.lengths, args.decode_lengths = sorted(set(args.lengths)), sorted(set(args.decode_lengths))
    return args


def main(argv=None) -> None:
    from common import publish
    args = arguments(argv)
    if args.from_saved:
        return from_saved(args.publish)
    device = resolve_device(args.device)
    available = memory_available(device)
    s = Setup(**smollm2_shape(), topk=args.topk, block=args.block, global_blocks=args.global_blocks,
              random_blocks=args.random_blocks, features=args.features, rank=args.rank,
              linformer_rank=args.linformer_rank, online_block=args.online_block, threads=args.threads, device=device,
              cap=int(args.memory_share * available))
    from common import LOAD_AT_START, machine
    load = "" if LOAD_AT_START is None else f"; load average {LOAD_AT_START:.2f} at the start"
    print(f"{machine()}; device {device}{load}; cap {s.cap / 2 ** 30:.1f} GiB "
          f"({args.memory_share:.0%} of {available / 2 ** 30:.1f} GiB available); {args.repeats} timed runs, "
          f"{args.peak_repeats} peaks per method and length", flush=True)
    rows = layer_runs(s, args)
    decode = decode_runs(s, args)
    data = run_record(args, s, rows, decode, available)
    markdown = table(data)
    print(markdown)
    print(data["load"])
    print(summary(data))
    if args.publish:
        publish("approx-cost", markdown)
        ASSET.parent.mkdir(parents=True, exist_ok=True)
        ASSET.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {ASSET}")


if __name__ == "__main__":
    main()
