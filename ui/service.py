"""The service layer between the Gradio tabs and the core.

Plain Python over `core`: it loads models, turns text into token ids, runs the
model, and returns numpy arrays and short notes. It never imports gradio (the
tabs translate `UserError` into messages in the page) and never draws (ui/plots.py
does). The shared state: the loaded models (ModelStore, one per name, behind a
lock) and what sessions keep for reuse (KEPT, within one byte budget, each entry
reachable only through its session's ticket).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import core.store as weight_store
from core import CheckpointError, ConfigError, heads, load_model
from core.attention import attention_stages, causal_mask
from core.capture import LayerObserver
from core.inspect import parameter_counts, queries_keys, rope_frequencies
from core.layers import apply_rope, sinusoidal_encoding

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
def env_number(name: str, default, low, kind=float, strict: bool = False):
    """A setting from the environment: a number of at least `low`, else `default` when unset. A bad value is a
    UserError naming the setting when strict, else a warning in the log and the default."""
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = kind(float(text)) if kind is int and float(text).is_integer() else kind(text)
    except (ValueError, OverflowError):
        value = None
    if value is None or not math.isfinite(value) or value < low:
        message = f"{name} must be a number of at least {low}, got {text!r}"
        if strict:
            raise UserError(message)
        log.warning("%s; using %s", message, default)
        return default
    return value


TEXT_CAP_SETTING = "ATTN_MAX_TEXT_MB"  # one cap for typed and uploaded text, in MB
MAX_TEXT_BYTES = int(env_number(TEXT_CAP_SETTING, 1.0, 0.001) * 1_000_000)
UPLOAD_SUFFIXES = (".txt", ".md")
MAX_ATTENTION_TOKENS = 2048  # default cap of the Attention tab: a capture on 2 CPU cores stays within seconds
MAX_MASK_TOKENS = 512  # the mask demo runs the model six times on its text
FULL_VIEW_TOKENS = 256  # up to this many tokens a head is drawn cell by cell, with labels
HEAD_OVERVIEW_SIZE = 256  # longer inputs: the head view is pooled to this many blocks per side
MODEL_VIEW_CELLS = 600_000  # cells in the model-view mosaic (uint8): about 1 MB of JSON
MAX_WINDOW = 256  # the full-resolution window is at most this many tokens per side
MAX_STAGE_WINDOW = 48  # the mask demo draws 6 matrices of this size
MAX_PE_POSITIONS = 512
MAX_PE_DIM = 512
MAX_GENERATE_TOKENS = 512
MAX_TEMPERATURE = 2.0  # the slider's end; the API holds to the same
MAX_PROMPT_TOKENS = 2048  # longer prompts keep their end: prefill of 8k tokens takes too long on a small CPU
MAX_HEADS_TOKENS = 512  # the Heads tab's cap: its sections run the model several times on the text
MAX_SWEEP_TOKENS = 128  # the sweep runs the text once per head (270 times for SmolLM2)
SWEEP_BATCH = 16  # heads ablated per forward pass of the sweep
MAX_IG_STEPS = 256
MAX_IG_TOKEN_STEPS = 4096  # integrated gradients run steps × tokens at once with gradients (about 8 GB for SmolLM2)
INDUCTION_LENGTH = 100  # the probe: 100 seeded random tokens, then the same 100 again
INDUCTION_SEED = 0
MAX_MODEL_NAME = 255  # characters; a longer name is no file name, and no registry or hub name either
TOP_HEADS = 5  # rows per score in the top-heads table, and the heads "top 5 by a score" picks


class UserError(ValueError):
    """Bad input from the user: the message is shown in the page (through public_text)."""


REPO_ROOT = Path(__file__).resolve().parent.parent
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~])/(?:[^\s/'\"]+/)*[^\s/'\",;)]+")


def public_text(text: str) -> str:
    """A message as a user may see it: no absolute server paths. Files in the weight store read weights/NAME,
    the repository's read as relative paths, and any other absolute path keeps only its last two parts."""
    roots = {str(weight_store.WeightStore.default().root.resolve()): "weights", str(REPO_ROOT): "."}
    for root, shown in sorted(roots.items(), key=lambda item: -len(item[0])):
        text = text.replace(root + "/", "" if shown == "." else shown + "/").replace(root, shown)

    def shorten(match: re.Match) -> str:
        parts = [p for p in match.group(0).split("/") if p]
        return "…/" + "/".join(parts[-2:])

    return ABSOLUTE_PATH.sub(shorten, text)


ProgressFn = Callable[[float, str], None]


# ---------------------------------------------------------------- models


def known_model_names() -> list[str]:
    """Registry names first (installed or fetchable), then models installed outside the registry."""
    try:
        return weight_store.known_model_names()
    except Exception:  # noqa: BLE001 - a broken registry must not stop the app from starting
        log.exception("could not list the weight store's models")
        return [DEFAULT_MODEL]


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


def terminal_progress() -> weight_store.TerminalProgress:
    """The weight store's terminal progress bar, for pulling a model before the app starts; close() it after."""
    return weight_store.TerminalProgress()


class ModelStore:
    """Loaded models, one per name, shared by all sessions (weights are read-only), at most `capacity`.

    A model being pulled or loaded holds only its own name's lock, so users of models already in memory
    never wait behind someone else's download."""

    def __init__(
        self,
        capacity: int = 2,
        extra_names: list[str] | None = None,
        device: str | None = None,
        max_attention_tokens: int = MAX_ATTENTION_TOKENS,
    ):
        self.capacity, self.device = capacity, device
        self.max_attention_tokens = max_attention_tokens  # the Attention tab's cap, below the model's context
        self.extra_names = list(extra_names or [])
        self._models: OrderedDict[str, torch.nn.Module] = OrderedDict()
        self._lock = threading.Lock()  # guards _models and _loading
        self._loading: dict[str, threading.Lock] = {}
        self._sources: dict[str, str] = {}  # name → where its weights came from, for the model card

    def source(self, name: str) -> str:
        return self._sources.get(name, "")

    def names(self) -> list[str]:
        return list(dict.fromkeys(self.extra_names + known_model_names()))

    def names_ready(self) -> list[str]:
        """The models that load without fetching anything: in memory, installed, or a folder given at start."""
        with self._lock:
            loaded = list(self._models)
        try:
            installed = list(weight_store.WeightStore.default().installed())
        except OSError:
            installed = []
        folders = [name for name in self.extra_names if Path(name).is_dir()]
        return [name for name in self.names() if name in {*loaded, *installed, *folders}]

    def get(self, name: str, progress: ProgressFn | None = None):
        if not name:
            raise UserError("Choose a model first.")
        with self._lock:
            if name in self._models:
                self._models.move_to_end(name)
                return self._models[name]
            name_lock = self._loading.setdefault(name, threading.Lock())
        with name_lock:
            with self._lock:
                if name in self._models:  # loaded by another session while this one waited
                    return self._models[name]
            model = self._load(name, progress)
            with self._lock:
                self._models[name] = model
                while len(self._models) > self.capacity:
                    self._models.popitem(last=False)
                self._loading.pop(name, None)
            return model

    def _load(self, name: str, progress: ProgressFn | None):
        if not isinstance(name, str) or len(name) > MAX_MODEL_NAME or "\x00" in name:
            shown = repr(name[:40]) + "…" if isinstance(name, str) else f"a {type(name).__name__}"
            raise UserError(f"{shown} is not a model name or folder: choose one from the model picker.")
        folder = Path(name)
        try:
            if not folder.is_dir():
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
        self._sources[name] = weights_provenance(Path(folder))
        if progress:
            progress(1.0, f"{name} ready")
        log.info("loaded %s from %s in %.1f s", name, folder, time.perf_counter() - started)
        if model.tokenizer is None:
            raise UserError(f"Model {name!r} has no tokenizer in {folder}; the app needs one to read text.")
        return model


# ---------------------------------------------------------------- model card


def weights_provenance(folder: Path) -> str:
    """One line from the weight store's manifest: where the files came from, their licence, when installed."""
    try:
        manifest = weight_store.read_manifest(folder)
        source = weight_store.describe_source(manifest["source"])
    except Exception:  # noqa: BLE001 - a folder made by hand has no manifest; the card just says less
        return f"Weights: the folder {folder.name}, which has no manifest.json: its files are not verified."
    licence, created = manifest.get("licence", "unknown"), manifest.get("created", "?")[:10]
    return f"Weights: {source}, licence {licence}, installed {created}."


def parameter_table(model) -> list[list[str]]:
    """Rows [part, measured, formula, ratio] comparing the model's counts with the theory's 4d² and 8d²."""
    cfg = model.config
    counts = parameter_counts(model)
    d = cfg.d_model
    per_layer = counts.get("per_layer", {})
    rows = []
    for part, formula_name, formula in (
        ("attention", "4d²", 4 * d * d),
        ("feed_forward", "8d²", 8 * d * d),
    ):
        measured = per_layer.get(part)
        if measured is None:
            continue
        rows.append(
            [
                f"{part.replace('_', '-')} per layer",
                f"{measured:,}",
                f"{formula_name} = {formula:,}",
                f"{measured / formula:.2f}",
            ]
        )
    names = {
        "attention": "attention (all layers)",
        "feed_forward": "feed-forward (all layers)",
        "lm_head": "LM head" + lm_head_note(model, counts.get("lm_head", 0)),
    }
    for part in ("embeddings", "attention", "feed_forward", "norms", "lm_head", "total"):
        if part in counts:
            rows.append([names.get(part, part), f"{counts[part]:,}", "", ""])
    return rows


def lm_head_note(model, own_parameters: int) -> str:
    if not model.config.has_lm_head:
        return " (none: this checkpoint is an encoder without one)"
    if own_parameters == 0 or model.config.tie_word_embeddings:
        return " (tied: it reuses the token embeddings)"
    return ""


def model_card(name: str, model, source: str = "") -> str:
    """Markdown: the config that shapes every view, and where the parameters sit."""
    cfg = model.config
    d = cfg.d_model
    kind = (
        "encoder-decoder"
        if cfg.is_encoder_decoder
        else ("decoder (causal)" if cfg.causal else "encoder (bidirectional)")
    )
    gqa = f", {cfg.n_kv_heads} key/value heads (grouped-query)" if cfg.n_kv_heads != cfg.n_heads else ""
    lines = [
        f"### {name}",
        f"**{cfg.family}** {kind}: {cfg.n_layers} layers, {cfg.n_heads} heads{gqa}, d = {d}, d_k = {cfg.head_dim}, "
        f"d_ff = {cfg.d_ff}, vocabulary {cfg.vocab_size:,}, context {cfg.max_positions:,} tokens.  ",
        f"Positions: **{cfg.positional}**; norm: {cfg.norm} ({cfg.norm_placement}-LN).  ",
        source,
        "",
        "| part | parameters | theory | measured / theory |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {' | '.join(row)} |" for row in parameter_table(model)]
    notes = []
    if cfg.is_encoder_decoder:
        notes.append(
            "Per layer means one decoder layer here: it has two attention blocks (self-attention and "
            "cross-attention into the encoder), so about 2 × 4d²."
        )
    if cfg.n_kv_heads != cfg.n_heads:
        kv = cfg.n_kv_heads * cfg.head_dim
        notes.append(
            f"Attention is below 4d² because keys and values have only {cfg.n_kv_heads} heads: "
            f"2d² + 2·d·{kv} = {2 * d * d + 2 * d * kv:,} (plus biases if any)."
        )
    if cfg.d_ff != 4 * d or getattr(cfg, "gated_ffn", False):
        mats = 3 if getattr(cfg, "gated_ffn", False) else 2
        notes.append(
            f"The feed-forward has {mats} matrices of d × d_ff = {d} × {cfg.d_ff}: {mats}·d·d_ff = "
            f"{mats * d * cfg.d_ff:,}, "
            "against 8d² for the theory's 2 matrices with d_ff = 4d."
        )
    if notes:
        lines += ["", *("- " + n for n in notes)]
    return "\n".join(lines)


# ---------------------------------------------------------------- text


@dataclass
class Encoded:
    ids: list[int]
    labels: list[str]  # unique per position: "12 the"
    special: list[bool]  # True for BOS/EOS/[CLS]/chat markers
    note: str = ""  # e.g. the truncation message


def read_upload(path: str | Path | None) -> str:
    """The text of an uploaded .txt/.md file, or a UserError saying what is wrong with it."""
    if path is None:
        raise UserError("No file was uploaded.")
    path = Path(path)
    if path.suffix.lower() not in UPLOAD_SUFFIXES:
        raise UserError(
            f"{path.name}: only .txt and .md files can be read, not {path.suffix or 'files without a suffix'}."
        )
    size = path.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise UserError(text_cap_message(path.name, size))
    if size == 0:
        raise UserError(f"{path.name} is empty.")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path.name} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}); save it "
            "as UTF-8 and upload it again."
        ) from exc
    if not text.strip():
        raise UserError(f"{path.name} holds only whitespace.")
    return text


def text_cap_message(what: str, size: int) -> str:
    return (
        f"{what} is {size / 1e6:.2f} MB; the limit for typed and uploaded text is {MAX_TEXT_BYTES / 1e6:g} MB. "
        f"On your own machine, start the app with {TEXT_CAP_SETTING}=<MB> to raise it."
    )


def check_text_size(label: str, text: str | None) -> str | None:
    """The text unchanged when its UTF-8 form is within MAX_TEXT_BYTES, else a UserError naming the field."""
    if text is None or len(text) * 4 <= MAX_TEXT_BYTES:  # a character is at most 4 bytes: no need to count
        return text
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_TEXT_BYTES:
        raise UserError(text_cap_message(f"The text in {label!r}", size))
    return text


def display_token(text: str) -> str:
    """A token as it should appear on an axis: visible whitespace, never empty."""
    shown = text.replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    if shown.strip() == "":
        return "␣" * max(1, len(shown))
    return shown.strip() if len(shown) > 1 else shown


def valid_unicode(text: str) -> str:
    """The text with each unpaired surrogate (which JSON can carry but no tokenizer reads) replaced by U+FFFD."""
    if not isinstance(text, str):
        raise UserError(f"The text must be a string, got a {type(text).__name__}.")
    if text.isascii():
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def encode(model, text: str, max_tokens: int | None = None, add_special_tokens: bool = True) -> Encoded:
    """Token ids of `text`, cut to the model's context (and `max_tokens`) with a note saying how much."""
    if text is None or (isinstance(text, str) and not text.strip()):
        raise UserError("The text is empty: type or paste some text, or upload a .txt/.md file.")
    text = valid_unicode(text)
    tok = model.tokenizer
    ids = tok(text, add_special_tokens=add_special_tokens)["input_ids"]
    limit = model.config.max_positions if max_tokens is None else min(max_tokens, model.config.max_positions)
    note = ""
    if len(ids) > limit:
        why = (
            "the model's context"
            if limit == model.config.max_positions
            else f"this view's limit (the model's context is {model.config.max_positions:,})"
        )
        note = (
            f"The text has {len(ids):,} tokens; only the first {limit:,} are used ({why}); "
            f"{len(ids) - limit:,} were dropped."
        )
        ids = ids[:limit]
    if not ids:
        raise UserError("The text gives no tokens.")
    special_ids = set(tok.all_special_ids)
    pieces = [display_token(tok.decode([i])) for i in ids]
    labels = [f"{i} {p}" for i, p in enumerate(pieces)]
    return Encoded(ids=ids, labels=labels, special=[i in special_ids for i in ids], note=note)


def as_batch(ids: list[int], device: torch.device | str | None = None) -> torch.Tensor:
    """One sequence as input_ids [1, T] on the model's device."""
    return torch.tensor([ids], dtype=torch.long, device=device)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """float32 numpy from any device and dtype (bfloat16 on a GPU has no numpy type)."""
    return t.detach().float().cpu().numpy()


MAX_SEED = 2**63 - 1  # torch.manual_seed's range, kept to what every generator accepts


def _shown(value: int | float) -> str:
    """1024 and 20,000 for ints, 0.05 for floats, 1.84e+19 for what no one types digit by digit."""
    if isinstance(value, int) and value.bit_length() > 1000:  # beyond a float: say how long it is
        return f"a {len(str(abs(value))):,}-digit number"
    if abs(value) >= 10**15:
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    return f"{value:g}"


def _number(name: str, value, low, high) -> int | float:
    """A finite int or float from a field's value (numbers, numeric strings, numpy scalars), or a UserError
    naming the field: missing, not a number, NaN or infinite."""
    expected = f"a number from {_shown(low)} to {_shown(high)}"
    if value is None or (isinstance(value, str) and not value.strip()):
        raise UserError(f"{name} is missing; choose {expected}.")
    if isinstance(value, bool) or not isinstance(value, (int, float, str, np.integer, np.floating)):
        raise UserError(f"{name} must be {expected}, got a {type(value).__name__}.")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise UserError(f"{name} must be {expected}, got {text[:40]!r}.") from None
    value = value.item() if isinstance(value, (np.integer, np.floating)) else value
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{name} must be {expected}, got {value} (it must be finite).")
    return value


def check_range(name: str, value, low: int, high: int) -> int:
    """A whole number within [low, high], or a UserError naming the setting and its range."""
    value = _number(name, value, low, high)
    if isinstance(value, float):
        if not value.is_integer():
            raise UserError(f"{name} must be a whole number from {low} to {high}, got {value:g}.")
        value = int(value)
    if not low <= value <= high:
        raise UserError(f"{name} must be between {_shown(low)} and {_shown(high)}, got {_shown(value)}.")
    return value


def check_float(name: str, value, low: float, high: float, low_open: bool = False) -> float:
    """A finite number within [low, high] ((low, high] when low_open), or a UserError naming the setting."""
    number = _number(name, value, low, high)
    try:
        value = float(number)
    except OverflowError:  # an int past float's range
        raise UserError(f"{name} must be in [{low:g}, {high:g}], got {_shown(number)}.") from None
    if not (low < value if low_open else low <= value) or value > high:
        bracket = "(" if low_open else "["
        raise UserError(f"{name} must be in {bracket}{low:g}, {high:g}], got {_shown(value)}.")
    return value


def index_of(value) -> int | None:
    """A checked field's value as an index for file names and labels ("0.0", 3.0, np.int64(3) → 0, 3, 3), or None
    when it is not a whole number (the handler's own checks give the message)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(number) if math.isfinite(number) and number.is_integer() else None


def check_seed(value) -> int | None:
    """An empty seed means unseeded; otherwise a whole number from 0 to MAX_SEED."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return check_range("Seed", value, 0, MAX_SEED)


# ---------------------------------------------------------------- attention capture


def pool_edges(n: int, blocks: int) -> np.ndarray:
    """Block boundaries splitting n positions into min(n, blocks) nearly equal blocks."""
    blocks = max(1, min(n, blocks))
    return np.unique(np.linspace(0, n, blocks + 1).round().astype(int))


def pool_attention(probs: np.ndarray, q_edges: np.ndarray, k_edges: np.ndarray) -> np.ndarray:
    """Pool [..., Tq, Tk] attention into blocks: cell (i, j) is the mean over the queries of block i of the
    weight they put on keys of block j. Rows still sum to 1, so a pooled row reads like a real one."""
    summed = np.add.reduceat(probs, k_edges[:-1], axis=-1)  # [..., Tq, Sk]
    summed = np.add.reduceat(summed, q_edges[:-1], axis=-2)  # [..., Sq, Sk]
    counts = np.diff(q_edges).astype(np.float32)
    return summed / counts[:, None]


@dataclass
class AttentionResult:
    tokens: Encoded
    overview: np.ndarray  # [L, H, S, S] block-averaged (S = n when short)
    layer: int
    head: int | None  # None: mean over the layer's heads
    head_matrix: np.ndarray  # [n, n] the chosen head (or mean), full resolution
    seconds: float
    reused: bool  # the all-layer pass was kept from the previous call on the same text
    capture: "CaptureCache"


KEPT_BUDGET_SETTING = "ATTN_KEPT_BUDGET_MB"  # bytes of kept captures and generation rows, all sessions together


class KeptStore:
    """What sessions keep for reuse, server-wide, within one byte budget: the Attention tab's float16 overview
    and the Generate tab's float16 attention rows, under a ticket per session, the least recently used dropped
    first. A session holds only its ticket (and the key of what it kept), so the budget bounds them all.
    Nothing kept refers to a model, so a model evicted from the ModelStore is freed; a dropped entry costs its
    session one more pass (or, for generation rows, the rows)."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, list] = OrderedDict()  # ticket → [key, value, nbytes]
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(entry[2] for entry in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, ticket: str, key: tuple, value, nbytes: int) -> bool:
        """Keep value under ticket (replacing what the ticket held); False when it alone exceeds the budget."""
        with self._lock:
            self._entries.pop(ticket, None)
            if nbytes > self.budget_bytes:
                return False
            self._entries[ticket] = [key, value, nbytes]
            self._evict()
            return True

    def grow(self, ticket: str, key: tuple, extra: int) -> bool:
        """Count `extra` more bytes for a kept value that grew; False (and the entry dropped) when it no
        longer fits the budget or is gone."""
        with self._lock:
            entry = self._entries.get(ticket)
            if entry is None or entry[0] != key:  # gone, or the ticket now holds something newer: leave it
                return False
            if entry[2] + extra > self.budget_bytes:
                del self._entries[ticket]
                return False
            entry[2] += extra
            self._entries.move_to_end(ticket)
            self._evict()
            return True

    def get(self, ticket: str, key: tuple):
        """The value kept under this ticket for this key, or None."""
        with self._lock:
            entry = self._entries.get(ticket)
            if entry is None or entry[0] != key:
                return None
            self._entries.move_to_end(ticket)
            return entry[1]

    def _evict(self) -> None:
        total = sum(entry[2] for entry in self._entries.values())
        while total > self.budget_bytes:
            _, (_, _, dropped) = self._entries.popitem(last=False)
            total -= dropped


KEPT = KeptStore(int(env_number(KEPT_BUDGET_SETTING, 1000.0, 0.0) * 1_000_000))


def new_ticket() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class CaptureCache:
    """What a session keeps between calls of the Attention tab: which text its capture was of, and the ticket
    of that capture in the server-wide KEPT. A few bytes: no arrays, no model."""

    key: tuple  # (model name, token count, hash of the ids)
    ticket: str

    @property
    def overview(self) -> np.ndarray | None:
        kept = KEPT.get(self.ticket, self.key)
        return None if kept is None else kept.astype(np.float32)


def model_view_tile(n_tokens: int, n_layers: int, n_heads: int) -> int:
    """Tile side for the model view so the mosaic stays within MODEL_VIEW_CELLS."""
    side = int(math.sqrt(MODEL_VIEW_CELLS / max(1, n_layers * n_heads))) - 1
    return max(4, min(n_tokens, 64, side))


def capture_attention(
    model, model_name: str, tokens: Encoded, layer: int, head: int | None, previous: CaptureCache | None = None
) -> AttentionResult:
    """Every layer × head pooled for the model view (core.capture), and one layer at full resolution.

    Which view gets which resolution: the model view gets block averages (tile side from model_view_tile);
    the head view and the window get the chosen layer exactly: kept from the same pass on a new text, recomputed
    by a pass up to that layer when only the layer or window changes."""
    from core.capture import AttentionMaps, capture, stack_inputs  # noqa: PLC0415

    cfg = model.config
    n = len(tokens.ids)
    key = (model_name, n, hash(tuple(tokens.ids)))
    ticket = previous.ticket if previous is not None else new_ticket()
    started = time.perf_counter()
    ids = as_batch(tokens.ids, model.device)
    kept = KEPT.get(ticket, key) if previous is not None else None
    reused = kept is not None
    if reused:  # the chosen layer alone, by a pass up to it
        maps = AttentionMaps(kept.astype(np.float32), n, model, stack_inputs(model, ids))
    else:
        tile = model_view_tile(n, cfg.n_layers, cfg.n_heads)
        # the chosen layer at full resolution in the same pass (a seq2seq model: its encoder's); other layers
        # are recomputed when asked for
        maps = capture(model, ids, overview_size=tile, keep_full_up_to=0, keep_layers={layer})
        overview = maps.overview.astype(np.float16)
        KEPT.put(ticket, key, overview, overview.nbytes)
    head_matrix = maps.head(layer, head)
    seconds = time.perf_counter() - started
    return AttentionResult(tokens, maps.overview, layer, head, head_matrix, seconds, reused, CaptureCache(key, ticket))


def visible_positions(tokens: Encoded, start: int, stop: int, hide_special: bool) -> np.ndarray:
    """Positions start..stop-1, without special tokens when asked."""
    positions = np.arange(start, stop)
    if hide_special:
        positions = positions[[not tokens.special[p] for p in positions]]
    return positions


# ---------------------------------------------------------------- generation


def chat_prompt(model, prompt: str) -> str:
    """The instruct model's chat template around one user message, ready for generation."""
    tok = model.tokenizer
    if not getattr(tok, "chat_template", None):
        raise UserError("This model has no chat template; switch chat mode off.")
    return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)


@dataclass
class GenerationUpdate:
    prompt_text: str  # what the model read (chat template included)
    new_text: str  # what it has written so far
    n_new: int
    seconds: float
    done: bool
    stop_reason: str = ""
    note: str = ""  # e.g. how much of a long prompt was cut

    @property
    def tokens_per_second(self) -> float:
        return self.n_new / self.seconds if self.seconds > 0 else 0.0


def stream_generation(
    model,
    prompt: str,
    chat: bool,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
) -> Iterator[GenerationUpdate]:
    """Yield the text as the model writes it, one update per token. Closing the iterator stops the model."""
    if not model.config.causal and not model.config.is_encoder_decoder:
        raise UserError(
            f"{model.config.family} here is an encoder: it fills in and encodes text but does not "
            f"generate. Pick a decoder model."
        )
    if prompt is None or (isinstance(prompt, str) and not prompt.strip()):
        raise UserError("The prompt is empty.")
    prompt = valid_unicode(prompt)
    max_new_tokens = check_range("Max new tokens", max_new_tokens, 1, MAX_GENERATE_TOKENS)
    temperature = check_float("Temperature", temperature, 0.0, MAX_TEMPERATURE)
    top_p = None if top_p is None else check_float("Top-p", top_p, 0.0, 1.0, low_open=True)
    top_k = None if top_k in (None, "", 0) else check_range("Top-k", top_k, 0, model.config.vocab_size) or None
    seed = check_seed(seed)
    text = chat_prompt(model, prompt) if chat else prompt
    tok = model.tokenizer
    ids = tok(text, add_special_tokens=not chat)["input_ids"]
    room = min(model.config.max_positions - max_new_tokens, MAX_PROMPT_TOKENS)
    if room < 1:
        raise UserError(f"Max new tokens must be below the model's context of {model.config.max_positions}.")
    note = ""
    if len(ids) > room:
        note = (
            f"The prompt has {len(ids):,} tokens; only its last {room:,} are used "
            f"({len(ids) - room:,} dropped from the start)."
        )
        ids = ids[-room:]  # keep the end of a long prompt: it is what the continuation follows
        text = tok.decode(ids)
    stream = model.stream(
        as_batch(ids, model.device),
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p if top_p is not None and top_p < 1.0 else None,
        seed=seed,
    )
    new: list[int] = []
    started = time.perf_counter()
    try:
        for token in stream:
            new.append(int(token))
            yield GenerationUpdate(
                text,
                tok.decode(new, skip_special_tokens=True),
                len(new),
                time.perf_counter() - started,
                False,
                note=note,
            )
    finally:
        close = getattr(stream, "close", None)
        if close:
            close()
    reason = "token budget reached" if len(new) >= max_new_tokens else "end of text"
    yield GenerationUpdate(
        text, tok.decode(new, skip_special_tokens=True), len(new), time.perf_counter() - started, True, reason, note
    )


# ---------------------------------------------------------------- positional encodings


def sinusoidal(n: int, d: int) -> np.ndarray:
    """Eq. 4.1 as [n, d] float64 (interleaved sin/cos, as the theory writes it)."""
    return sinusoidal_encoding(n, d).double().cpu().numpy()


def pe_shift_check(pe: np.ndarray, d: int, k: int) -> dict:
    """PE(p + k) = R_k · PE(p) for every p, with R_k block-diagonal rotations by ω_i·k (eq. 4.1 property 3).

    Returns the largest |PE(p+k) − R_k PE(p)|, how far R_k is from orthogonal, and the residual of one
    matrix fitted by least squares to all the pairs (PE(p), PE(p+k)): a single linear map serves every p.
    """
    n = pe.shape[0]
    if not 0 < k < n:
        raise UserError(f"The offset k must be between 1 and {n - 1} for n = {n} positions.")
    omega = 1.0 / np.power(10000.0, 2 * np.arange(d // 2) / d)
    rot = np.zeros((d, d))
    for i, w in enumerate(omega):
        c, s = math.cos(w * k), math.sin(w * k)
        # [sin(a+b), cos(a+b)] = [[cos b, sin b], [−sin b, cos b]] · [sin a, cos a]
        rot[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, s], [-s, c]]
    before, after = pe[: n - k], pe[k:]
    analytic_error = float(np.abs(after - before @ rot.T).max())
    fitted, *_ = np.linalg.lstsq(before, after, rcond=None)  # after ≈ before @ fitted
    fit_error = float(np.abs(after - before @ fitted).max())
    return {
        "k": k,
        "pairs": n - k,
        "analytic_max_error": analytic_error,
        "fit_max_error": fit_error,
        "rotation_orthogonality": float(np.abs(rot @ rot.T - np.eye(d)).max()),
    }


def cosine_similarity(x: np.ndarray) -> np.ndarray:
    unit = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    return unit @ unit.T


def rope_scores(
    model,
    ids: list[int],
    layer: int,
    head: int,
    query_pos: int,
    key_pos: int,
    distances: np.ndarray,
    offsets: list[int],
):
    """Score of one real query/key pair (the layer's own projections, before rotation) placed at relative
    distance Δ, for several absolute offsets m: q at position m + Δ, k at position m. RoPE makes the curves equal."""
    cfg = model.config
    q, k = queries_keys(model, as_batch(ids, model.device), layer, rotate=False)  # [1, H, T, hd], [1, H_kv, T, hd]
    kv_head = head // (cfg.n_heads // cfg.n_kv_heads)
    q_vec = q[0, head, query_pos].float()
    k_vec = k[0, kv_head, key_pos].float()
    inv_freq = rope_frequencies(model)
    scale = cfg.head_dim**-0.5
    curves = {}
    for m in offsets:
        q_pos = torch.as_tensor(m + distances, dtype=torch.long, device=q_vec.device)[None]  # [1, D]
        k_pos = torch.full_like(q_pos, m)
        q_rot = apply_rope(q_vec.expand(1, 1, len(distances), -1).contiguous(), q_pos, inv_freq)[0, 0]
        k_rot = apply_rope(k_vec.expand(1, 1, len(distances), -1).contiguous(), k_pos, inv_freq)[0, 0]
        curves[m] = to_numpy((q_rot * k_rot).sum(-1) * scale)
    return curves


# ---------------------------------------------------------------- mask demo


def qk_for_head(model, ids: list[int], layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen head's rotated queries and keys [T, d_k] (grouped-query heads share their key head)."""
    cfg = model.config
    q, k = queries_keys(model, as_batch(ids, model.device), layer, rotate=True)
    kv_head = head // (cfg.n_heads // cfg.n_kv_heads)
    return q[0, head].float(), k[0, kv_head].float()


def mask_stages(q: torch.Tensor, k: torch.Tensor, head_dim: int) -> dict[str, tuple[np.ndarray, ...]]:
    """Eq. 2.1 for one window of queries and keys, with the causal mask on and off."""
    n = q.shape[0]
    scale = head_dim**-0.5
    out = {}
    for name, allowed in (("causal mask on", causal_mask(n, n, q.device)), ("causal mask off", None)):
        scores, masked, probs = attention_stages(q[None, None], k[None, None], allowed, scale)
        out[name] = (to_numpy(scores[0, 0]), to_numpy(masked[0, 0]), to_numpy(probs[0, 0]))
    return out


def next_token_metrics(logits: torch.Tensor, ids: list[int]) -> tuple[float, float]:
    """Mean cross-entropy (nats) and accuracy of predicting token t+1 from position t."""
    target = torch.tensor(ids[1:], device=logits.device)
    pred = logits[0, :-1].float()
    loss = torch.nn.functional.cross_entropy(pred, target).item()
    acc = (pred.argmax(-1) == target).float().mean().item()
    return loss, acc


def row_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each attention row, [..., Tq]."""
    p = probs.float()
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


def causal_effect(model, ids: list[int]) -> dict | None:
    """Next-token loss and accuracy on the text with the causal mask on and off; None without an LM head."""
    if len(ids) < 2:
        raise UserError("The mask demo needs at least 2 tokens of text.")
    batch = as_batch(ids, model.device)
    with torch.inference_mode():
        on = model(batch)
        if on.logits is None:
            return None
        off = model(batch, causal_mask=False)
    loss_on, acc_on = next_token_metrics(on.logits, ids)
    loss_off, acc_off = next_token_metrics(off.logits, ids)
    return {"loss": (loss_on, loss_off), "accuracy": (acc_on, acc_off), "predictions": len(ids) - 1}


def pad_pair(model, ids_a: list[int], ids_b: list[int]) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Batch two sequences, padding the shorter: on the left for causal models (so padding sits before the
    real tokens, where a causal query can see it), on the right for encoders. Returns ids, mask [2, T], side."""
    tok = model.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else (model.config.eos_ids or [0])[0]
    n = max(len(ids_a), len(ids_b))
    side = "left" if model.config.causal else "right"
    rows, masks = [], []
    for ids in (ids_a, ids_b):
        fill = [pad] * (n - len(ids))
        rows.append(fill + ids if side == "left" else ids + fill)
        real = [1] * len(ids)
        masks.append([0] * len(fill) + real if side == "left" else real + [0] * len(fill))
    return torch.tensor(rows, device=model.device), torch.tensor(masks, device=model.device), side


def padding_effect(model, ids_a: list[int], ids_b: list[int]) -> dict:
    """Two texts batched with padding, run with the padding mask on and off.

    Per layer: the attention mass that the real queries of the padded row put on pad keys (mean over heads
    and queries). And how far those real tokens' outputs move from running the short text alone."""
    if len(ids_a) == len(ids_b):
        raise UserError("The two padding texts have the same number of tokens, so nothing is padded; make one shorter.")
    if len(ids_a) < len(ids_b):
        ids_a, ids_b = ids_b, ids_a
    batch, mask, side = pad_pair(model, ids_a, ids_b)
    real = mask[1].bool()
    with torch.inference_mode():
        alone = model(as_batch(ids_b, model.device)).hidden_states[0].float()  # [Tb, d]
        results = {}
        for name, use_mask in (("padding mask on", True), ("padding mask off", False)):
            out = model(batch, attention_mask=mask, padding_mask=use_mask, capture_attention=True)
            attn = out.encoder_attentions if model.config.is_encoder_decoder else out.attentions
            pad_mass = [float(a[1][:, real][:, :, ~real].sum(-1).mean()) for a in attn]  # a: [B, H, T, T]
            hidden = out.hidden_states[1][real].float()
            change = (hidden - alone).norm(dim=-1) / alone.norm(dim=-1).clamp_min(1e-12)
            results[name] = {
                "pad_mass": pad_mass,
                "max_change": float(change.max()),
                "mean_change": float(change.mean()),
            }
    return {"side": side, "n_pad": int((~real).sum()), "n_real": int(real.sum()), "results": results}


def scaling_entropy(model, ids: list[int], layer: int, head: int) -> dict:
    """Mean attention entropy per layer with and without the 1/√d_k factor, and the chosen head's entropy."""
    batch = as_batch(ids, model.device)
    out = {}
    with torch.inference_mode():
        for name, scale in (("scaled by 1/√d_k", True), ("not scaled", False)):
            res = model(batch, scale=scale, capture_attention=True)
            attn = res.encoder_attentions if model.config.is_encoder_decoder else res.attentions
            per_layer = [float(row_entropy(a[0]).mean()) for a in attn]
            out[name] = {
                "per_layer": per_layer,
                "head": float(row_entropy(attn[layer][0, head]).mean()),
                "head_max_weight": float(attn[layer][0, head].max(-1).values.mean()),
            }
    causal = model.config.causal
    n = len(ids)
    # the most a row can have: log(number of keys it may see), averaged over rows
    uniform = float(np.mean(np.log(np.arange(1, n + 1)))) if causal else math.log(n)
    return {"curves": out, "uniform": uniform, "head_dim": model.config.head_dim}


# ---------------------------------------------------------------- heads: what each head does, and whether it matters


def next_token_reason(model, what: str) -> str | None:
    """Why `what` (a next-token measurement) cannot run on this model, or None when it can."""
    cfg = model.config
    if cfg.is_encoder_decoder:
        return (
            f"{what} reads decoder-only models here: this is an encoder-decoder, whose decoder needs a target text "
            "of its own. The atlas above shows its encoder's heads."
        )
    if not cfg.causal:
        return (
            f"{what} measures next-token prediction, and this model is an encoder: it reads the text in both "
            "directions and predicts no next token."
        )
    if model.lm_head is None:
        return f"{what} needs an LM head to predict tokens, and this checkpoint has none."
    return None


def lm_head_reason(model, what: str) -> str | None:
    """Why `what` (a reading of token predictions: lens, attribution) cannot run here, or None when it can."""
    if model.config.is_encoder_decoder:
        return (
            f"{what} reads decoder-only models and encoders with an LM head here: this is an encoder-decoder, "
            "whose predictions come from a decoder that needs a target text of its own."
        )
    if model.lm_head is None:
        return (
            f"{what} reads each position's token prediction through the LM head, and this checkpoint has none "
            "(a sentence encoder such as all-MiniLM-L6-v2 keeps only the encoder), so there is nothing to read."
        )
    return None


def scored_shape(model) -> tuple[int, int]:
    """(layers, heads) of the stack the Heads tab scores: the main one, or a seq2seq model's encoder."""
    cfg = (model.encoder or model.stack).cfg
    return cfg.n_layers, cfg.n_heads


def score_names(model) -> list[str]:
    """The head scores that make sense for this model: the induction probe only where it predicts next tokens."""
    skip = heads.CAUSAL_ONLY if next_token_reason(model, "The probe") else ()
    return [name for name in heads.SCORES if name not in skip]


@dataclass
class HeadsCache:
    """One session's results for its current model and text, so moving between the Heads tab's sections does
    not recompute them. The induction probe depends on the model only and survives a new text."""

    key: tuple  # (model name, token count, hash of the ids)
    tokens: Encoded
    scores: dict[str, torch.Tensor] | None = None  # the text's attention-pattern scores, name → [L, H]
    induction: heads.InductionResult | None = None
    sweep_scores: dict[str, torch.Tensor] | None = None  # the same scores on the sweep's first tokens
    sweeps: dict[str, torch.Tensor] = field(default_factory=dict)  # ablation → [L, H] mean loss increase
    lens: heads.LensTable | None = None
    surprisal: heads.Surprisal | None = None
    attribution: tuple | None = None  # (settings, heads.Attribution) of the last call

    @property
    def model_name(self) -> str:
        return self.key[0]


def heads_cache(previous: HeadsCache | None, model_name: str, tokens: Encoded) -> HeadsCache:
    """The session's cache for this model and text: the previous one when both are unchanged."""
    key = (model_name, len(tokens.ids), hash(tuple(tokens.ids)))
    if previous is not None and previous.key == key:
        return previous
    cache = HeadsCache(key, tokens)
    if previous is not None and previous.model_name == model_name:
        cache.induction = previous.induction
    return cache


def induction_probe(model, cache: HeadsCache) -> heads.InductionResult | None:
    """The model's induction probe (kept in the cache), or None where the model predicts no next token."""
    if next_token_reason(model, "The probe") is not None:
        return None
    if cache.induction is None:
        cache.induction = heads.induction(model, INDUCTION_LENGTH, INDUCTION_SEED)
    return cache.induction


def head_scores(model, cache: HeadsCache) -> dict[str, torch.Tensor]:
    """Every score of every head, name → [L, H]: the text's attention patterns, and the induction probe's."""
    if cache.scores is None:
        cache.scores = heads.pattern_scores(model, as_batch(cache.tokens.ids, model.device))
    scores = dict(cache.scores)
    probe = induction_probe(model, cache)
    if probe is not None:
        scores["induction"] = probe.scores
    return scores


def sweep_scores(model, cache: HeadsCache, limit: int) -> dict[str, torch.Tensor]:
    """The scores on the text's first `limit` tokens (the sweep's), so that both maps read the same tokens."""
    if len(cache.tokens.ids) <= limit:
        return head_scores(model, cache)
    if cache.sweep_scores is None:
        cache.sweep_scores = heads.pattern_scores(model, as_batch(cache.tokens.ids[:limit], model.device))
    scores = dict(cache.sweep_scores)
    probe = induction_probe(model, cache)
    if probe is not None:
        scores["induction"] = probe.scores
    return scores


def named_heads(scores: dict[str, torch.Tensor]) -> dict[str, list[tuple[int, int, float]]]:
    """Heads whose score passes its naming threshold (core.heads.SCORES): name → [(layer, head, score)]."""
    return heads.named_heads(scores)


def check_score(model, name: str) -> str:
    """A score name this model has, or a UserError that lists them (and why induction may be missing)."""
    names = score_names(model)
    if name in names:
        return name
    if name in heads.SCORES:
        raise UserError(f"The {name} score is not available here. {next_token_reason(model, 'The induction probe')}")
    raise UserError(f"Unknown score {name!r}; choose one of {', '.join(names)}.")


def top_heads(table: torch.Tensor, name: str, k: int = TOP_HEADS) -> list[tuple[int, int, float]]:
    """The k most characteristic heads for a score: highest, or lowest for entropy (low entropy is focused)."""
    return heads.top_heads(table, k, largest=name != "entropy")


def head_map(model, ids: list[int], layer: int, head: int) -> np.ndarray:
    """One head's attention over the text [n, n] (a seq2seq model: its encoder's), by a pass up to that layer."""
    stack, kind = (model.encoder, "encoder") if model.encoder is not None else (model.stack, "self")
    observer = LayerObserver(layer, kind)
    with torch.inference_mode():
        model.run_stack(stack, as_batch(ids, model.device), None, kind=kind, causal=stack.cfg.causal,
                        observer=observer, n_layers=layer + 1)
    return to_numpy(observer.probs[head])


HEAD_PATTERN = re.compile(r"(\d{1,6})\.(\d{1,6})", re.ASCII)


def parse_heads(text: str | None, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """"3.2, 5.0" → [(3, 2), (5, 0)] (layer.head, in order, repeats dropped), or a UserError naming the bad one."""
    items = [item for item in re.split(r"[,;\s]+", text or "") if item]
    if not items:
        raise UserError('No heads to ablate: write them as layer.head, e.g. "3.2, 5.0", or pick the top 5 by a score.')
    chosen: list[tuple[int, int]] = []
    for item in items:
        match = HEAD_PATTERN.fullmatch(item)
        if match is None:
            raise UserError(f"{item!r} is not a head: write layer.head with two whole numbers, e.g. 3.2.")
        layer, head = int(match[1]), int(match[2])
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise UserError(
                f"Head {item} does not exist: this model has layers 0–{n_layers - 1} and heads 0–{n_heads - 1}."
            )
        if (layer, head) not in chosen:
            chosen.append((layer, head))
    return chosen


def format_heads(pairs) -> str:
    return ", ".join(f"{layer}.{head}" for layer, head, *_ in pairs)


def check_ablation(kind: str) -> str:
    if kind not in ("zero", "mean"):
        raise UserError(f"Ablation must be 'zero' or 'mean', got {kind!r}.")
    return kind


def token_texts(model, ids) -> list[str]:
    """Each token id as it reads on a page (visible whitespace)."""
    return [display_token(model.tokenizer.decode([int(i)])) for i in ids]


def token_pieces(model, ids) -> list[str]:
    """Each token's own text, spaces and newlines kept, for showing the text as it reads."""
    return [model.tokenizer.decode([int(i)]) for i in ids]


def token_grid(model, ids: np.ndarray) -> list[list[str]]:
    """A 2-D array of token ids as display strings, each distinct id decoded once."""
    distinct = np.unique(ids)
    names = dict(zip(distinct.tolist(), token_texts(model, distinct)))
    return [[names[i] for i in row] for row in ids.tolist()]


def alternatives(model, result: heads.Surprisal) -> list[list[tuple[str, float]]]:
    """The top alternatives at each predicted position as (token text, probability)."""
    ids, probs = result.alternatives.numpy(), to_numpy(result.probs)
    grid = token_grid(model, ids)
    return [list(zip(names, row.tolist())) for names, row in zip(grid, probs)]


@dataclass
class AblationView:
    heads: list[tuple[int, int]]
    labels: list[str]  # the token each loss is for: the next one (a decoder), the one there (an MLM encoder)
    clean_loss: np.ndarray  # [T - 1] for a decoder, [T] for an MLM encoder; nats
    ablated_loss: np.ndarray
    changed: list[tuple[int, str, str, str, str]]  # (position, token there, clean top, ablated top, the text's)

    @property
    def delta(self) -> np.ndarray:
        return self.ablated_loss - self.clean_loss


def loss_tokens(model) -> int:
    """The fewest tokens a loss can be measured on: a decoder needs a next token, an MLM encoder only one."""
    return 2 if model.config.causal else 1


def ablation(model, tokens: Encoded, head_pairs: list[tuple[int, int]], kind: str) -> AblationView:
    """Per-token loss with and without the heads, and the positions whose top prediction changed."""
    reason = lm_head_reason(model, "Ablation")
    if reason:
        raise UserError(reason)
    if len(tokens.ids) < loss_tokens(model):
        raise UserError("Ablation needs at least 2 tokens: there is no next token to predict in one.")
    result = heads.ablate(model, as_batch(tokens.ids, model.device), head_pairs, check_ablation(kind))
    n, causal = len(tokens.ids), model.config.causal
    positions = result.changed.tolist()
    clean = token_texts(model, result.clean_top[positions].tolist())
    ablated = token_texts(model, result.ablated_top[positions].tolist())
    answers = [
        (tokens.labels[p + 1] if p + 1 < n else "(after the text)") if causal else tokens.labels[p] for p in positions
    ]
    changed = [(p, tokens.labels[p], c, a, t) for p, c, a, t in zip(positions, clean, ablated, answers)]
    labels = tokens.labels[1:] if causal else tokens.labels
    return AblationView(head_pairs, labels, to_numpy(result.clean_loss), to_numpy(result.ablated_loss), changed)


@dataclass
class SweepUpdate:
    done: int  # heads ablated so far
    total: int
    increase: torch.Tensor | None  # [L, H] once finished
    seconds: float


class SweepStopped(Exception):
    """The sweep's reader went away (the page stopped it), so the worker ends at the next batch."""


def stream_sweep(model, ids: list[int], kind: str, batch: int = SWEEP_BATCH) -> Iterator[SweepUpdate]:
    """Ablate every head of the main stack alone, `batch` at a time, yielding after each batch and then the
    [L, H] map of mean loss increase. The sweep runs in a worker thread; closing the iterator stops it."""
    kind = check_ablation(kind)
    updates: queue.Queue = queue.Queue()
    stopped = threading.Event()

    def report(done: int, total: int) -> None:
        if stopped.is_set():
            raise SweepStopped
        updates.put(("progress", done, total))

    def work() -> None:
        try:
            updates.put(("done", heads.ablation_sweep(model, as_batch(ids, model.device), kind, batch, report)))
        except SweepStopped:
            pass
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            updates.put(("error", exc))

    started = time.perf_counter()
    total = model.config.n_layers * model.config.n_heads
    worker = threading.Thread(target=work, name="ablation-sweep", daemon=True)
    worker.start()
    try:
        yield SweepUpdate(0, total, None, 0.0)
        while True:
            message = updates.get()
            seconds = time.perf_counter() - started
            if message[0] == "progress":
                yield SweepUpdate(message[1], message[2], None, seconds)
            elif message[0] == "done":
                yield SweepUpdate(total, total, message[1], seconds)
                return
            else:
                raise message[1]
    finally:
        stopped.set()


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return heads.rank_correlation(a, b)


def attribution(model, cache: HeadsCache, position, layer, head, steps) -> heads.Attribution:
    """Attention, rollout, gradient × input and integrated gradients for the prediction at one position, with
    every setting checked first (steps × tokens within MAX_IG_TOKEN_STEPS). The last result is kept in the cache
    with its settings (position, layer, head, steps)."""
    reason = lm_head_reason(model, "Attribution")
    if reason:
        raise UserError(reason)
    cfg = model.config
    n = len(cache.tokens.ids)
    position = check_range("Position", position, -1, n - 1)
    position = n - 1 if position == -1 else position
    layer = check_range("Layer", layer, 0, cfg.n_layers - 1)
    head = check_range("Head", head, 0, cfg.n_heads - 1)
    steps = check_range("Steps", steps, 1, MAX_IG_STEPS)
    used = position + 1 if cfg.causal else n  # a decoder's prediction at p reads tokens 0..p
    if steps * used > MAX_IG_TOKEN_STEPS:
        raise UserError(
            f"Integrated gradients would run {steps} steps × {used} tokens = {steps * used:,} token passes at once; "
            f"the limit is {MAX_IG_TOKEN_STEPS:,}. Use at most {max(1, MAX_IG_TOKEN_STEPS // used)} steps"
            + (", or an earlier position." if cfg.causal else ", or a shorter text.")
        )
    settings = (position, layer, head, steps)
    if cache.attribution is None or cache.attribution[0] != settings:
        try:
            result = heads.attribute(model, as_batch(cache.tokens.ids, model.device), position, layer, head, steps)
        except (ValueError, IndexError) as exc:
            raise UserError(str(exc)) from exc
        cache.attribution = (settings, result)
    return cache.attribution[1]


def logit_lens(model, cache: HeadsCache) -> heads.LensTable:
    reason = lm_head_reason(model, "The logit lens")
    if reason:
        raise UserError(reason)
    if cache.lens is None:
        cache.lens = heads.logit_lens(model, as_batch(cache.tokens.ids, model.device))
    return cache.lens


def token_surprisal(model, cache: HeadsCache) -> heads.Surprisal:
    reason = next_token_reason(model, "Surprisal")
    if reason:
        raise UserError(reason)
    if len(cache.tokens.ids) < 2:
        raise UserError("Surprisal needs at least 2 tokens: the first one is never predicted.")
    if cache.surprisal is None:
        cache.surprisal = heads.surprisal(model, as_batch(cache.tokens.ids, model.device), k=5)
    return cache.surprisal
