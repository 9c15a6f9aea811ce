"""Measure weights/registry.json's memory figures and write them back into the registry.

For each entry, in this order:
  installed    the weights are in the store (weights/ or $ATTN_WEIGHTS_DIR): load them with the core as float32
               on the CPU and count what the model holds (core.analysis.inspect.held_bytes: every parameter and
               buffer once). With --rss, also the peak resident memory (VmHWM) of a fresh process that loads it.
  config only  a config.json is there but no weights (a store folder, or the Hugging Face cache): build the core's
               model from it on the meta device, which allocates nothing, and count the same bytes as float32.
  announced    neither: the entry's own `parameters` count, from the source its `memory_source` names
               ("announced: ..."), × 4 bytes. Such an entry keeps its source; one with a memory_mb and no source
               is an error, since nothing here could say where its figure came from.

memory_mb = bytes / 2**20, rounded; `parameters` is the count it came from, `memory_source` says how.

Usage: python scripts/measure_registry.py [--dry-run] [--rss] [--only NAME ...]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from core.store.registry import REGISTRY_FILE, load_registry  # noqa: E402

FLOAT32_BYTES = 4
MEASURED = ("measured: python scripts/measure_registry.py loads it with the core as float32 and counts every "
            "parameter and buffer once")
FROM_CONFIG = "measured: python scripts/measure_registry.py builds the core's model from {where} on the meta device"
ANNOUNCED = "announced: "

# The peak resident memory of loading one model in a fresh process: VmHWM before the load (Python, torch and the
# core imported) and after it.
RSS_PROBE = """
import sys, torch
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
from core import load_model
before = hwm()
load_model(sys.argv[1], device="cpu", dtype=torch.float32)
print(before, hwm())
"""


def mib(n_bytes: float) -> int:
    return round(n_bytes / 2**20)


def store_folder(name: str) -> Path | None:
    from core.store import WeightStore

    folder = WeightStore.default().folder(name)
    return folder if (folder / "config.json").is_file() else None


def cached_config(entry: dict) -> Path | None:
    """config.json of the entry's hub repo where the Hugging Face cache already holds it; nothing is fetched."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for source in entry.get("sources", []):
        if source.get("type") == "hub":
            found = try_to_load_from_cache(source["repo"], "config.json")
            if isinstance(found, str):
                return Path(found)
    return None


def measure_loaded(folder: Path) -> tuple[int, int]:
    """(bytes held, parameters) of the model the core loads from `folder`, as float32 on the CPU."""
    import torch

    from core import load_model
    from core.analysis.inspect import held_bytes

    model = load_model(folder, device="cpu", dtype=torch.float32)
    return held_bytes(model), sum(p.numel() for p in model.parameters())


def measure_config(config: Path) -> tuple[int, int]:
    """(bytes, parameters) the core's model of this config.json would hold as float32, built on the meta device."""
    import torch

    from core.analysis.inspect import held_bytes
    from core.loading import read_config
    from core.model import Transformer

    cfg, _ = read_config(config.parent)
    with torch.device("meta"):
        model = Transformer(cfg).to(torch.float32)
    return held_bytes(model), sum(p.numel() for p in model.parameters())


def load_peak_rss(folder: Path) -> tuple[int, int]:
    """(VmHWM before the load, VmHWM after it) in bytes, of a fresh Python process that loads `folder`."""
    out = subprocess.run([sys.executable, "-c", RSS_PROBE, str(folder)], cwd=REPO_ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[-2]), int(out[-1])


def measure(name: str, entry: dict, rss: bool) -> dict:
    """The entry's new memory figures: {memory_mb, parameters, memory_source}, or {} when it has none."""
    folder = store_folder(name)
    if folder is not None and any(folder.glob("*.safetensors")):
        held, count = measure_loaded(folder)
        if rss:
            before, after = load_peak_rss(folder)
            print(f"  {name}: fresh-process load, VmHWM {mib(before):,} MiB after the imports, {mib(after):,} MiB "
                  f"after the load (+{mib(after - before):,} MiB)")
        return {"memory_mb": mib(held), "parameters": count, "memory_source": MEASURED}
    config = folder / "config.json" if folder is not None else cached_config(entry)
    if config is not None:
        held, count = measure_config(config)
        return {"memory_mb": mib(held), "parameters": count, "memory_source": FROM_CONFIG.format(where=config)}
    source = entry.get("memory_source", "")
    if source.startswith(ANNOUNCED) and isinstance(entry.get("parameters"), int):
        return {"memory_mb": mib(entry["parameters"] * FLOAT32_BYTES), "parameters": entry["parameters"],
                "memory_source": source}
    if "memory_mb" in entry:
        raise SystemExit(f"{name}: memory_mb {entry['memory_mb']} has no source: install the weights, put its "
                         "config.json in the store, or give `parameters` and `memory_source: \"announced: <where>\"`")
    return {}


def place(entry: dict, figures: dict) -> None:
    """Write `figures` into `entry` just before its sources, where a reader of the file looks for sizes."""
    old = dict(entry)
    keys = [key for key in old if key not in figures]
    cut = keys.index("sources") if "sources" in keys else len(keys)
    entry.clear()
    entry.update({key: old[key] for key in keys[:cut]})
    entry.update(figures)
    entry.update({key: old[key] for key in keys[cut:]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--registry", type=Path, default=REGISTRY_FILE)
    parser.add_argument("--dry-run", action="store_true", help="print the figures, leave the registry as it is")
    parser.add_argument("--rss", action="store_true", help="also the peak RSS of a fresh-process load (installed)")
    parser.add_argument("--only", nargs="*", default=None, help="registry names to measure (default: all)")
    args = parser.parse_args(argv)

    load_registry(args.registry)  # every entry checked before anything is rewritten
    data = json.loads(args.registry.read_text())
    for name, entry in data["models"].items():
        if args.only is not None and name not in args.only:
            continue
        figures = measure(name, entry, args.rss)
        if not figures:
            print(f"{name}: no figure (not installed, no local config.json, no announced count)")
            continue
        changed = "" if entry.get("memory_mb") == figures["memory_mb"] else f" (was {entry.get('memory_mb')})"
        print(f"{name}: {figures['memory_mb']:,} MiB{changed}, {figures['parameters']:,} parameters; "
              f"{figures['memory_source'].split(':')[0]}")
        place(entry, figures)
    if not args.dry_run:
        args.registry.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        load_registry(args.registry)
        print(f"wrote {args.registry}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
