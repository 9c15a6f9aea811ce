"""python -m core.store list | pull NAME [--force] | verify NAME"""

from __future__ import annotations

import argparse
import sys
import time

from .errors import WeightsError
from .folders import WeightStore
from .manifest import MANIFEST, manifest_size, read_manifest
from .progress import TerminalProgress
from .registry import describe_source, gated_phrase, size_phrase


def format_size(size: int) -> str:
    if size < 1e6:
        return f"{size / 1e3:.1f} kB"
    return f"{size / 1e6:.1f} MB" if size < 1e9 else f"{size / 1e9:.2f} GB"


UNVERIFIED = "put here by hand, no manifest yet: adopted (its files recorded) when first loaded"


def list_rows(store: WeightStore) -> list[tuple[str, str, str, str, str, str]]:
    """(name, family, licence, size on disk, memory as float32, source) for registered and installed models; a
    model not installed shows the registry's sizes, so the cost of a pull is known before it starts."""
    installed = store.installed()
    rows = []
    for name, entry in sorted(store.registry.items()):
        manifest = installed.pop(name, None)
        memory = f"{entry['memory_mb']:,} MiB" if entry.get("memory_mb") else "-"
        if manifest is None:
            where = "not installed; sources: " + ", ".join(_describe_registry_source(s) for s in entry["sources"])
            if gated_phrase(entry):
                where += f"; {gated_phrase(entry)}"
            rows.append((name, entry["family"], entry["licence"], "-", memory, where))
        elif not manifest:
            rows.append((name, entry["family"], entry["licence"], "?", memory, UNVERIFIED))
        else:
            size = format_size(manifest_size(manifest))
            rows.append((name, entry["family"], entry["licence"], size, memory, describe_source(manifest["source"])))
    for name, manifest in installed.items():
        if not manifest:
            rows.append((name, "?", "unknown", "?", "-", UNVERIFIED))
            continue
        size = format_size(manifest_size(manifest))
        rows.append((name, "?", manifest.get("licence", "unknown"), size, "-", describe_source(manifest["source"])))
    return rows


def _describe_registry_source(source: dict) -> str:
    size = f": {source['disk_mb']:,} MB" if source.get("disk_mb") else ""
    return describe_source(source) + size


def print_list(store: WeightStore) -> None:
    rows = [("NAME", "FAMILY", "LICENCE", "SIZE", "MEMORY", "SOURCE"), *list_rows(store)]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[5])
    print(f"\nfolder: {store.root}")
    print("MEMORY: float32 parameters once loaded. A gated model needs its licence accepted on the hub, and HF_TOKEN.")


def pull(store: WeightStore, name: str, force: bool) -> None:
    entry = store.registry.get(name)
    if entry is not None and (force or name not in store.installed()):
        # the cost and the conditions of a download, before it starts
        for line in (size_phrase(entry), entry.get("licence_note", "") if entry.get("gated") else ""):
            if line:
                print(f"{name}: {line}")
    bar = TerminalProgress()
    start = time.monotonic()
    try:
        folder = store.ensure(name, bar, force=force)
    finally:
        bar.close()
    size = manifest_size(read_manifest(folder)) if (folder / MANIFEST).is_file() else 0
    print(f"{folder}  ({format_size(size)}, {time.monotonic() - start:.1f} s)")


def verify(store: WeightStore, name: str) -> None:
    start = time.monotonic()
    manifest = store.verify(name)
    size = format_size(manifest_size(manifest))
    print(f"ok: {len(manifest['files'])} files, {size} match {MANIFEST} ({time.monotonic() - start:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.store", description="The weight store: named models under weights/, checked by sha256."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="known and installed models with size and licence")
    pull_command = commands.add_parser("pull", help="fetch a model (registry name or hub repo id) with a progress bar")
    pull_command.add_argument("name")
    pull_command.add_argument("--force", action="store_true", help="fetch again even if installed and intact")
    verify_command = commands.add_parser("verify", help="recompute the sha256 of every file of an installed model")
    verify_command.add_argument("name")
    args = parser.parse_args(argv)

    try:
        store = WeightStore.default()
        if args.command == "list":
            print_list(store)
        elif args.command == "pull":
            pull(store, args.name, args.force)
        else:
            verify(store, args.name)
    except WeightsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
