"""The model folders under weights/: a name resolved to a ready folder, installs that are atomic, verify, list.

A pull downloads and converts into weights/.tmp-NAME-PID-*, checks the result, writes the manifest and
only then renames the folder into place, so a crash never leaves a folder that loads.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:   # not on Windows: pulls there are not serialised
    fcntl = None

from .errors import ChecksumMismatch, SourceFailed, UnknownModel, WeightsError, WeightsUnavailable
from .manifest import MANIFEST, check_model_folder, raise_if_corrupt, read_manifest, write_manifest
from .progress import Progress, no_progress, span
from .registry import DEFAULT_ROOT, HUB_REPO_ID, describe_source, load_registry
from .sources import fetch


@dataclass(frozen=True)
class WeightStore:
    """Model folders under `root`, named by `registry` (name -> entry, as in weights/registry.json)."""

    root: Path
    registry: dict

    @classmethod
    def default(cls) -> WeightStore:
        """weights/ in the repo, or $ATTN_WEIGHTS_DIR; the registry is always the repo's."""
        root = Path(os.environ.get("ATTN_WEIGHTS_DIR") or DEFAULT_ROOT).expanduser()
        return cls(root=root, registry=load_registry())

    # -- resolving names ----------------------------------------------------------------------

    def ensure(self, name_or_path: str | os.PathLike, progress: Progress | None = None, force: bool = False) -> Path:
        """A ready model folder for a registry name, a local folder or a hub repo id ("owner/name").

        An installed folder whose files match its manifest is returned at once; otherwise the
        sources are tried in order and WeightsUnavailable lists each one and why it failed.
        """
        progress = progress or no_progress
        local = _as_local_folder(name_or_path)
        if local is not None:
            return self._ready_local(local)
        name = str(name_or_path)
        if name in self.registry:
            return self._ensure_named(name, self.registry[name], progress, force)
        if HUB_REPO_ID.match(name):
            entry = {"licence": "see the model card", "sources": [{"type": "hub", "repo": name}]}
            return self._ensure_named(name.replace("/", "--"), entry, progress, force)
        if (self.root / name).is_dir() and not name.startswith("."):  # installed by hand, or by an earlier pull
            return self._ensure_named(name, {"licence": "unknown", "sources": []}, progress, force)
        known = ", ".join(sorted(self.registry)) or "none"
        raise UnknownModel(
            f"unknown model {name!r}: not a registered name (known: {known}), not an installed folder in "
            f"{self.root}, not an existing folder path, and not a hub repo id like 'owner/name'"
        )

    def folder(self, name: str) -> Path:
        return self.root / (name.replace("/", "--") if HUB_REPO_ID.match(name) else name)

    def verify(self, name_or_path: str | os.PathLike) -> dict:
        """Rehash every file of an installed model; raises ChecksumMismatch listing each bad file."""
        local = _as_local_folder(name_or_path)
        folder = local if local is not None else self.folder(str(name_or_path))
        if not folder.is_dir():
            raise WeightsError(f"{name_or_path!r} is not installed (no folder {folder}); pull it first")
        manifest = read_manifest(folder)
        raise_if_corrupt(folder, manifest, full=True, name=manifest.get("name", str(name_or_path)))
        return manifest

    def installed(self) -> dict[str, dict]:
        """name -> manifest for every model folder under root; {} for a folder put there by hand without one
        (it is adopted, and gets its manifest, when it is first loaded)."""
        found = {}
        if self.root.is_dir():
            for folder in sorted(self.root.iterdir()):
                if not folder.is_dir() or folder.name.startswith("."):
                    continue
                if (folder / MANIFEST).is_file():
                    try:
                        found[folder.name] = read_manifest(folder)
                    except ChecksumMismatch:
                        continue
                elif (folder / "config.json").is_file():
                    found[folder.name] = {}
        return found

    def clean(self) -> list[str]:
        """Remove what killed pulls left behind: .tmp-NAME-PID-* staging folders and .old-NAME-PID-* copies moved
        aside by `pull --force`, made on this machine by a process that is no longer running (or whose PID this
        process now has: a restarted container). A folder made on another machine sharing the store is left to
        it. Returns the names removed."""
        removed = []
        if not self.root.is_dir():
            return removed
        for folder in self.root.iterdir():
            if not folder.name.startswith((".tmp-", ".old-")) or not folder.is_dir():
                continue
            parts = folder.name.rsplit("-", 2)  # [".tmp-NAME", PID, random]
            if len(parts) != 3 or not parts[1].isdigit() or folder.name in _OWN_FOLDERS:
                continue
            marker = folder / OWNER_FILE
            host = marker.read_text().strip() if marker.is_file() else socket.gethostname()
            pid = int(parts[1])
            if host == socket.gethostname() and (pid == os.getpid() or not _process_alive(pid)):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder.name)
        return sorted(removed)

    def known_names(self) -> list[str]:
        """Registry names first (installed or fetchable), then models installed outside the registry."""
        return list(dict.fromkeys([*self.registry, *self.installed()]))

    def _ready_local(self, folder: Path) -> Path:
        check_model_folder(folder)
        if (folder / MANIFEST).is_file():
            raise_if_corrupt(folder, read_manifest(folder), full=False, name=str(folder))
        return folder

    def _ensure_named(self, name: str, entry: dict, progress: Progress, force: bool) -> Path:
        folder = self.root / name
        if folder.is_dir() and not force:
            return self._ready_installed(name, folder, entry)
        with self._one_pull_at_a_time(name, progress):
            if folder.is_dir() and not force:   # another process (or thread) pulled it while this one waited
                return self._ready_installed(name, folder, entry)
            tried = [f"installed folder {folder}: " + ("ignored (--force)" if force else "not there")]
            for source in entry["sources"]:
                try:
                    return self._install(name, entry, source, progress, replace=force)
                except SourceFailed as e:
                    tried.append(f"{describe_source(source)}: {e}")
        lines = "\n  - ".join(tried)
        raise WeightsUnavailable(f"no source of {name!r} could be reached. Tried, in order:\n  - {lines}")

    @contextlib.contextmanager
    def _one_pull_at_a_time(self, name: str, progress: Progress):
        """An exclusive lock while NAME is pulled into this store, so that two processes asking for it at once (two
        test workers, two app replicas) pull it once: the second waits, then finds the folder. The lock file lives
        in the temporary folder, named by the store and the model, so the store holds only models. (flock: the
        kernel releases it if the holder dies; it is per open file, so two threads wait on each other too.)"""
        if fcntl is None:
            yield
            return
        store = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:12]
        path = Path(tempfile.gettempdir()) / f"attn-pull-{store}-{name}.lock"
        with open(path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                progress(0.0, f"waiting for another pull of {name} to finish")
                fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _ready_installed(self, name: str, folder: Path, entry: dict) -> Path:
        if not (folder / MANIFEST).is_file():
            # Only a person puts a folder here without a manifest (pulls rename complete folders
            # into place), so adopt it: check its layout and record what it holds now.
            check_model_folder(folder)
            write_manifest(folder, name, {"type": "local", "path": f"{self.root.name}/{name}"},
                           entry.get("licence", "unknown"))
            return folder
        raise_if_corrupt(folder, read_manifest(folder), full=False, name=name)
        return folder

    # -- installing ----------------------------------------------------------------------------

    def _install(self, name: str, entry: dict, source: dict, progress: Progress, replace: bool) -> Path:
        staging = self._staging_folder(name)
        try:
            record = fetch(source, staging, span(progress, 0.0, 0.9))
            check_model_folder(staging)
            (staging / OWNER_FILE).unlink(missing_ok=True)  # the marker is no file of the model's
            _make_readable(staging)
            licence = entry.get("licence") or record.get("licence_on_hub") or "unknown"
            write_manifest(staging, name, record, licence, span(progress, 0.9, 1.0))
            target = self.root / name
            self._commit(staging, target, replace)
            progress(1.0, f"installed {name} from {describe_source(source)}")
            return target
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _staging_folder(self, name: str) -> Path:
        """weights/.tmp-NAME-PID-RANDOM; leftovers of dead processes are removed first."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.clean()
        staging = self.root / f".tmp-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        _OWN_FOLDERS.add(staging.name)
        (staging / OWNER_FILE).write_text(socket.gethostname())
        return staging

    def _commit(self, staging: Path, target: Path, replace: bool) -> None:
        """Rename the checked folder into place; the old copy (pull --force) is moved aside first."""
        old = None
        if replace and target.exists():
            old = target.with_name(f".old-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            _OWN_FOLDERS.add(old.name)
            os.replace(target, old)
            (old / OWNER_FILE).write_text(socket.gethostname())
        try:
            os.replace(staging, target)
        except OSError:
            if not target.is_dir():  # another pull of the same model won the race and left a folder
                raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


OWNER_FILE = ".pulled-on"  # in .tmp-/.old- folders: the machine whose process made them
_OWN_FOLDERS: set[str] = set()  # .tmp-/.old- folders this process made (its PID may be a dead one's again)


def _make_readable(folder: Path) -> None:
    """Files written through temporary files (safetensors, zip extraction) may be 0600; use the umask."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _as_local_folder(name_or_path: str | os.PathLike) -> Path | None:
    """A Path, or a string that names an existing folder with a separator, is a local folder."""
    if isinstance(name_or_path, os.PathLike):
        path = Path(name_or_path).expanduser()
        if not path.is_dir():
            raise WeightsUnavailable(f"model folder {path} does not exist")
        return path
    text = str(name_or_path)
    path = Path(text).expanduser()
    looks_like_path = text.startswith((".", "/", "~")) or os.sep in text
    if looks_like_path and path.is_dir():
        return path
    if text.startswith((".", "/", "~")):
        raise WeightsUnavailable(f"model folder {text!r} does not exist ({path.resolve()})")
    return None
