"""What a rolling KV cache saves at a long context: the bytes the cache holds at LENGTH tokens, measured, for the full
cache (one entry per token in every layer) and the rolling one (core/kv_cache.py RollingKVCache: a ring of
window + sinks entries in each sliding-window layer, the whole context in the global ones).

The model has Gemma 3 270M's attention shapes (18 layers, local layers with a 512-token window and every 6th layer
global, 4 query heads sharing 1 key/value head of 256), read from weights/gemma-3-270m/config.json when it is
installed, else these same numbers; its other sizes are shrunk (hidden 64, vocabulary 256, seeded random weights),
as the cache's size depends on the attention shapes only. Each measurement runs in a fresh process: the model is
loaded, then inside bench/common.py's PeakMemory (the kernel's high-water mark of the resident set, VmHWM, reset on
entry) the cache is made and filled with LENGTH tokens of keys and values through its own write() (the full cache in
chunks of 256, the ring a chunk up to its window and then one token at a time, as generation writes it). Reported:
that peak's growth over the block, and beside it the bytes of the cache's own tensors (KVCache.nbytes) as a check.
Usage:
    python bench/variants/rolling_cache.py [--length 4096] [--repeats 5] [--publish]
    python bench/variants/rolling_cache.py --length 1024 --repeats 1        # a quick check that it runs
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/, for common

from common import (PeakMemory, add_publish, load_average, md_table, measured_in_child, median, publish,  # noqa: E402
                    spread)

REPO = Path(__file__).resolve().parent.parent.parent
GEMMA3_270M = dict(num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                   sliding_window=512, query_pre_attn_scalar=256)
CHUNK = 256
VARIANTS = {"full cache": None, "rolling": 0, "rolling + 4 sinks": 4}   # name -> sinks (None: the full cache)


def attention_shapes() -> tuple[dict, str]:
    """Gemma 3 270M's attention shapes, from its installed config.json when there is one."""
    config = REPO / "weights" / "gemma-3-270m" / "config.json"
    if not config.is_file():
        return GEMMA3_270M, "Gemma 3 270M's published shapes (not installed here)"
    raw = json.loads(config.read_text())
    shapes = {key: raw[key] for key in GEMMA3_270M}
    shapes["layer_types"] = raw["layer_types"]
    return shapes, "weights/gemma-3-270m/config.json"


def model_folder(shapes: dict, length: int) -> Path:
    """A saved seeded random Gemma 3 with those attention shapes and small everything else."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    folder = Path(tempfile.gettempdir()) / f"attention-explorer-rolling-{length}"
    if (folder / "model.safetensors").is_file():
        return folder
    config = Gemma3TextConfig(**shapes, hidden_size=64, intermediate_size=128, vocab_size=256,
                              max_position_embeddings=max(length, 8192))
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).save_pretrained(folder)
    return folder


def fill(cache, model, length: int) -> None:
    """LENGTH tokens of random keys and values through cache.write, as prefill and decode steps write them."""
    cfg = model.config
    gen = torch.Generator().manual_seed(0)
    chunk = CHUNK if not hasattr(cache, "window") else min(CHUNK, cache.window)
    while cache.length < length:
        bulk = not hasattr(cache, "window") or cache.length + chunk <= cache.window
        n = min(chunk, length - cache.length) if bulk else 1
        shape = (1, cfg.n_kv_heads, n, cfg.head_dim)
        for layer in range(cfg.n_layers):
            k, v = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
            cache.write(layer, k, v, None if bulk else cache.slot)
        cache.advance(n)


def measure(folder: str, length: int, sinks: int | None) -> dict:
    """In a child process: the peak RSS growth while one cache is made and filled, and its tensors' bytes."""
    from core import load_model
    from core.generate import rolling_cache
    model = load_model(folder, device="cpu", dtype=torch.float32)
    warm = model.new_cache(1, 8)   # the first allocation's own costs are not the cache's
    fill(warm, model, 8)
    with PeakMemory("cpu", required=True) as memory:
        cache = model.new_cache(1, length) if sinks is None else rolling_cache(model, 1, length, sinks=sinks)
        fill(cache, model, length)
    return {"added": memory.added, "nbytes": cache.nbytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    add_publish(parser)
    args = parser.parse_args()
    shapes, origin = attention_shapes()
    if not shapes["sliding_window"] < args.length:
        raise SystemExit(f"--length must pass the window ({shapes['sliding_window']} tokens), got {args.length}")
    folder = model_folder(shapes, args.length)
    print(f"Gemma 3 270M's attention shapes ({origin}): {shapes['num_hidden_layers']} layers, window "
          f"{shapes['sliding_window']}, {shapes['num_key_value_heads']} kv head of {shapes['head_dim']}; float32, "
          f"{args.length:,} tokens; medians (ranges) of {args.repeats} alternating runs, each in a fresh process; "
          f"load average {load_average() or 0:.2f}")
    runs = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, sinks in VARIANTS.items():
            runs[name].append(measured_in_child("variants.rolling_cache", str(folder), args.length, sinks))
    mib = 2 ** 20
    full = median([r["added"] for r in runs["full cache"]])
    table = []
    for name, results in runs.items():
        added = [r["added"] / mib for r in results]
        nbytes = results[0]["nbytes"] / mib
        ratio = median([r["added"] for r in results]) / full
        print(f"{name:<20} peak RSS growth {spread(added, 1):>22} MiB   tensors {nbytes:8.1f} MiB   "
              f"{ratio:.3f}x the full cache")
        table.append([name, f"{spread(added, 1)} MiB", f"{nbytes:.1f} MiB", f"{ratio:.3f}×"])
    if args.publish:
        publish("rolling-cache", f"The KV cache at {args.length:,} tokens for a model with Gemma 3 270M's attention "
                                 f"shapes ({shapes['num_hidden_layers']} layers, the local ones with a "
                                 f"{shapes['sliding_window']}-token window, 1 kv head of "
                                 f"{shapes['head_dim']}), float32, filled through the cache's own write(); each run "
                                 f"in a fresh process, median (range) of {args.repeats} alternating runs. Measured: "
                                 "the growth of the process's peak RSS (VmHWM, reset just before) while the cache "
                                 "is made and filled; beside it the bytes of the cache's tensors.\n\n" +
                md_table(["cache", "peak RSS growth", "its tensors", "of the full cache"], table,
                         ["---", "---:", "---:", "---:"]))
    print(f"SUMMARY rolling / full cache at {args.length} tokens: "
          f"{median([r['added'] for r in runs['rolling']]) / full:.3f}x (peak RSS growth, medians)")


if __name__ == "__main__":
    main()
