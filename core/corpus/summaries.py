"""Each single-text analysis over many texts (or prompt pairs), summarised: the mean, its 95 % confidence interval
and every item's own value. A summary runs the one measurement of core/analysis per item (or per padded batch of
items, where the measurement takes one) and merges; it never measures a second way.

Every *_over takes progress(done, total), called as items finish; each(index, value), called with every finished
item's own value as it comes (what a row of per_item holds; a dict of them for head scores, a pair for
attribution), so a caller can keep them as they stream; and stop(), asked between batches (and between the batches
inside one item's sweep, and between the layers of a head-score batch): a stopped job returns the summary of the
items it finished, and its note says how many of how many. done: index → value of items measured before (as
`each` gave them; core/corpus/saved.py reads them back to resume a job): they are not measured again, nor handed
to `each`, and the summary holds them in order.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..analysis import heads as head_analysis
from ..analysis import patching
from ..attention import padding_or_none
from . import Pair
from .stats import CONFIDENCE, Bounds, Over, summarise  # noqa: F401  (Over and summarise are this module's results)
from .stats import UNBOUNDED

BATCH_TOKENS = 4096        # head scores: padded tokens in one batch, rows × the batch's longest text
ABLATION_TEXTS = 8         # ablation_over's default cap on texts: its sweep removes every head once per text
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
            answer, foil = patching.check_token(model, answer, "answer"), patching.check_token(model, foil, "foil")
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


# ---- the analyses ----

def head_scores_over(model, texts: Sequence[Tensor], batch_tokens: int = BATCH_TOKENS,
                     progress: Progress | None = None, stop: Stop | None = None,
                     each: Each | None = None, done: Done | None = None) -> dict[str, Over]:
    """The Heads tab's attention-pattern scores [L, H] (core/analysis/heads.py row_scores) per text, summarised:
    kind → Over. Texts of similar length go through together, right-padded with an attention mask, and each is
    scored on its own tokens alone (ScoreObserver), so a text scores as it does alone. Decoders also get
    "induction": measured on each text that repeats a span once, after an optional BOS (as the induction probe
    and induction_texts do); the other texts are left out of that kind and named in its note."""
    texts = check_texts(model, texts)
    cfg = model.config
    induction = cfg.causal and model.encoder is None and model.lm_head is not None
    job = Job(len(texts), "text", progress, stop, each).resume(done)
    pad = pad_id(model)
    todo = [i for i in range(len(texts)) if i not in job.values]
    for places in length_batches([len(texts[i]) for i in todo], batch_tokens):
        if job.stopping():
            break
        batch = [todo[place] for place in places]
        ids, mask = padded([texts[i] for i in batch], pad)
        try:   # stop() is asked after each layer too: one batch may hold the whole corpus
            tables = head_analysis.batch_pattern_scores(model, ids, padding_or_none(mask), induction,
                                                        job.inner)   # name → [B, L, H]
        except Stopped:    # the batch under way is dropped; the texts finished before it are summarised
            break
        for row, i in enumerate(batch):
            job.finish(i, {name: t[row] for name, t in tables.items()})
    stack_cfg = model.attention_stack()[0].cfg
    shape = (stack_cfg.n_layers, stack_cfg.n_heads)
    names = [name for name in head_analysis.SCORES if name not in head_analysis.CAUSAL_ONLY]
    ranges = head_analysis.SCORE_BOUNDS
    result = {name: job.over(shape, lambda value, name=name: value[name], bounds=ranges[name]) for name in names}
    if induction:
        not_repeats = {i: "not a span repeated once" for i, value in job.values.items()
                       if value["induction"].isnan().all()}
        result["induction"] = job.over(shape, lambda value: value["induction"], not_repeats,
                                       bounds=ranges["induction"])
    return result


def logit_attribution_over(model, pairs: Sequence[Pair], progress: Progress | None = None,
                           stop: Stop | None = None, each: Each | None = None,
                           done: Done | None = None) -> tuple[Over, Over]:
    """Direct logit attribution of logit(answer) − logit(foil) on each pair's clean prompt (core/analysis/
    patching.py logit_attribution), summarised: (heads: Over [L, H], mlps: Over [L]). One pair at a time:
    logit_attribution reads one prompt's records, and batching pairs would need a second implementation of it."""
    patching.check_decoder(model, "direct logit attribution")
    patching.check_pre_norm(model, "direct logit attribution")
    pairs = check_pairs(model, pairs)
    job = Job(len(pairs), "pair", progress, stop, each).resume(done)
    for i, pair in enumerate(pairs):
        if i in job.values:
            continue
        if job.stopping():
            break
        parts = patching.logit_attribution(model, pair.clean[None], pair.answer, pair.foil)
        job.finish(i, (parts.heads, parts.mlps))
    cfg = model.config
    return (job.over((cfg.n_layers, cfg.n_heads), lambda value: value[0], bounds=UNBOUNDED),
            job.over((cfg.n_layers,), lambda value: value[1], bounds=UNBOUNDED))


by_position = patching.by_position     # whether a sweep's columns are token positions


def check_one_length(pairs: list[Pair]) -> None:
    """Position sites stack sweeps of one width: every pair of the commonest length, else the others named."""
    lengths = [len(pair.clean) for pair in pairs]
    common = max(set(lengths), key=lengths.count)
    others = [i for i, n in enumerate(lengths) if n != common]
    if others:
        named = ", ".join(f"{i} ({lengths[i]})" for i in others[:NAMED]) + (" …" if len(others) > NAMED else "")
        raise ValueError(f"a sweep over positions needs pairs of one token length: most have {common} tokens, "
                         f"but pairs {named} do not; drop or re-template them, or sweep the heads (site 'z' "
                         "without a layer), which takes any lengths")


def pair_groups(pairs: list[Pair], todo: list[int], pair_tokens: int) -> list[list[int]]:
    """The pairs of todo to sweep together, each group at most pair_tokens pairs × its longest prompt (one pair at
    least), ordered by their tail, the tokens from their first difference to the end, then by length: a batch of
    cells resumes every row from its earliest position, left-padded prompts end together, so pairs with like tails
    share a batch with no wasted positions."""
    def tail(i: int) -> int:
        differ = (pairs[i].clean != pairs[i].corrupted).nonzero()
        return len(pairs[i].clean) - (int(differ[0]) if len(differ) else len(pairs[i].clean))

    groups, current, width = [], [], 0
    for i in sorted(todo, key=lambda i: (tail(i), len(pairs[i].clean))):
        width_with = max(width, len(pairs[i].clean))
        if current and (len(current) + 1) * width_with > pair_tokens:
            groups.append(current)
            current, width_with = [], len(pairs[i].clean)
        current.append(i)
        width = width_with
    return groups + ([current] if current else [])


def patch_over(model, pairs: Sequence[Pair], site: str, mode: str = "denoise", layer: int | None = None,
               progress: Progress | None = None, stop: Stop | None = None,
               each: Each | None = None, done: Done | None = None) -> Over:
    """Activation patching (core/analysis/patching.py patch_sweep) of each pair, summarised: per_item holds each
    pair's normalised scores (1: the clean run's metric, 0: the corrupted run's), and mean is the mean of those
    scores, not the normalised mean metric. Position sites (resid_pre, attn_out, mlp_out, and z at one layer)
    need pairs of one token length; the layer × head sweep of z takes any. A pair whose clean and corrupted runs
    give the same logit difference has no normalised score: it is skipped and named in the note.
    Pairs are swept together (patching.sweep_pairs, the sweep patch_sweep runs on a batch of one): up to
    PAIR_TOKENS pairs × their longest prompt, left-padded, share one clean and one corrupted pass, and their cells
    share batches of up to PATCH_TOKENS rows × positions (sizes, not arguments: a saved job is named by what it
    measures). Each pair is handed on as its last cell finishes; stop() is asked between those batches."""
    patching.check_decoder(model, "patching")
    pairs = check_pairs(model, pairs)
    cfg = model.config
    if site not in patching.SITES:
        raise ValueError(f"site must be one of {', '.join(patching.SITES)}, got {site!r}")
    if mode not in patching.MODES:
        raise ValueError(f"mode must be 'denoise' or 'noise', got {mode!r}")
    if layer is not None and (site != "z" or not 0 <= layer < cfg.n_layers):
        raise ValueError(f"layer= sweeps one layer's heads × positions of site 'z' (layers 0..{cfg.n_layers - 1}); "
                         f"got site {site!r}, layer {layer}")
    positions = by_position(site, layer)
    if positions:
        check_one_length(pairs)
    job = Job(len(pairs), "pair", progress, stop, each).resume(done)
    try:
        for chosen in pair_groups(pairs, [i for i in range(len(pairs)) if i not in job.values], PAIR_TOKENS):
            if job.stopping():
                break
            batch = patching.pair_batch([(pairs[i].clean, pairs[i].corrupted, pairs[i].answer, pairs[i].foil)
                                         for i in chosen], pad_id(model))
            for row, sweep in patching.sweep_pairs(model, batch, site, mode, layer, PATCH_TOKENS, job.inner):
                if sweep.clean_metric == sweep.corrupted_metric:
                    job.skip(chosen[row], "its clean and corrupted runs give the same logit difference, "
                                          f"{sweep.clean_metric:.4g}")
                else:
                    job.finish(chosen[row], sweep.scores)
    except Stopped:
        pass
    n = len(pairs[0].clean)
    shape = patching.sweep_shape(site, layer, n, cfg.n_layers, cfg.n_heads)
    return job.over(shape, bounds=UNBOUNDED)      # normalised scores reach past 0 and 1


def ablation_over(model, texts: Sequence[Tensor], ablation: str = "zero", limit: int | None = ABLATION_TEXTS,
                  batch: int = 16, progress: Progress | None = None, stop: Stop | None = None,
                  each: Each | None = None, done: Done | None = None) -> Over:
    """The mean loss increase when each head alone is removed (core/analysis/heads.py ablation_sweep), per text,
    summarised: Over [L, H]. A sweep runs the model once per head, so by default only the first ABLATION_TEXTS (8)
    texts are swept, and the note says how many were left; limit=None sweeps them all. progress counts texts;
    stop() is asked between the sweep's batches too, so a stop lands within one batch of heads."""
    head_analysis.check_loss_model(model)
    texts = check_texts(model, texts)
    if limit is not None and limit < 1:
        raise ValueError(f"limit is the number of texts to sweep, at least 1 (or None for all), got {limit}")
    chosen = texts if limit is None else texts[:limit]
    job = Job(len(chosen), "text", progress, stop, each).resume(done)
    for i, ids in enumerate(chosen):
        if i in job.values:
            continue
        if job.stopping():
            break
        try:
            job.finish(i, head_analysis.ablation_sweep(model, ids[None], ablation, batch, progress=job.inner))
        except Stopped:
            break
    over = job.over((model.config.n_layers, model.config.n_heads), bounds=UNBOUNDED)   # a loss may also fall
    if len(chosen) < len(texts):
        over.note = "; ".join(part for part in (ablation_cap_note(len(chosen), len(texts), limit), over.note) if part)
    return over


LIMIT_HINT = "; pass limit=None for all"   # the API's way past ablation_over's cap (a page without one drops it)


def ablation_cap_note(swept: int, total: int, limit: int) -> str:
    """What ablation_over's note says of the texts it left: its words, shared with a job run in chunks."""
    return (f"swept the first {swept} of {total} texts (limit={limit}: a sweep runs the model once per head and "
            f"text{LIMIT_HINT})")
