"""The models of the server: loaded once per name, shared by every session (their weights are read-only).

Every endpoint's model goes through one check, ModelStore.key: a registry name (installed, or pulled when first
chosen), a model installed in the weight store, a folder the server was started with, or a session's own saved
run; on a laptop also any model folder (one model per folder, however its path is spelled) or a hub repo id. On a
shared server (public) nothing else is tried, and the refusal reads the same whatever the name, so it tells nothing
of the server's files. Loading errors become UserErrors that say what is wrong and what would be right.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import torch

import core.store as weight_store
from core import CheckpointError, ConfigError, load_model
from core.store.registry import HUB_REPO_ID, SOURCE_PLACES, gated_phrase, memory_phrase
from ui import memory
from ui.services.checks import UserError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
MAX_MODEL_NAME = 255  # characters; a longer name is no file name, and no registry or hub name either
ProgressFn = Callable[[float, str], None]
T = TypeVar("T")
def known_model_names() -> list[str]:
    """Registry names first (installed or fetchable), then models installed outside the registry."""
    try:
        return weight_store.known_model_names()
    except Exception:  # noqa: BLE001 - a broken registry must not stop the app from starting
        log.exception("could not list the weight store's models")
        return [DEFAULT_MODEL]


def not_installed_label(name: str, entry: dict | None) -> str:
    """The picker's label of a model that a choice would fetch: where from, in the registry's order, with its size
    on disk where the registry knows it (a source's disk_mb), then its memory as float32 (memory_mb) and, for a
    gated model, where to accept the licence, e.g. "gpt2 (not installed, from the Hugging Face Hub)". A name the
    registry does not know is a hub repo id ("owner/name") or stays as it is."""
    if entry is None:
        hub_id = HUB_REPO_ID.match(name) and not Path(name).exists()
        return f"{name} (not installed, from the Hugging Face Hub)" if hub_id else name
    wheres = []
    for source in entry.get("sources", []):
        where = SOURCE_PLACES.get(source.get("type"), str(source.get("type")))
        size = source.get("disk_mb")
        if size:
            wheres.append(f"{size:,} MB on disk from {where}")
        else:
            wheres.append(f"from {where}" + (", size unknown" if source.get("type") != "hub" else ""))
    notes = [" or ".join(wheres) or "no source known", memory_phrase(entry), gated_phrase(entry)]
    return f"{name} (not installed, {'; '.join(n for n in notes if n)})"


def clean_weight_store() -> list[str]:
    """Remove the litter of killed pulls from the weight store (see WeightStore.clean); run at app start."""
    try:
        removed = weight_store.WeightStore.default().clean()
    except OSError as exc:  # a read-only store must not stop the app from starting
        log.warning("could not clean the weight store: %s", exc)
        return []
    if removed:
        log.info("removed %d folders left by killed pulls: %s", len(removed), ", ".join(removed))
    return removed


def hand_back() -> None:
    """What a dropped model held, back to the system: a full collection, then malloc_trim (ui.memory.trim). The
    collection frees a model that a reference cycle holds, which reference counting alone never frees (the first
    model a process loads is one: torch imports torch._dynamo lazily while building it, and torch.fx's import keeps
    its own frame, whose chain of callers reaches load_model's); the trim returns the freed weights' pages, which
    glibc otherwise keeps inside the arena of the thread that loaded them."""
    gc.collect()
    memory.trim()


class OncePerName(Generic[T]):
    """Values made once per name, however many sessions ask at once, at most `capacity` of them kept (the least
    recently used dropped first, and handed to `on_drop`; once this store holds none of them, `after_drop()` runs).
    A value being made holds only its own name's lock, so those who ask for values already here never wait behind
    someone else's download."""

    def __init__(self, capacity: int, on_drop: Callable[[str, T], None] | None = None,
                 after_drop: Callable[[], object] | None = None):
        self.capacity, self.on_drop, self.after_drop = capacity, on_drop, after_drop
        self._values: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()  # guards _values and _making
        self._making: dict[str, threading.Lock] = {}

    def names(self) -> list[str]:
        with self._lock:
            return list(self._values)

    def get(self, name: str, make: Callable[[], T]) -> T:
        with self._lock:
            if name in self._values:
                self._values.move_to_end(name)
                return self._values[name]
            name_lock = self._making.setdefault(name, threading.Lock())
        with name_lock:
            with self._lock:
                if name in self._values:  # made by another session while this one waited
                    return self._values[name]
            value = make()
            with self._lock:
                self._values[name] = value
                dropped = [self._values.popitem(last=False) for _ in range(len(self._values) - self.capacity)]
                self._making.pop(name, None)
        self._let_go(dropped)  # outside the lock: dropping may take a while (a Serve application is deleted)
        return value

    def forget(self, name: str) -> bool:
        """Drop one name's value (handed to `on_drop`); whoever already holds the value keeps using it."""
        with self._lock:
            dropped = [(name, self._values.pop(name))] if name in self._values else []
        found = bool(dropped)
        self._let_go(dropped)
        return found

    def _let_go(self, dropped: list[tuple[str, T]]) -> None:
        """Hand each dropped value to on_drop, let go of them, then after_drop(): by then a value nobody else holds
        is gone."""
        if not dropped:
            return
        if self.on_drop is not None:
            for name, value in dropped:
                self.on_drop(name, value)
            del value
        dropped.clear()
        if self.after_drop is not None:
            self.after_drop()

    def clear(self) -> list[tuple[str, T]]:
        """Forget every value; returns them, oldest first."""
        with self._lock:
            values = list(self._values.items())
            self._values.clear()
        return values


class ModelStore:
    """Loaded models, one per name, shared by all sessions (weights are read-only), at most `capacity` in memory;
    a model being pulled or loaded keeps no one else waiting (OncePerName). public: a shared server, where only
    the names the picker offers load (key). release() runs once the store has let go of a dropped model: by
    default hand_back, so that a dropped model's memory leaves the process (a request still using it keeps it
    until it ends)."""

    def __init__(
        self,
        capacity: int = 2,
        extra_names: list[str] | None = None,
        device: str | None = None,
        public: bool = False,
        release: Callable[[], object] = hand_back,
    ):
        self.capacity, self.device, self.public = capacity, device, public
        self.max_fetch_mb: float | None = None  # on a shared server, the largest model a choice fetches (MB)
        self.extra_names = list(extra_names or [])
        self._models: OncePerName[torch.nn.Module] = OncePerName(capacity, after_drop=release)
        self._sources: dict[str, str] = {}  # name → where its weights came from, for the model card
        # alias → folder of a session's private Lab run (Lab.private_folder), on a shared server; never listed
        self.private: Callable[[str], Path | None] | None = None

    def source(self, name: str) -> str:
        try:
            return self._sources.get(self.key(name), "")
        except UserError:
            return ""

    def names(self) -> list[str]:
        """The picker's names: the start-up ones, then the registry's (on a shared server, without those too large
        to fetch here, unless installed)."""
        names = list(dict.fromkeys(self.extra_names + known_model_names()))
        if self.public and self.max_fetch_mb is not None:
            installed, registry = self._store_state()
            names = [name for name in names if self._too_large(name, installed, registry) is None]
        return names

    @staticmethod
    def _store_state() -> tuple[set[str], dict]:
        """(the installed names, the registry), read once; empty where unreadable (then nothing is fetched)."""
        try:
            return set(weight_store.WeightStore.default().installed()), weight_store.load_registry()
        except Exception:  # noqa: BLE001 - an unreadable store or registry: fetch nothing rather than guess
            log.exception("could not read the weight store or its registry")
            return set(), {}

    def fetch_refusal(self, name: str) -> str | None:
        """Why a shared server will not fetch this model, or None (it is installed, not a registry name, small
        enough, or the server is a laptop)."""
        if not self.public or self.max_fetch_mb is None or name not in known_model_names():
            return None
        return self._too_large(name, *self._store_state())

    def _too_large(self, name: str, installed: set[str], registry: dict) -> str | None:
        if name in installed or name not in registry or self.max_fetch_mb is None:
            return None
        memory = registry[name].get("memory_mb")
        if memory is not None and memory <= self.max_fetch_mb:
            return None
        size = f"about {memory:,} MB in memory" if memory is not None else "of no recorded size"
        return (f"Model {name!r} is not installed on this shared server, and it is {size}, more than the "
                f"{self.max_fetch_mb:,.0f} MB it fetches for a visitor (ATTN_PUBLIC_FETCH_MB): choose one from the "
                "model picker, or run the app on your own machine for this one.")

    def loaded(self) -> list[str]:
        """The names in memory now, least recently used first."""
        return self._models.names()

    def forget(self, name: str) -> None:
        """Drop a model from memory (a private run that expired: its name then answers why, through `private`);
        a request already using it finishes with the object it holds."""
        self._models.forget(name)
        self._sources.pop(name, None)

    def choices(self) -> list[tuple[str, str]]:
        """(label, name) for the picker, in names() order: a model that loads without fetching is its name alone,
        one that a choice would fetch says so, where from and its size where known (not_installed_label)."""
        ready = set(self.names_ready())
        try:
            registry = weight_store.load_registry()
        except Exception:  # noqa: BLE001 - a broken registry must not stop the picker from listing names
            log.exception("could not read the weight store's registry")
            registry = {}
        return [(name if name in ready else not_installed_label(name, registry.get(name)), name)
                for name in self.names()]

    def names_ready(self) -> list[str]:
        """The models that load without fetching anything: in memory, installed, or a folder given at start."""
        loaded = self._models.names()
        try:
            installed = list(weight_store.WeightStore.default().installed())
        except OSError:
            installed = []
        folders = [name for name in self.extra_names if Path(name).is_dir()]
        return [name for name in self.names() if name in {*loaded, *installed, *folders}]

    def key(self, name) -> str:
        """The one check of a model name, for every endpoint; returns the name the model is kept under. Offered
        everywhere: a registry name, a model installed in the weight store, a name or folder the server was
        started with (extra_names, as given), a session's saved run (private). On a laptop also a model folder,
        kept under its resolved path (or the store's name for a folder in the store), so that "m", "./m" and
        "m/" load one model, not three; and a hub repo id (WeightStore.ensure). On a shared server (public) any
        other name gets one refusal whose words depend on nothing but the name as typed: nothing is looked up on
        disk for it, and nothing is fetched."""
        if not name:
            raise UserError("Choose a model first.")
        if not isinstance(name, str):
            raise UserError(f"The model must be one name or folder, not a {type(name).__name__}: choose one from the "
                            "model picker.")
        if len(name) > MAX_MODEL_NAME or "\x00" in name:
            raise UserError(f"{name[:40]!r}… is not a model name or folder: choose one from the model picker.")
        if name in self._models.names() or name in self.extra_names or name in known_model_names():
            return name
        if self.private is not None and self.private(name) is not None:
            return name
        if self.public:
            raise UserError(f"{name[:60]!r} is not a model this server offers: choose one from the model picker "
                            "(its names are the only ones a shared server loads).")
        try:
            folder = Path(name).expanduser()
            if not folder.is_dir():
                return name   # a hub repo id, or a name WeightStore.ensure explains
            folder = folder.resolve()
        except (OSError, RuntimeError):
            return name       # a name the file system refuses: _load says so
        return self._folder_key(folder)

    def _folder_key(self, folder: Path) -> str:
        """A laptop's model folder (resolved) → its key: a start-up name naming the same folder, the store's name
        for a folder in the weight store, else the resolved path."""
        for given in self.extra_names:
            try:
                if Path(given).expanduser().resolve() == folder:
                    return given
            except (OSError, RuntimeError):
                continue
        try:
            if folder.parent == weight_store.WeightStore.default().root.resolve() and \
                    folder.name in known_model_names():
                return folder.name
        except OSError:
            pass
        return str(folder)

    def get(self, name: str, progress: ProgressFn | None = None):
        key = self.key(name)
        return self._models.get(key, lambda: self._load(key, progress))

    def _load(self, name: str, progress: ProgressFn | None):
        private = self.private(name) if self.private is not None else None
        folder = private or Path(name)
        try:
            if not folder.is_dir():
                refused = None if private is not None else self.fetch_refusal(name)
                if refused:
                    raise UserError(refused)
                folder = weight_store.ensure(name, progress=progress)
        except weight_store.WeightsUnavailable as exc:
            raise UserError(f"Model {name!r} cannot be loaded here: {exc}") from exc
        except weight_store.WeightsError as exc:
            raise UserError(f"Model {name!r}: {exc}") from exc
        except OSError as exc:  # a name the file system refuses (too long, invalid characters)
            raise UserError(f"{name[:40]!r}… is not a model name or folder ({exc.strerror}): choose one from the "
                            "model picker.") from None
        if progress:
            progress(0.95, f"loading {name} into memory")
        started = time.perf_counter()
        try:
            model = load_model(folder, device=self.device)  # cuda (bfloat16) when there is a GPU, else cpu (float32)
        except (ConfigError, CheckpointError) as exc:
            raise UserError(f"Model {name!r} cannot be loaded: {exc}") from exc
        model.eval()
        if private is not None:
            self.private(name)  # expired while it loaded: say so, rather than keep it in memory by its name
        self._sources[name] = weights_provenance(Path(folder))
        if progress:
            progress(1.0, f"{name} ready")
        log.info("loaded %s from %s in %.1f s", name, folder, time.perf_counter() - started)
        if model.tokenizer is None:
            raise UserError(f"Model {name!r} has no tokenizer in {folder}; the app needs one to read text.")
        return model


def weights_provenance(folder: Path) -> str:
    """One line from the weight store's manifest: where the files came from, their licence, when installed."""
    try:
        manifest = weight_store.read_manifest(folder)
        source = weight_store.describe_source(manifest["source"])
    except Exception:  # noqa: BLE001 - a folder made by hand has no manifest; the card just says less
        return f"Weights: the folder {folder.name}, which has no manifest.json: its files are not verified."
    licence, created = manifest.get("licence", "unknown"), manifest.get("created", "?")[:10]
    return f"Weights: {source}, licence {licence}, installed {created}."
