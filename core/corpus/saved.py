"""Results that last: a corpus job (an analysis's *_over) saved item by item as it runs, resumed after a kill from the
items it finished, reopened without recomputing once done, and exported as CSV and .npz.

A job's identity (identity()): the model's name, the corpus hash (sha256 over every item's token ids in order; a
pair's answer and foil too), the analysis and its arguments (defaults filled in), and the code's version: `git
describe --always --tags` of this repository where git can see it (with "-dirty-" and a hash of the difference
where core/, the code that measures, differs from the commit), else "core-" and a sha256 of core/'s sources (there
is no package version); `version_from` says which. A job resumes only on the same version.
The date it started is kept beside, not in the identity, so a rerun finds the same folder. One folder per job:

    ROOT/MODEL__ANALYSIS__CORPUS12__KEY12/
        job.json            the identity, the date it started
        items/000007.npz    one finished item's value (float tensors in float32, float64 kept as it is), written to
                            a hidden temporary file and renamed: a kill never leaves half an item under a name read
        result.npz          each Over's mean, low, high, per_item and items, once every item is measured
        meta.json           written last, so its presence says the job finished: the identity, n, notes, the items
                            left out of each part (index → why), dates

A job measured elsewhere in chunks (core/corpus/chunks.py) is saved by the same steps run_over takes: begin,
write_item for each finished item, save_result; so one folder resumes in one process or in chunks alike.

Files are JSON and .npz read with allow_pickle=False: nothing on disk is ever unpickled.

The root is the caller's: default_root() gives $ATTN_RUNS_DIR where set, else /data/runs on a Hugging Face Space
with persistent storage (SPACE_ID set and /data writable, as the weight store chooses /data/weights), else runs/.
A shared server keeps each page's jobs private by giving each page its own root, caps each root's size
(run_over's max_bytes, or its `room` check) and deletes each job a stated time after its last write (told of each
write by run_over's `wrote`; prune does the same by the files' times)."""
from __future__ import annotations

import csv
import functools
import hashlib
import inspect
import io
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from . import Pair, stats
from .jobs import Analysis, Each, Progress, Stop, check_pairs, check_texts
from .stats import Over

log = logging.getLogger(__name__)

RUNS_SETTING = "ATTN_RUNS_DIR"      # where saved jobs go, unless the caller says
DEFAULT_ROOT = Path("runs")
PERSISTENT_STORAGE = Path("/data")  # a Space's persistent storage, when it has some
DEFAULT_MAX_AGE_S = 3600.0          # prune's suggested age: a shared server's private Lab runs live as long
REPO = Path(__file__).resolve().parents[2]
JOB, META, RESULT, ITEMS = "job.json", "meta.json", "result.npz", "items"
ITEM_FILE = re.compile(r"(\d+)\.npz")
OVER_FIELDS = ("mean", "low", "high", "per_item")
CALLER_ARGUMENTS = {"model", "texts", "pairs", "progress", "stop", "each", "done"}


# ---- the arguments of a job ----

def arguments_of(analysis: Analysis, given: dict) -> dict:
    """The analysis's own arguments with their defaults filled in, so that leaving one out and giving its default
    name the same job; each a JSON value (a number, a string, true/false or null)."""
    name = analysis.name
    parameters = {key: p for key, p in inspect.signature(analysis.run).parameters.items()
                  if key not in CALLER_ARGUMENTS}
    unknown = sorted(set(given) - set(parameters))
    if unknown:
        raise ValueError(f"{name} takes the arguments {', '.join(parameters) or 'none'}, not {', '.join(unknown)}")
    missing = [key for key, p in parameters.items() if p.default is inspect.Parameter.empty and key not in given]
    if missing:
        raise ValueError(f"{name} needs the argument(s) {', '.join(missing)}")
    arguments = {key: given.get(key, p.default) for key, p in parameters.items()}
    for key, value in arguments.items():
        if not (value is None or isinstance(value, (bool, int, float, str))):
            raise ValueError(f"{name}'s argument {key} must be a number, a string, a bool or None to be saved with "
                             f"the job, got {type(value).__name__}")
    return arguments


# ---- identity: corpus hash, code version ----

def corpus_hash(items: Sequence) -> str:
    """sha256 over the kind of corpus and each item's token ids in order (each length-prefixed, little-endian
    int64); a pair hashes its clean ids, its corrupted ids, its answer and its foil."""
    kinds = {"pairs" if isinstance(item, Pair) else "texts" if isinstance(item, Tensor) else "?" for item in items}
    if len(kinds) != 1 or "?" in kinds:
        raise ValueError("a corpus is a list of 1-D token-id tensors (texts) or a list of Pairs, not a mix or "
                         f"anything else (got {sorted(kinds)})")
    digest = hashlib.sha256(kinds.pop().encode())
    for item in items:
        parts = ((item.clean, item.corrupted, torch.tensor([int(item.answer), int(item.foil)]))
                 if isinstance(item, Pair) else (item,))
        for ids in parts:
            ids = ids.detach().cpu().reshape(-1).numpy().astype("<i8")
            digest.update(len(ids).to_bytes(8, "little"))
            digest.update(ids.tobytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def code_version() -> tuple[str, str]:
    """(version, where it came from): git describe of this repository (and a hash of core/'s uncommitted
    changes), else a sha256 of core/'s sources. Computed once per process."""
    if (REPO / ".git").exists():
        git = ["git", "-C", str(REPO)]
        quiet = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}   # read only: never take the index lock of others
        try:
            found = subprocess.run([*git, "describe", "--always", "--tags"], check=False, capture_output=True,
                                   text=True, timeout=20, env=quiet)
            changed = subprocess.run([*git, "diff", "HEAD", "--", "core"], check=False, capture_output=True,
                                     timeout=20, env=quiet)
            if found.returncode == 0 and found.stdout.strip() and changed.returncode == 0:
                dirty = f"-dirty-{hashlib.sha256(changed.stdout).hexdigest()[:8]}" if changed.stdout else ""
                return found.stdout.strip() + dirty, "git describe"
        except (OSError, subprocess.SubprocessError):
            pass
    digest = hashlib.sha256()
    for path in sorted((REPO / "core").rglob("*.py")):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return "core-" + digest.hexdigest()[:16], "sha256 of core/*.py"


def identity(analysis: str, model_name: str, items: Sequence, arguments: dict) -> dict:
    version, version_from = code_version()
    return {"model": model_name, "analysis": analysis, "arguments": arguments, "corpus": corpus_hash(items),
            "items": len(items), "version": version, "version_from": version_from}


def job_key(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "model"


def job_folder(root: Path, ident: dict) -> Path:
    return Path(root) / (f"{safe_name(ident['model'])}__{ident['analysis']}__{ident['corpus'][:12]}__"
                         f"{job_key(ident)[:12]}")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ---- files: written whole or not at all, read without pickle ----

def write_atomic(path: Path, write: Callable) -> None:
    """write(file) into a hidden temporary file beside path, then rename it over path (atomic on one disk)."""
    temporary = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        with open(temporary, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_json(path: Path, value: dict) -> None:
    write_atomic(path, lambda file: file.write(json.dumps(value, indent=1, sort_keys=True).encode()))


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise ValueError(f"{path} is not a readable job file: {type(error).__name__}: {error}") from None


def read_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as arrays:
        return {key: arrays[key] for key in arrays.files}


def stored(tensor: Tensor) -> np.ndarray:
    """A tensor as saved: floats in float32 (float64 kept), so bfloat16 and float16 read back exactly."""
    tensor = tensor.detach().cpu()
    if tensor.is_floating_point() and tensor.dtype != torch.float64:
        tensor = tensor.float()
    return tensor.numpy()


def pack(value) -> dict[str, np.ndarray]:
    """An item's value (a tensor, a tuple of them or a dict of them) → named arrays, with each one's dtype."""
    if isinstance(value, Tensor):
        parts = {"tensor": value}
    elif isinstance(value, tuple):
        parts = {f"tuple.{i}": part for i, part in enumerate(value)}
    elif isinstance(value, dict):
        parts = {f"dict.{name}": part for name, part in value.items()}
    else:
        raise TypeError(f"an item's value is a tensor, a tuple or a dict of tensors, got {type(value).__name__}")
    arrays = {key: stored(part) for key, part in parts.items()}
    arrays["dtypes"] = np.array([f"{key}={str(part.dtype).removeprefix('torch.')}" for key, part in parts.items()])
    return arrays


def dtype_named(name) -> torch.dtype:
    """The torch dtype a saved file names ("float32", "bfloat16"), or a ValueError: a damaged name ("Tensor",
    "nonesuch", a number) makes the file unreadable, as damaged bytes do, and it is measured again."""
    found = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(found, torch.dtype):
        raise ValueError(f"{str(name)[:40]!r} is not a torch dtype name (e.g. float32, bfloat16)")
    return found


def unpack(arrays: dict[str, np.ndarray]):
    dtypes = dict(entry.split("=", 1) for entry in arrays["dtypes"].tolist())
    parts = {key: torch.from_numpy(arrays[key]).to(dtype_named(dtypes[key])) for key in dtypes}
    if "tensor" in parts:
        return parts["tensor"]
    if all(key.startswith("tuple.") for key in parts):
        return tuple(parts[f"tuple.{i}"] for i in range(len(parts)))
    return {key.removeprefix("dict."): part for key, part in parts.items()}


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz file's bytes, made in memory so that its size is known before anything is written."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def write_item(folder: Path, index: int, value, fits: Callable[[int], None] | None = None) -> None:
    """One finished item's file. fits(size), where given, is asked first with the file's size in bytes and
    raises NoRoom to refuse it: nothing is written then."""
    data = npz_bytes(pack(value))
    if fits is not None:
        fits(len(data))
    write_atomic(folder / ITEMS / f"{index:06d}.npz", lambda file: file.write(data))


def read_items(folder: Path, total: int) -> dict[int, object]:
    """index → value of every finished item on disk (0 ≤ index < total). Temporary files of an item being written
    when a job was killed do not match the name read; a file that cannot be read is logged and measured again."""
    found = {}
    items = folder / ITEMS
    for path in sorted(items.iterdir()) if items.is_dir() else ():
        match = ITEM_FILE.fullmatch(path.name)
        if match is None or int(match[1]) >= total:
            continue
        try:
            found[int(match[1])] = unpack(read_npz(path))
        except (OSError, ValueError, KeyError, AttributeError, TypeError, EOFError, zipfile.BadZipFile) as error:
            log.warning("ignoring the unreadable item file %s (it will be measured again): %s", path, error)
    return found


# ---- a job: run or resume, reopen ----

@dataclass
class Run:
    folder: Path
    result: object          # what the analysis returns: an Over, (heads, mlps) Overs, or {kind: Over}
    finished: bool          # every item measured and the result saved (False: stopped; its items are kept)
    reused: int             # items read back from disk, not measured again
    measured: int           # items measured by this call
    full: str = ""          # why the job stopped saving (a cap on the saved bytes reached: NoRoom's words), or ""


def parts_of(result) -> dict[str, Over]:
    if isinstance(result, Over):
        return {"over": result}
    if isinstance(result, tuple):
        return dict(zip(("heads", "mlps"), result))
    return dict(result)


def result_of(form: str, parts: dict[str, Over]):
    if form == "over":
        return parts["over"]
    if form == "tuple":
        return parts["heads"], parts["mlps"]
    return parts


def disk_usage(root: Path) -> int:
    """Bytes of every file under root."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


class NoRoom(ValueError):
    """A new job refused because a cap on the saved results' bytes is reached: the message says which."""


def check_room(root: Path, max_bytes: int | None) -> None:
    if max_bytes is None:
        return
    used = disk_usage(root)
    if used >= max_bytes:
        raise NoRoom(f"the saved results under {root} take {used / 1e6:.1f} MB, at or over this server's cap of "
                     f"{max_bytes / 1e6:.1f} MB, so no new job is saved there: delete older jobs (prune) or wait "
                     "until they expire")


def room_for(root: Path, max_bytes: int | None, room: Callable[[int], None] | None) -> Callable[[int], None]:
    """fits(size): the check before each file a running job writes (an item, its result), raising NoRoom when
    `size` more bytes would take root past max_bytes, or when room(size) refuses them. The root's usage is read
    once, at the job's first write, and counted up as the job writes: a job's files, however many, cannot pass
    the cap, and no write walks the folder again."""
    used: list[int] = []

    def fits(size: int) -> None:
        if max_bytes is not None:
            if not used:
                used.append(disk_usage(root))
            if used[0] + size > max_bytes:
                raise NoRoom(f"the next {size / 1e3:.1f} kB would take the saved results under {root} to "
                             f"{(used[0] + size) / 1e6:.2f} MB, over this server's cap of {max_bytes / 1e6:.2f} MB")
            used[0] += size
        if room is not None:
            room(size)

    return fits


def run_over(analysis: Analysis, model, items: Sequence, root, model_name: str, *, max_bytes: int | None = None,
             room: Callable[[int], None] | None = None, wrote: Callable[[Path], None] | None = None,
             progress: Progress | None = None, stop: Stop | None = None,
             each: Each | None = None, **arguments) -> Run:
    """Run one analysis (an Analysis: core/analysis/over.py's ANALYSES names them) over `items`
    (texts for head_scores and ablation, Pairs for the others) with `arguments` (its own, e.g. site="z"), saving
    each item under root as it finishes. A job already finished is reopened without measuring anything; one
    stopped or killed before resumes: its items on disk are read back, only the rest are measured, and the summary
    is of all of them in input order, as one uninterrupted run gives. max_bytes: refuse to start a new job while
    root holds that many bytes or more; room(0), where given, is asked too before a new job starts and raises
    NoRoom to refuse it. Both are asked again before each file the job writes (room(size), room_for's fits): the
    first item that would pass a cap is not written, nor is any after it or the result; the job goes on measuring
    (a job past a cap is shown, not saved), the items that fit stay on disk for a later run to resume from, and
    the Run's `full` says why. wrote(folder), where
    given, is told each time the job's folder is written: as a new or resumed job starts, after each item, once
    the result is saved (a shared server counts a job's lifetime from its last write). progress, stop and each as in jobs.py."""
    spec = analysis
    arguments = arguments_of(analysis, arguments)
    if not isinstance(model_name, str) or not model_name.strip():
        raise ValueError(f"model_name names the model in the job's identity and folder: a non-empty string, "
                         f"got {model_name!r}")
    check = check_pairs if spec.items == "pairs" else check_texts
    if any(isinstance(item, Pair) for item in items) != (spec.items == "pairs"):
        wanted = "Pair(clean, corrupted, answer, foil)s" if spec.items == "pairs" else "1-D token-id tensors"
        raise ValueError(f"{spec.name} runs over {spec.items}: give {wanted}")
    items = check(model, items)
    told = wrote or (lambda folder: None)
    begun = begin(analysis, items, root, model_name, arguments, max_bytes=max_bytes, room=room, wrote=told)
    if begun.finished is not None:
        return begun.finished
    folder, done = begun.folder, begun.done
    fits = room_for(Path(root), max_bytes, room)
    measured, stopped, full = [0], [False], []

    def keep(index: int, value) -> None:
        if not full:
            try:
                write_item(folder, index, value, fits)
                told(folder)
            except NoRoom as error:     # this item and every one after it are measured and shown, not kept
                full.append(str(error))
        measured[0] += 1
        if each is not None:
            each(index, value)

    def stopping() -> bool:
        stopped[0] = stopped[0] or (stop is not None and bool(stop()))
        return stopped[0]

    try:
        result = spec.run(model, items, progress=progress, stop=stopping, each=keep, done=done, **arguments)
    except ValueError:
        if begun.new and not measured[0]:     # refused (the model, an argument): leave no empty job behind
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if not stopped[0] and not full:
        try:
            save_result(folder, begun.ident, spec, arguments, result, fits)
            told(folder)
        except NoRoom as error:
            full.append(str(error))
    return Run(folder, result, not stopped[0] and not full, len(done), measured[0], full[0] if full else "")


@dataclass
class Begun:
    """A job's folder as a run finds it: finished (reopened as `finished`), or started or resumed."""
    folder: Path
    ident: dict
    done: dict[int, object]     # index → value of each item finished before (read back from items/)
    new: bool                   # this run made the folder
    finished: Run | None = None


def begin(analysis: Analysis, items: Sequence, root, model_name: str, arguments: dict, *, max_bytes: int | None = None,
          room: Callable[[int], None] | None = None, wrote: Callable[[Path], None] = lambda folder: None) -> Begun:
    """The job of `analysis` over the checked `items` with `arguments` (arguments_of's) under root: a finished
    one reopened without measuring; a stopped or killed one's finished items read back; a new one's folder and
    job.json made once max_bytes and room() allow (run_over says how). Whoever measures the rest writes each item
    with write_item, whichever process it ran in, and the result with save_result."""
    ident = identity(analysis.name, model_name, items, arguments)
    folder = job_folder(Path(root), ident)
    if (folder / META).exists():
        try:
            return Begun(folder, ident, {}, False, open_job(folder))
        except (ValueError, KeyError, OSError, zipfile.BadZipFile) as error:
            log.warning("the saved result in %s is unreadable, measuring again from its items: %s", folder, error)
            (folder / META).unlink(missing_ok=True)
    if (folder / JOB).exists():
        saved = read_json(folder / JOB)
        if {key: saved.get(key) for key in ident} != ident:
            raise ValueError(f"{folder} holds another job ({saved.get('analysis')} of {saved.get('model')}); "
                             "move it away or give another root")
    new = not (folder / JOB).exists()
    if new:
        check_room(Path(root), max_bytes)
        if room is not None:
            room(0)
        (folder / ITEMS).mkdir(parents=True, exist_ok=True)
        write_json(folder / JOB, {**ident, "created": now_iso()})
    wrote(folder)
    return Begun(folder, ident, read_items(folder, analysis.count(arguments, len(items))), new)


def save_result(folder: Path, ident: dict, spec: Analysis, arguments: dict, result,
                fits: Callable[[int], None] | None = None) -> None:
    """result.npz (each part's mean, low, high, per_item, items), then meta.json: the job is finished. fits(size),
    where given, is asked first with result.npz's size and raises NoRoom to refuse it: nothing is written then."""
    parts = parts_of(result)
    axes = spec.axes(arguments)
    arrays = {}
    for name, over in parts.items():
        arrays.update({f"{name}.{key}": stored(getattr(over, key)) for key in OVER_FIELDS})
        arrays[f"{name}.items"] = np.asarray(over.items, dtype=np.int64)
    data = npz_bytes(arrays)
    if fits is not None:
        fits(len(data))
    write_atomic(folder / RESULT, lambda file: file.write(data))
    form = "over" if isinstance(result, Over) else "tuple" if isinstance(result, tuple) else "dict"
    created = read_json(folder / JOB).get("created")
    write_json(folder / META, {
        **ident, "created": created, "finished": now_iso(), "form": form,
        "parts": {name: {"n": over.n, "note": over.note, "dtype": str(over.mean.dtype).removeprefix("torch."),
                         "left_out": {str(i): why for i, why in sorted(over.left_out.items())},
                         "interval": over.interval, "bounds": None if over.bounds is None else list(over.bounds),
                         "axes": list(axes.get(name, axes.get("*", ())))} for name, over in parts.items()}})


def older_interval(n: int) -> str:
    """The interval a job saved before its meta.json named one holds: Student's t wherever n ≥ 2."""
    return stats.STUDENT if n >= 2 else stats.NO_INTERVAL


def open_job(folder) -> Run:
    """A finished job's result, read back from result.npz and meta.json; nothing is measured."""
    folder = Path(folder)
    if not (folder / META).exists():
        raise ValueError(f"{folder} holds no finished job (no {META}); run it with run_over to finish it")
    meta = read_json(folder / META)
    arrays = read_npz(folder / RESULT)
    try:
        parts = {}
        for name, part in meta["parts"].items():
            kind = dtype_named(part["dtype"])
            values = {key: torch.from_numpy(arrays[f"{name}.{key}"]).to(kind) for key in OVER_FIELDS}
            left_out = {int(i): why for i, why in part.get("left_out", {}).items()}  # older jobs: only the note says
            bounds = part.get("bounds")
            parts[name] = Over(values["mean"], values["low"], values["high"], values["per_item"], part["n"],
                               part["note"], tuple(int(i) for i in arrays[f"{name}.items"]), left_out,
                               part.get("interval", older_interval(part["n"])),
                               None if bounds is None else tuple(bounds))
        result = result_of(meta["form"], parts)
    except (TypeError, AttributeError, IndexError) as error:   # a field of the wrong kind: damaged, as bad bytes are
        raise ValueError(f"{folder / META} is not a readable job file: {type(error).__name__}: {error}") from None
    on_disk = sum(1 for path in (folder / ITEMS).glob("*.npz") if ITEM_FILE.fullmatch(path.name))
    return Run(folder, result, True, on_disk, 0)


def jobs(root) -> list[dict]:
    """Every job under root, newest first: its job.json (or meta.json once finished), with "folder" and
    "finished" added."""
    found = []
    for folder in Path(root).iterdir() if Path(root).is_dir() else ():
        try:
            meta = read_json(folder / (META if (folder / META).exists() else JOB))
        except ValueError:
            continue
        found.append({**meta, "folder": str(folder), "finished": (folder / META).exists()})
    return sorted(found, key=lambda job: job.get("created") or "", reverse=True)


# ---- export ----

def export(folder, out) -> list[Path]:
    """A finished job as files in `out`, named MODEL_ANALYSIS_CORPUS12 (with the part for several): per part, a
    CSV of its cells (one row each: the axes, e.g. layer and head, then mean, low, high, n) and a CSV of its items
    (item, the axes, value; item is the index in the input corpus), and the .npz of the whole result."""
    run = open_job(folder)
    meta = read_json(Path(folder) / META)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{safe_name(meta['model'])}_{meta['analysis']}_{meta['corpus'][:12]}"
    written = [out / f"{stem}.npz"]
    shutil.copyfile(Path(folder) / RESULT, written[0])
    parts = parts_of(run.result)
    for name, over in parts.items():
        axes = meta["parts"][name]["axes"]
        named = stem if len(parts) == 1 else f"{stem}_{name}"
        mean, low, high = (stored(t) for t in (over.mean, over.low, over.high))
        with open(out / f"{named}.csv", "w", newline="", encoding="utf-8") as file:
            rows = csv.writer(file)
            rows.writerow([*axes, "mean", "low", "high", "n"])
            for cell in np.ndindex(mean.shape):
                rows.writerow([*cell, repr(float(mean[cell])), repr(float(low[cell])), repr(float(high[cell])),
                               over.n])
        per_item = stored(over.per_item)
        with open(out / f"{named}_items.csv", "w", newline="", encoding="utf-8") as file:
            rows = csv.writer(file)
            rows.writerow(["item", *axes, "value"])
            for row, item in enumerate(over.items):
                for cell in np.ndindex(per_item.shape[1:]):
                    rows.writerow([item, *cell, repr(float(per_item[(row, *cell)]))])
        written += [out / f"{named}.csv", out / f"{named}_items.csv"]
    return written


# ---- limits for a shared server ----

def default_root(environ=None) -> Path:
    """$ATTN_RUNS_DIR where set; else /data/runs on a Hugging Face Space with persistent storage (SPACE_ID set,
    /data a writable folder), which outlives restarts; else runs/ in the working directory."""
    environ = os.environ if environ is None else environ
    if environ.get(RUNS_SETTING):
        return Path(environ[RUNS_SETTING]).expanduser()
    if environ.get("SPACE_ID") and PERSISTENT_STORAGE.is_dir() and os.access(PERSISTENT_STORAGE, os.W_OK):
        return PERSISTENT_STORAGE / "runs"
    return DEFAULT_ROOT


def last_write(folder: Path) -> float:
    return max((path.stat().st_mtime for path in [folder, *folder.rglob("*")]), default=0.0)


def prune(root, max_age_s: float = DEFAULT_MAX_AGE_S, now: float | None = None) -> list[Path]:
    """Delete every job under root whose last write (job.json, an item finishing, or the result saved: the
    newest modification time of its files) is more than max_age_s seconds before now (time.time() unless given);
    so a finished job lives max_age_s after it was saved (DEFAULT_MAX_AGE_S, an hour, as a shared server's
    private Lab runs), and a running one is never cut off while items keep finishing. Only job folders (with a
    job.json) are touched. Returns the folders deleted."""
    if max_age_s < 0:
        raise ValueError(f"max_age_s is an age in seconds, 0 or more, got {max_age_s}")
    now = time.time() if now is None else now
    deleted = []
    for folder in sorted(Path(root).iterdir()) if Path(root).is_dir() else ():
        if (folder / JOB).is_file() and now - last_write(folder) > max_age_s:
            shutil.rmtree(folder, ignore_errors=True)
            deleted.append(folder)
    return deleted
