"""StreamingLLM's experiment on the models in the store: the perplexity of a long public-domain text read with full
attention, with a window of keys only, and with the window plus 1 or 4 attention sinks (core/analysis/sinks.py
streaming_perplexity). Writes assets/measured/streaming.json and docs/sinks.md.

    python scripts/streaming_experiment.py --models smollm2-135m-instruct gemma-3-270m --tokens 2048 --windows 128 512 1024

A model not in the store is skipped with a line saying so (pull it with python -m core.store pull NAME).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import machine  # noqa: E402
from core import load_model  # noqa: E402
from core.analysis.sinks import streaming_perplexity  # noqa: E402
from core.loading import load_tokenizer  # noqa: E402
from core.store import ensure  # noqa: E402
from core.store.errors import WeightsError  # noqa: E402

TEXT = ROOT / "assets" / "texts" / "macbeth_acts_1_2.txt"
OUT = ROOT / "assets" / "measured" / "streaming.json"
DOC = ROOT / "docs" / "sinks.md"
BIN = 128          # positions per bin of the loss curve kept in the JSON
PUBLISHED = ("StreamingLLM (Xiao et al., ICLR 2024), Llama-2-13B on PG19 with a 1,024-token cache: window only "
             "5,158; 4 sinks + 1,020 window 5.40")


def past_window(run: dict) -> str:
    value = run["perplexity_past_window"]
    return "–" if value is None else f"{value:,.2f}"


def binned(loss: torch.Tensor) -> list[float]:
    """Mean loss per BIN predicted positions (the curve; its rise shows where the text passes the window)."""
    return [round(float(loss[i:i + BIN].mean()), 4) for i in range(0, len(loss), BIN)]


def run_one(model, ids, window: int | None, sinks: int, positions: str, local_windows: bool = True) -> dict:
    started = time.perf_counter()
    t = len(ids)
    result = streaming_perplexity(model, ids, window or t, sinks, positions, local_windows=local_windows)
    past = result.loss[(window or t) - 1:]       # predictions made by queries whose window hides something
    return dict(window=window, sinks=sinks, positions=positions, perplexity=round(result.perplexity, 4),
                perplexity_past_window=round(math.exp(float(past.double().mean())), 4) if len(past) else None,
                loss_per_bin=binned(result.loss), seconds=round(time.perf_counter() - started, 1),
                method=result.method)


def own_mix(model, ids) -> dict | None:
    """A family that mixes sliding-window layers with full ones (Gemma 3): its local layers widened to every key
    (their own rotation kept), beside the run as trained; the runs with a window of the local layers' own width are
    the mix the other way (every layer windowed, the global ones too)."""
    cfg = model.config
    if "sliding" not in cfg.layer_types:
        return None
    widened = run_one(model, ids, None, 0, "text", local_windows=False)
    print(f"{cfg.family}: local layers widened to every key: perplexity {widened['perplexity']}", flush=True)
    return dict(local_window=cfg.sliding_window, local_layers=list(cfg.layer_types).count("sliding"),
                layers=cfg.n_layers, widened=widened)


def loaded(name: str):
    """(model, folder) from the store, or None with a line saying why not."""
    try:
        folder = ensure(name)
    except WeightsError as error:
        print(f"{name}: not in the store, skipped ({error})")
        return None
    return load_model(folder, device="cpu", dtype=torch.float32), folder


def run_model(name: str, args) -> dict | None:
    found = loaded(name)
    if found is None:
        return None
    model, folder = found
    ids = torch.tensor(load_tokenizer(folder)(TEXT.read_text()).input_ids[:args.tokens])
    runs = [run_one(model, ids, None, 0, "text")]
    print(f"{name}: full attention over {len(ids)} tokens: perplexity {runs[0]['perplexity']}", flush=True)
    for window in args.windows:
        for sinks in args.sinks:
            for positions in (["text"] + (["cache"] if sinks and window in args.cache_windows else [])):
                runs.append(run_one(model, ids, window, sinks, positions))
                r = runs[-1]
                print(f"{name}: window {window} + {sinks} sinks ({positions} positions): perplexity {r['perplexity']}"
                      f", past the window {r['perplexity_past_window']} ({r['seconds']} s)", flush=True)
    mix = own_mix(model, ids)
    return dict(model=name, tokens=len(ids), first_token=int(ids[0]), runs=runs, **({"mix": mix} if mix else {}))


def words(result: dict) -> str:
    """The finding in words, read from the runs: window only against full, and what 1 and 4 sinks recover."""
    runs, lines = result["runs"], []
    full = runs[0]["perplexity"]
    for window in sorted({r["window"] for r in runs if r["window"]}):
        here = {(r["sinks"], r["positions"]): r["perplexity"] for r in runs if r["window"] == window}
        bare = here.get((0, "text"))
        parts = [f"window {window}: {bare:,.2f} alone ({bare / full:.2f}× full)"]
        for (sinks, positions), value in sorted(here.items()):
            if sinks:
                parts.append(f"{value:,.2f} with {sinks} sink{'s' * (sinks > 1)} ({positions} positions, "
                             f"{value / full:.2f}× full)")
        lines.append("; ".join(parts))
    return (f"{result['model']}, {result['tokens']} tokens, full attention {full:,.2f}. " + ". ".join(lines) + ".")


def mix_words(result: dict) -> str:
    """Gemma 3's own mix in words, read from its runs: as trained, its local layers widened, and every layer
    windowed to the local layers' width (the global ones too), with the sinks kept where the runs have them."""
    mix, runs = result["mix"], result["runs"]
    full, width = runs[0]["perplexity"], mix["local_window"]
    widened = mix["widened"]["perplexity"]
    text = (f"{result['model']}: {mix['local_layers']} of its {mix['layers']} layers are local (each query reads the "
            f"last {width} keys), the others global (every key). On the same {result['tokens']:,} tokens: as trained "
            f"{full:,.2f}; its local layers widened to every key, their own rotation kept, {widened:,.2f} "
            f"({widened / full:.2f}× as trained)")
    same = {r["sinks"]: r["perplexity"] for r in runs if r["window"] == width and r["positions"] == "text"}
    if 0 in same:
        text += (f"; every layer windowed to {width} keys, the global ones too, {same[0]:,.2f} "
                 f"({same[0] / full:.2f}× as trained)")
        kept = [f"{same[k]:,.2f} with {k} sink{'s' * (k > 1)}" for k in sorted(same) if k]
        if kept:
            text += f", and {' or '.join(kept)} kept"
    return text + "."


OWN_HEADINGS = ("## Measured", "## A mix of local and global layers")


def kept_tail() -> str:
    """What docs/sinks.md holds after the sections this script writes (the Lab's section, written by hand), kept."""
    if not DOC.exists():
        return ""
    lines = DOC.read_text().splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if line.startswith("## ") and not line.startswith(OWN_HEADINGS)),
              None)
    return "" if at is None else "\n" + "".join(lines[at:])


def markdown(results: list[dict], command: str, stamp: str, load: tuple[float, float, float], seconds: float,
             mix_command: str = "", host: str = "") -> str:
    rows = ["| model | window | sinks | positions | perplexity | past the window |",
            "|---|---:|---:|---|---:|---:|"]
    for result in results:
        for r in result["runs"]:
            rows.append(f"| {result['model']} | {r['window'] or 'full'} | {r['sinks']} | {r['positions']} | "
                        f"{r['perplexity']:,.2f} | {past_window(r)} |")
    findings = "\n".join(f"- {words(result)}" for result in results)
    mixes = [result for result in results if result.get("mix")]
    mix = "" if not mixes else f"""
## A mix of local and global layers

Command: {mix_command or f"`{command}`"}. The local layers widened: forward's `local_windows=False` (their own window
removed, their rotation kept; tests/core/test_sinks.py holds it equal to transformers' Gemma 3 with a window wider
than the text).

{chr(10).join(f"- {mix_words(result)}" for result in mixes)}
"""
    return f"""# Attention sinks and a window of keys

`core/analysis/sinks.py`: `sink_scores` (each head's attention on the first token, Gu et al.'s Sink^ε) and
`streaming_perplexity` (StreamingLLM's experiment: query i reads keys j ≤ i with j < sinks or j > i − window).
positions="text" keeps every token's place in the text (one masked pass); positions="cache" renumbers positions
inside the cache as StreamingLLM does (token by token through the rolling KV cache, the sinks re-rotated each
step; tests/core/test_sinks.py checks it against StreamingLLM written out on transformers' modules). With no sinks the
two are the same for RoPE models: a window key's distance from the query is the same in the text and in the cache.

## Measured

Command: `{command}`, {stamp}, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}
({host or "the machine was not recorded"}; {seconds / 60:.1f} min in all). Text: `assets/texts/macbeth_acts_1_2.txt` (Shakespeare, public domain), its first
{results[0]['tokens'] if results else 0} tokens. "Past the window": the perplexity over the predictions made by queries
whose window hides something (positions ≥ window). Per-bin loss curves are in `assets/measured/streaming.json`. This
page gives no memory figure: what a window saves in memory is a measured peak, and belongs to the rolling cache's
benchmark, not to a count of entries.

{chr(10).join(rows)}

{findings}

Published ({PUBLISHED}): a window without sinks collapses once the text passes it, and four sinks bring it back
to near full attention. Compare the ratios above for direction and size, not equal numbers: these models are far
smaller and the slice is short. Notes: the rows are those the command asked for (its --windows, --sinks
and --cache-windows); cache positions are read one decode step per token (slow on a CPU), and with no sinks they
equal text positions for RoPE models (tests/core/test_sinks.py). Gemma 3's own local
layers keep their 512-token window under any window given here, and hide the sinks past it.
{mix}{kept_tail()}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma-3-270m"])
    parser.add_argument("--tokens", type=int, default=2048, help="the text's first N tokens")
    parser.add_argument("--windows", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--sinks", type=int, nargs="+", default=[0, 1, 4])
    parser.add_argument("--cache-windows", type=int, nargs="*", default=[],
                        help="windows also read with cache positions, token by token (slow on a CPU)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (one is faster than two on a machine other jobs load)")
    parser.add_argument("--render", action="store_true",
                        help="only write docs/sinks.md again from the saved assets/measured/streaming.json")
    parser.add_argument("--only-mix", action="store_true",
                        help="only add the local-and-global mix of the saved models that have one to the saved "
                             "assets/measured/streaming.json (on the same tokens), then write docs/sinks.md")
    args = parser.parse_args()
    if args.render or args.only_mix:
        saved = json.loads(OUT.read_text())
        if args.only_mix:
            torch.set_num_threads(args.threads)
            for result in saved["results"]:
                found = loaded(result["model"]) if result["model"] in args.models else None
                if found is not None:
                    model, folder = found
                    ids = torch.tensor(load_tokenizer(folder)(TEXT.read_text()).input_ids[:result["tokens"]])
                    assert int(ids[0]) == result["first_token"], "not the saved run's tokens"
                    mix = own_mix(model, ids)
                    if mix:
                        result["mix"] = mix
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            load = os.getloadavg()
            saved["mix_command"] = (f"`python scripts/streaming_experiment.py {shlex.join(sys.argv[1:])}`, {stamp}, "
                                    f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
            OUT.write_text(json.dumps(saved, indent=1) + "\n")
        DOC.write_text(markdown(saved["results"], saved["command"], saved["date"], saved["load_average"],
                                saved["seconds"], saved.get("mix_command", ""), saved.get("machine", "")))
        return
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    results = [r for r in (run_model(name, args) for name in args.models) if r is not None]
    seconds = time.perf_counter() - started
    command = "python scripts/streaming_experiment.py " + shlex.join(sys.argv[1:])
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    host = machine()
    OUT.write_text(json.dumps(dict(command=command, date=stamp, load_average=load, seconds=round(seconds, 1),
                                   machine=host, text=TEXT.name, published=PUBLISHED, results=results),
                              indent=1) + "\n")
    DOC.write_text(markdown(results, command, stamp, load, seconds, host=host))
    print(f"wrote {OUT.relative_to(ROOT)} and {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
