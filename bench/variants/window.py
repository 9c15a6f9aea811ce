"""What a sliding window saves when capturing every layer's and head's attention over a long text.

Two Mistral-layout models with SmolLM2-135M's shapes (hidden 576, 30 layers, 9 heads, 3 kv heads, feed-forward
1536, vocabulary 49152, tied embeddings) and the same seeded random weights, saved to the temp folder with
save_pretrained: one with sliding_window=WINDOW, one with none. Each is loaded with core.load_model and captured
as the app does (core.analysis.capture over every layer and head) at LENGTH tokens, alternating, each capture in a
fresh process so that its peak memory (bench/common.py's PeakMemory: the kernel's high-water mark of the resident
set, VmHWM, reset just before the capture; on a GPU torch's peak allocation) is its own.
Prints medians (ranges) of the repeats, the ratio window/none, and the largest overview cell that lies wholly
further back than the window (0 when the window is honoured). A core that refuses the window: exit 2. With
--publish the table goes to docs/benchmarks.md (section window). Usage:
    python bench/variants/window.py [--length 4096] [--window 512] [--layers 30] [--repeats 5] [--device cpu|cuda]
                                    [--publish]
    python bench/variants/window.py --layers 2 --length 1024 --repeats 1       # a quick check that it runs
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for common

from common import (PeakMemory, add_publish, long_ids, md_table, measured_in_child, median, publish, spread,  # noqa: E402
                    sync)
SMOLLM2 = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, rms_norm_eps=1e-5,
               rope_theta=100000.0, bos_token_id=1, eos_token_id=2)


def model_folder(layers: int, window: int | None, length: int) -> Path:
    """A saved random Mistral model; seeded, so every window's folder holds the same weights."""
    from transformers import MistralConfig, MistralForCausalLM
    tag = f"w{window}" if window else "nowindow"
    folder = Path(tempfile.gettempdir()) / f"attention-explorer-window-{layers}l-{length}-{tag}"
    if (folder / "model.safetensors").is_file():
        return folder
    config = MistralConfig(**{**SMOLLM2, "num_hidden_layers": layers}, sliding_window=window,
                           max_position_embeddings=max(length, 8192))
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(folder)
    return folder


def beyond_window(overview, n: int, window: int) -> float:
    """The largest overview cell [L, H, S, S] whose every query is ≥ window tokens after its every key."""
    size = overview.shape[-1]
    j = np.arange(size)
    first_query = (j * n) // size                                  # cell i's rows start here (adaptive pooling)
    last_key = ((j + 1) * n + size - 1) // size - 1                # cell j's columns end here
    outside = first_query[:, None] - last_key[None, :] >= window   # [S, S]
    return float(overview[..., outside].max()) if outside.any() else 0.0


def measure(folder: str, length: int, device: str, window: int) -> dict:
    """In a child process: load, warm up, capture once, its peak memory by PeakMemory; or the ConfigError's words."""
    from core import ConfigError, load_model
    from core.analysis.capture import capture
    try:
        model = load_model(folder, device=device)
    except ConfigError as err:
        return {"config_error": str(err)}
    ids = long_ids(None, length).to(device)
    capture(model, ids[:, :64])  # warm-up
    with PeakMemory(device) as memory:
        sync(device)
        start = time.perf_counter()
        maps = capture(model, ids)
        sync(device)
        seconds = time.perf_counter() - start
    if memory.peak is None:
        raise SystemExit("peak memory needs the kernel's resettable high-water mark (Linux's /proc/self/clear_refs)")
    return {"seconds": seconds, "peak": memory.peak, "beyond": beyond_window(maps.overview, length, window)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_publish(parser)
    args = parser.parse_args()
    if not 0 < args.window < args.length:
        raise SystemExit(f"--window must be between 1 and --length - 1 ({args.length - 1}), got {args.window}")
    folders = {f"window {args.window}": model_folder(args.layers, args.window, args.length),
               "no window": model_folder(args.layers, None, args.length)}
    where = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    print(f"random Mistral-layout model, SmolLM2-135M's shapes, {args.layers} layers, {args.length} tokens, {where}, "
          f"threads {torch.get_num_threads()}; medians (ranges) of {args.repeats} alternating captures, each in a "
          f"fresh process")
    runs = {key: [] for key in folders}
    for _ in range(args.repeats):
        for key, folder in folders.items():
            result = measured_in_child("variants.window", str(folder), args.length, args.device, args.window)
            if "config_error" in result:
                print(f"this core does not load {key}: {result['config_error']}")
                raise SystemExit(2)
            runs[key].append(result)
    gib = 1024 ** 3
    print(f"{'':<14}{'capture s':>22}{'peak GB':>22}{'max cell beyond window':>26}")
    table = []
    for key, results in runs.items():
        seconds, peaks = [r["seconds"] for r in results], [r["peak"] / gib for r in results]
        beyond = max(r['beyond'] for r in results)
        print(f"{key:<14}{spread(seconds, 2):>22}{spread(peaks, 3):>22}{beyond:>26.3g}")
        table.append([key, f"{spread(seconds, 1)} s", f"{spread(peaks, 2)} GiB", f"{beyond:.2g}"])
    windowed, full = runs[f"window {args.window}"], runs["no window"]
    time_ratios = [w["seconds"] / f["seconds"] for w, f in zip(windowed, full)]
    peak_ratio = median([r["peak"] for r in windowed]) / median([r["peak"] for r in full])
    peak_name = ("torch's peak allocation on the GPU" if args.device.startswith("cuda")
                 else "the process's peak RSS (the kernel's VmHWM, reset just before the capture)")
    print(f"peak = {peak_name} during the capture, model weights included")
    if args.publish:
        table.append(["ratio, window / none", f"{spread(time_ratios, 2)}× the time (per pair)",
                      f"{peak_ratio:.2f}× (medians)", ""])
        publish("window", f"A Mistral-layout model with SmolLM2-135M's shapes ({args.layers} layers, 9 heads, seeded "
                          f"random weights, the same for both) with `sliding_window` {args.window} and without; "
                          f"`capture` of every layer and head at {args.length:,} tokens, {where}, "
                          f"{torch.get_num_threads()} thread(s), each capture in a fresh process, median (range) of "
                          f"{args.repeats} alternating runs. Peak: {peak_name}, weights included. Last column: the "
                          "largest pooled cell wholly outside the window (0: the window was honoured).\n\n" +
                md_table(["", "capture", "peak memory", "largest cell outside the window"], table,
                         ["---", "---:", "---:", "---:"]))
    print(f"SUMMARY window {args.window} / none at {args.length} tokens, {args.layers} layers ({where}): "
          f"capture time {spread(time_ratios, 2)}x, peak memory {peak_ratio:.2f}x")


if __name__ == "__main__":
    main()
