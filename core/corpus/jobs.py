"""The machinery of a corpus job: the items of one job (Job: what finished, what was skipped, whether it was
stopped), the loop every *_over runs over them (Job.todo), the checks of its inputs, and the batching of texts of
similar length. It imports no analysis: the analyses over a corpus (core/analysis/over.py and the *_over beside
each analysis) are built on it.

Every *_over takes progress(done, total), called as items finish; each(index, value), called with every finished
item's own value as it comes (what a row of per_item holds; a dict of them for head scores, a pair for
attribution), so a caller can keep them as they stream; and stop(), asked between batches (and between the batches
inside one item's sweep, and between the layers of a head-score batch): a stopped job returns the summary of the
items it finished, and its note says how many of how many. done: index → value of items measured before (as
`each` gave them; core/corpus/saved.py reads them back to resume a job): they are not measured again, nor handed
to `each`, and the summary holds them in order.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from . import Pair
from .stats import Bounds, Over, summarise

BATCH_TOKENS = 4096        # head scores: padded tokens in one batch, rows × the batch's longest text
NAMED = 20                 # items a note or an error names before it says "…"
PAIR_TOKENS = 256          # patch_over: pairs × their longest prompt swept together (their records are held at once)
PATCH_TOKENS = 1024        # patch_over: rows × positions in one batch of cells; larger ones only hold more at once

Progress = Callable[[int, int], None]
Each = Callable[[int, object], None]
Stop = Callable[[], bool]
Done = Mapping[int, object]


# ---- the items of one job: what finished, what was skipped, whether it was stopped ----

class Stopped(Exception):
    """Raised from inside a measurement's own progress hook when stop() says so: the item under way is dropped."""


@dataclass
class Job:
    total: int
    noun: str                   # "text" or "pair", for the notes
    progress: Progress | None = None
    stop: Stop | None = None
    each: Each | None = None
    values: dict[int, object] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)
    stopped: bool = False

    def resume(self, done: Done | None) -> Job:
        """Start from the values of items measured before (index → value); progress counts them at once."""
        wrong = sorted(i for i in (done or {}) if not (isinstance(i, int) and 0 <= i < self.total))
        if wrong:
            raise ValueError(f"done names {self.noun}s {wrong[:NAMED]} outside 0..{self.total - 1}: it must map the "
                             f"index of an item of this corpus to its value")
        self.values.update(done or {})
        if self.values:
            self.report()
        return self

    def left(self) -> list[int]:
        """The indices of the items not measured yet (those resumed from `done` are not), in order."""
        return [i for i in range(self.total) if i not in self.values]

    def run(self, groups: Iterable, measure: Callable[[object], None]) -> Job:
        """measure(group) for each group in turn (an item's index, or a batch of indices) until stop() says so,
        asked before each; measure calls finish or skip for the items it measures. A Stopped raised inside it
        (from `inner`, handed to an item's own sweep) drops the group under way and ends the job as stop() does:
        the items finished before it are summarised."""
        for group in groups:
            if self.stopping():
                break
            try:
                measure(group)
            except Stopped:
                self.stopped = True
                break
        return self

    def stopping(self) -> bool:
        self.stopped = self.stopped or (self.stop is not None and bool(self.stop()))
        return self.stopped

    def inner(self, _done: int, _total: int) -> None:
        """The progress hook handed to a sweep inside one item: it ends the sweep when stop() says so."""
        if self.stopping():
            raise Stopped

    def finish(self, index: int, value) -> None:
        self.values[index] = value
        if self.each is not None:
            self.each(index, value)
        self.report()

    def skip(self, index: int, why: str) -> None:
        self.skipped[index] = why
        self.report()

    def report(self) -> None:
        if self.progress is not None:
            self.progress(len(self.values) + len(self.skipped), self.total)

    def left_out(self, left_out: dict[int, str] | None = None) -> dict[int, str]:
        """index → why, of the items skipped and those the caller leaves out of one part."""
        return {**self.skipped, **(left_out or {})}

    def note(self, left_out: dict[int, str] | None = None) -> str:
        """Which items were skipped and why, and whether the job was stopped."""
        notes = []
        left_out = self.left_out(left_out)
        if left_out:
            named = ", ".join(f"{self.noun} {i} ({why})" for i, why in sorted(left_out.items())[:NAMED])
            named += " …" if len(left_out) > NAMED else ""
            notes.append(f"left out {len(left_out)} of {self.total} {self.noun}s: {named}")
        if self.stopped:
            notes.append(f"stopped after {len(self.values) + len(self.skipped)} of {self.total} {self.noun}s: "
                         f"the summary is of the {len(self.values)} finished")
        return "; ".join(notes)

    def over(self, shape: tuple[int, ...], pick=lambda value: value, left_out: dict[int, str] | None = None, *,
             bounds: Bounds) -> Over:
        """The Over of the finished items (in input order) less those in left_out; shape: one item's value;
        bounds: the quantity's range (stats.summarise)."""
        kept = [i for i in sorted(self.values) if i not in (left_out or {})]
        per_item = torch.stack([pick(self.values[i]) for i in kept]) if kept else torch.empty(0, *shape)
        return summarise(per_item, self.note(left_out), kept, self.left_out(left_out), bounds=bounds)


@dataclass(frozen=True)
class Analysis:
    """An analysis a saved or chunked job runs (core/corpus/saved.py, core/corpus/chunks.py): its name (in the
    job's identity and folder), its *_over, what it runs over and each part's axis names."""
    name: str
    run: Callable                       # an *_over: (model, items, progress=, stop=, each=, done=, **arguments)
    items: str                          # "texts" or "pairs"
    axes: Callable[[dict], dict[str, tuple[str, ...]]]  # arguments → each part's axis names (CSV columns)

    def count(self, arguments: dict, n: int) -> int:
        """How many of the n items the analysis measures (ablation sweeps the first `limit`)."""
        limit = arguments.get("limit")
        return n if limit is None else min(limit, n)


# ---- the inputs, checked ----

def check_ids(model, ids, name: str) -> Tensor:
    """One prompt: a non-empty 1-D tensor of token ids the model knows; the error names it."""
    if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        shape = f"shape {list(ids.shape)}, {ids.dtype}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be a 1-D tensor of integer token ids, got {shape}")
    if len(ids) == 0:
        raise ValueError(f"{name} is empty: it needs at least one token")
    vocab = model.config.vocab_size
    if ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"{name} has token ids outside the vocabulary 0..{vocab - 1} "
                         f"(from {int(ids.min())} to {int(ids.max())})")
    return ids.long()


def one_text(ids, name: str = "ids") -> Tensor:
    """One text's token ids as [1, T], the shape the model reads: [T] gains the batch axis and [1, T] stays; any
    other shape, and ids that are not integers, are refused naming what was given. Every analysis of one text
    takes either (the vocabulary and the length are each analysis's own checks)."""
    if not isinstance(ids, Tensor):
        raise ValueError(f"{name} must be a tensor of token ids, [T] or [1, T]; got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be integer token ids, [T] or [1, T]; got {ids.dtype}")
    if ids.dim() == 1:
        return ids[None]
    if ids.dim() == 2 and ids.shape[0] == 1:
        return ids
    batch = f" (a batch of {ids.shape[0]} texts: pass one row)" if ids.dim() == 2 else ""
    raise ValueError(f"{name} must be one text, [T] or [1, T]; got shape {list(ids.shape)}{batch}")


def check_token(model, token: int, name: str) -> int:
    """One token id the model knows (an answer, a foil); the error names it."""
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < model.config.vocab_size:
        raise ValueError(f"{name} must be a token id in 0..{model.config.vocab_size - 1}, got {token!r}")
    return token


def check_texts(model, texts: Sequence[Tensor]) -> list[Tensor]:
    """Each text checked by check_ids, the error naming the text by its index."""
    if len(texts) == 0:
        raise ValueError("the corpus is empty: give at least one text (a 1-D tensor of token ids)")
    return [check_ids(model, ids, f"text {i}") for i, ids in enumerate(texts)]


def check_pairs(model, pairs: Sequence[Pair]) -> list[Pair]:
    """Each pair's prompts checked and of one length, its answer and foil token ids that differ; the error names
    the pair by its index."""
    if len(pairs) == 0:
        raise ValueError("no pairs: give at least one Pair(clean, corrupted, answer, foil)")
    checked = []
    for i, pair in enumerate(pairs):
        clean = check_ids(model, pair.clean, f"pair {i}'s clean prompt")
        corrupted = check_ids(model, pair.corrupted, f"pair {i}'s corrupted prompt")
        if len(clean) != len(corrupted):
            raise ValueError(f"pair {i}: the clean prompt has {len(clean)} tokens and the corrupted {len(corrupted)}; "
                             "a pair needs the same length in both")
        answer, foil = pair.answer, pair.foil
        try:
            answer, foil = check_token(model, answer, "answer"), check_token(model, foil, "foil")
        except ValueError as error:
            raise ValueError(f"pair {i}: {error}") from None
        if answer == foil:
            raise ValueError(f"pair {i}: the answer and the foil are the same token ({answer}), so their logit "
                             "difference is 0 everywhere")
        checked.append(Pair(clean, corrupted, answer, foil))
    return checked


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped shortest first, each group at most batch_tokens rows × its longest length (one text at
    least): texts of similar length share a batch, so little of it is padding."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


def pad_id(model) -> int:
    """The id that fills padding (what it is never matters: attention never sees it): the model's own, else 0."""
    cfg = model.config
    return cfg.pad_token_id if cfg.pad_token_id is not None and 0 <= cfg.pad_token_id < cfg.vocab_size else 0


def padded(texts: list[Tensor], pad: int) -> tuple[Tensor, Tensor]:
    """Right-padded ids [B, T_max] and the mask [B, T_max] (True on real tokens)."""
    width = max(len(t) for t in texts)
    ids = torch.full((len(texts), width), pad, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.bool)
    for row, t in enumerate(texts):
        ids[row, :len(t)], mask[row, :len(t)] = t, True
    return ids, mask


# ---- the note of a job capped by `limit` (ablation_over's, a job run in chunks alike) ----

LIMIT_HINT = "; pass limit=None for all"   # the API's way past ablation_over's cap (a page without one drops it)


def ablation_cap_note(swept: int, total: int, limit: int) -> str:
    """What ablation_over's note says of the texts it left: its words, shared with a job run in chunks."""
    return (f"swept the first {swept} of {total} texts (limit={limit}: a sweep runs the model once per head and "
            f"text{LIMIT_HINT})")
