"""manifest.json: the sha256 and size of every file of an installed model, and the checks against it."""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

from .errors import ChecksumMismatch, WeightsError
from .progress import Progress, no_progress

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path, name: str, source: dict, licence: str, progress: Progress = no_progress) -> dict:
    """Hash every file in `folder` and write manifest.json; mtime_ns lets later checks skip rehashing."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    total = sum(p.stat().st_size for p in files) or 1
    done, records = 0, {}
    for path in files:
        progress(done / total, f"sha256 {path.name}")
        stat = path.stat()
        records[path.relative_to(folder).as_posix()] = {
            "size": stat.st_size,
            "sha256": sha256_file(path),
            "mtime_ns": stat.st_mtime_ns,
        }
        done += stat.st_size
    manifest = {
        "format": MANIFEST_FORMAT,
        "name": name,
        "licence": licence,
        "source": source,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "files": records,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    progress(1.0, "manifest written")
    return manifest


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ChecksumMismatch(f"{folder} has no {MANIFEST}; it was not installed by the weight store") from None
    except json.JSONDecodeError as e:
        raise ChecksumMismatch(f"{path} is not valid JSON ({e}); delete {folder} and pull it again") from None
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("files"), dict):
        raise ChecksumMismatch(f"{path} is not a format-{MANIFEST_FORMAT} manifest; delete {folder} and pull it again")
    return manifest


def manifest_size(manifest: dict) -> int:
    return sum(record["size"] for record in manifest["files"].values())


def check_files(folder: Path, manifest: dict, full: bool) -> list[str]:
    """Compare files with the manifest and return one line per problem.

    full=False (every load) rehashes only files whose size or mtime changed since the manifest was
    written, so a second pull is instant; full=True (`verify`) rehashes everything.
    """
    problems = []
    for rel, record in manifest["files"].items():
        path = folder / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        stat = path.stat()
        if stat.st_size != record["size"]:
            problems.append(f"{rel}: size {stat.st_size} bytes, manifest says {record['size']}")
            continue
        if full or stat.st_mtime_ns != record.get("mtime_ns"):
            actual = sha256_file(path)
            if actual != record["sha256"]:
                problems.append(f"{rel}: sha256 {actual[:16]}..., manifest says {record['sha256'][:16]}...")
    return problems


def raise_if_corrupt(folder: Path, manifest: dict, full: bool, name: str) -> None:
    problems = check_files(folder, manifest, full)
    if problems:
        listing = "\n  - ".join(problems)
        raise ChecksumMismatch(
            f"{folder} does not match its manifest:\n  - {listing}\n"
            f"Fetch it again with `python -m core.store pull {name} --force` (or delete the folder)."
        )


def check_model_folder(folder: Path) -> None:
    """A loadable folder has config.json and readable safetensors; pickled .bin files never count."""
    if not (folder / "config.json").is_file():
        raise WeightsError(
            f"{folder} has no config.json; a model folder needs config.json, *.safetensors and tokenizer files"
        )
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        found = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
        raise WeightsError(
            f"{folder} has no *.safetensors weights (found: {found}); pickled .bin files are never loaded"
        )
    from safetensors import safe_open  # noqa: PLC0415 - `python -m core.store list` needs none of it

    for shard in shards:
        try:
            with safe_open(str(shard), framework="pt") as f:
                f.keys()
        except Exception as e:  # the header is unreadable: truncated or not safetensors at all
            raise WeightsError(f"{shard} is not a readable safetensors file: {e}") from None
