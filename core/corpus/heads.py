"""One head over a corpus: where it puts its most weight (top examples and a sample from each decile of its
weights, as Neuronpedia's head pages show) and its queries and keys in one plane (AttentionViz).

Both read one layer of the attention stack in padded batches of texts of similar length (jobs.py's
length_batches and padded), stop the pass after that layer, and never count a padded row or key. Positions are
each text's own (texts are right-padded, so position p of a batch row is position p of its text).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..plane import joint_plane
from ..attention import position_mask
from ..attention import Kind, Observer
from ..probe import Probe
from .jobs import BATCH_TOKENS, Job, Progress, Stop, check_texts, length_batches, pad_id, padded

SKIPS = ("sink", "self")    # the places top_examples leaves out by default: key 0, and the query's own token
DECILES = 10
PER_DECILE = 5              # places shown from each decile
SAMPLE_PLACES = 200_000     # deciles of more places than this are those of a hashed sample of this many
CONTEXT = 5                 # tokens shown either side of a query and of a key
MAX_POINTS = 20_000         # qk_over: query points + key points at most
PRIME = 2 ** 31 - 1         # the place hash works modulo this, so every product fits in int64


# ---- the places of one head ----

@dataclass
class Example:
    """One place: in text `text`, query position `query` puts `weight` on key position `key`. The ids around
    each (CONTEXT tokens either side, cut at the text's ends) are for display: query_ids are the text's
    positions query_from.., key_ids its positions key_from.."""
    text: int
    query: int
    key: int
    weight: float
    query_from: int
    query_ids: Tensor
    key_from: int
    key_ids: Tensor


@dataclass
class HeadExamples:
    """top: the k places of largest weight over the corpus, largest first (ties: lower text, query, key first).
    deciles[d] (d = 0 lowest .. 9 highest): a sample of the places whose weight ranks in the d-th tenth, largest
    first. edges [11]: the weights at the decile boundaries (edges[d] is decile d's smallest, edges[10] the
    largest). places: the places counted (real query and key, a key the query may see, none of `skip`);
    sampled: how many the deciles were formed from (all of them, or a SAMPLE_PLACES hashed sample)."""
    layer: int
    head: int
    skip: tuple[str, ...]
    top: list[Example]
    deciles: list[list[Example]]
    edges: Tensor
    places: int
    sampled: int
    n: int                      # texts read
    note: str = ""


def place_hash(text: Tensor, query: Tensor, key: Tensor) -> Tensor:
    """A fixed pseudo-random number in 0..2³¹−2 for each place (int64 tensors of one shape): a multiplicative
    hash absorbing text, query and key in turn, so a place's number never depends on the batch it came in."""
    h = torch.full_like(text, 0x2545F491)
    for part in (text, query, key):
        h = ((h ^ part) * 1103515245 + 12345) % PRIME
        h = h ^ (h >> 16)
    return h


class HeadPlaces(Observer):
    """The weights of one head of one layer at the places of a padded batch that count, taken a block of query
    rows at a time (the [B, rows, width] block of that head only): rows, queries, keys [P] and weights [P]."""

    rows_per_block = 256

    def __init__(self, layer: int, head: int, kind: Kind, real: Tensor, causal: bool, window: int | None,
                 skip: tuple[str, ...]):
        self.layer, self.head, self.kind, self.real = layer, head, kind, real.cpu()     # real [B, T]
        self.causal, self.window, self.skip = causal, window, skip
        self.found: list[tuple[Tensor, ...]] = []

    def wants(self, kind: Kind, layer: int) -> bool:
        return kind == self.kind and layer == self.layer

    def __call__(self, kind: Kind, layer: int, probs: Tensor, start: int = 0, n: int | None = None,
                 first_key: int = 0) -> None:
        block = probs[:, self.head].float().cpu()                               # [B, rows, width]
        rows, width = block.shape[1:]
        q, k = torch.arange(start, start + rows), torch.arange(first_key, first_key + width)   # [rows], [width]
        counted = self.real[:, start:start + rows, None] & self.real[:, None, first_key:first_key + width]
        allowed = position_mask(q, k, self.causal, self.window)                 # [rows, width]
        q, k = q[:, None], k[None, :]
        if "sink" in self.skip:
            allowed &= k != 0
        if "self" in self.skip:
            allowed &= k != q
        b, qi, ki = (counted & allowed).nonzero(as_tuple=True)
        self.found.append((b, qi + start, ki + first_key, block[b, qi, ki]))

    def places(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        parts = list(zip(*self.found)) or [[torch.empty(0, dtype=torch.long)]] * 3 + [[torch.empty(0)]]
        return tuple(torch.cat(p) for p in parts)


class Places:
    """Places (text, query, key, weight, hash), each a 1-D tensor, kept in a fixed order."""

    def __init__(self, text=None, query=None, key=None, weight=None, hashed=None):
        empty = torch.empty(0, dtype=torch.long)
        self.text, self.query, self.key = (empty if t is None else t for t in (text, query, key))
        self.weight = torch.empty(0) if weight is None else weight
        self.hashed = empty if hashed is None else hashed

    def __len__(self) -> int:
        return len(self.weight)

    def joined(self, other: Places) -> Places:
        return Places(*(torch.cat([a, b]) for a, b in zip(self.parts(), other.parts())))

    def parts(self) -> tuple[Tensor, ...]:
        return self.text, self.query, self.key, self.weight, self.hashed

    def picked(self, index: Tensor) -> Places:
        return Places(*(t[index] for t in self.parts()))

    def by_place(self) -> Tensor:
        """The order by (text, query, key)."""
        order = torch.argsort(self.key, stable=True)
        order = order[torch.argsort(self.query[order], stable=True)]
        return order[torch.argsort(self.text[order], stable=True)]

    def largest(self, k: int) -> Places:
        """The k of largest weight, largest first; among equal weights the lower (text, query, key) first."""
        order = self.by_place()
        order = order[torch.argsort(self.weight[order], descending=True, stable=True)]
        return self.picked(order[:k])

    def by_hash(self) -> Tensor:
        """The order by hash, ties by (text, query, key): the order a sample is drawn in."""
        order = self.by_place()
        return order[torch.argsort(self.hashed[order], stable=True)]


def top_examples(model, texts: Sequence[Tensor], layer: int, head: int, k: int = 10, deciles: bool = True,
                 skip: Sequence[str] = SKIPS, per_decile: int = PER_DECILE, context: int = CONTEXT,
                 sample_places: int = SAMPLE_PLACES, batch_tokens: int = BATCH_TOKENS,
                 progress: Progress | None = None, stop: Stop | None = None) -> HeadExamples:
    """The places of the corpus where head `head` of layer `layer` (of model.attention_stack()) puts its most
    weight, and a sample of places from each decile of its weights.

    A place is a (text, query position, key position) of real tokens where the query may see the key (key ≤
    query in a causal stack; within a sliding layer's window), less those in `skip`: "sink" leaves out key
    position 0 (the first token, where many heads park their weight: a place no reader wants listed ten
    times), "self" leaves out the query's own position. Both by default; skip=() counts every place.

    Top: the k largest weights over every place (exact). Deciles: the places sorted by weight (ties by hash),
    decile d holds ranks ⌊d·M/10⌋ .. ⌊(d+1)·M/10⌋ − 1 of the M places; from each, the per_decile places of
    smallest place_hash are shown. The hash depends only on (text, query, key), so the sample is the same
    however the texts are batched. Above sample_places places, M is the sample_places places of smallest hash
    (a uniform sample that memory bounds), and the note says so. stop() is asked between batches; a stopped
    job reports the texts it read."""
    texts = check_texts(model, texts)
    layer, head = model.check_head(layer, head)
    stack, kind = model.attention_stack()
    skip = tuple(skip)
    if set(skip) - set(SKIPS):
        raise ValueError(f"skip takes {', '.join(map(repr, SKIPS))} (or none), got {list(skip)}")
    if k < 0 or per_decile < 0 or context < 0 or sample_places < 1:
        raise ValueError(f"k, per_decile and context must be ≥ 0 and sample_places ≥ 1, got k={k}, "
                         f"per_decile={per_decile}, context={context}, sample_places={sample_places}")
    cfg = stack.cfg
    window = cfg.layer_window(layer)
    job = Job(len(texts), "text", progress, stop)
    top, sample, counted = Places(), Places(), 0

    def measure(batch: list[int]) -> None:
        nonlocal top, sample, counted
        ids, mask = padded([texts[i] for i in batch], pad_id(model))
        observer = HeadPlaces(layer, head, kind, mask, cfg.causal, window, skip)
        with torch.inference_mode():
            model.run_stack(stack, ids.to(model.device), None if mask.all() else mask.to(model.device), kind=kind,
                            causal=cfg.causal, observer=observer, n_layers=layer + 1)
        rows, query, key, weight = observer.places()
        text = torch.tensor(batch, dtype=torch.long)[rows]
        found = Places(text, query, key, weight, place_hash(text, query, key))
        counted += len(found)
        top = top.joined(found).largest(k)
        if deciles:
            sample = sample.joined(found)
            sample = sample.picked(sample.by_hash()[:sample_places])
        for row, i in enumerate(batch):
            here = weight[rows == row]
            job.finish(i, float(here.max()) if len(here) else None)

    job.run(length_batches([len(t) for t in texts], batch_tokens), measure)
    notes = [job.note()] if job.note() else []
    if counted == 0:
        notes.append(f"no place counted: every text is too short for a place outside skip={list(skip)}")
    if deciles and counted > len(sample):
        notes.append(f"the deciles are of a hashed sample of {len(sample)} of the {counted} places")
    groups, edges = decile_samples(sample, per_decile) if deciles else ([], torch.empty(0))
    return HeadExamples(layer, head, skip, examples(texts, top, context),
                        [examples(texts, g, context) for g in groups], edges, counted, len(sample),
                        len(job.values), "; ".join(part for part in notes if part))


def decile_samples(places: Places, per_decile: int) -> tuple[list[Places], Tensor]:
    """Each decile's per_decile places of smallest hash (largest weight first), and the 11 edge weights."""
    m = len(places)
    if m == 0:
        return [Places() for _ in range(DECILES)], torch.full((DECILES + 1,), float("nan"))
    order = places.by_hash()
    ranked = order[torch.argsort(places.weight[order], stable=True)]         # by weight, ties by hash
    bounds = [d * m // DECILES for d in range(DECILES + 1)]
    edges = places.weight[ranked[[min(b, m - 1) for b in bounds]]]
    groups = []
    for d in range(DECILES):
        members = places.picked(ranked[bounds[d]:bounds[d + 1]])
        chosen = members.picked(members.by_hash()[:per_decile])
        groups.append(chosen.largest(len(chosen)))
    return groups, edges


def examples(texts: list[Tensor], places: Places, context: int) -> list[Example]:
    """The places as Examples, with the ids of `context` tokens either side of each query and key."""
    shown = []
    for i, q, k, weight in zip(places.text.tolist(), places.query.tolist(), places.key.tolist(),
                               places.weight.tolist()):
        q0, k0 = max(0, q - context), max(0, k - context)
        shown.append(Example(i, q, k, weight, q0, texts[i][q0:q + context + 1].clone(), k0,
                             texts[i][k0:k + context + 1].clone()))
    return shown


# ---- the joint query/key plane ----

@dataclass
class QKPlane:
    """Queries and keys of one head over a corpus in the one query/key plane (core/plane.py joint_plane,
    AttentionViz's translation then a joint PCA), the plane the single-text view (anatomy.qk_geometry) draws too.

    queries, keys [N, d_head]: the vectors whose dot product × scale is the head's score (after RoPE where the
    family has it; before any soft-cap or score bias), for the N tokens kept, each token one query and one key
    (the key head that query head reads under grouped-query attention). points [2N, 2]: the N queries then the
    N keys in the plane of the first two principal components of the union, after the keys are translated by
    shift = mean(queries) − mean(keys) so the two clouds share a mean (a constant added to every key changes each
    query's scores by one constant, which softmax ignores) and the union is centred; components [2, d_head] and
    explained [2] (each component's share of the variance) are the plane's."""
    layer: int
    head: int
    queries: Tensor
    keys: Tensor
    points: Tensor
    is_key: Tensor              # [2N] bool
    text: Tensor                # [2N] the text index of each point
    position: Tensor            # [2N] its position in that text
    token: Tensor               # [2N] its token id
    shift: Tensor               # [d_head]
    components: Tensor          # [2, d_head]
    explained: Tensor           # [2]
    scale: float                # the score's factor on q·k
    tokens: int                 # real tokens in the texts read (the points are of `len(queries)` of them)
    n: int                      # texts read
    note: str = ""


def chosen_tokens(lengths: list[int], max_tokens: int) -> list[Tensor]:
    """The positions kept in each text: every token when the corpus has at most max_tokens, else max_tokens
    spread evenly through the corpus in input order (token ⌊i·total/max_tokens⌋ for i = 0..max_tokens−1)."""
    total = sum(lengths)
    kept = torch.arange(total) if total <= max_tokens else (torch.arange(max_tokens) * total) // max_tokens
    starts = torch.tensor([0] + lengths).cumsum(0)
    return [kept[(kept >= starts[i]) & (kept < starts[i + 1])] - starts[i] for i in range(len(lengths))]


def qk_over(model, texts: Sequence[Tensor], layer: int, head: int, max_points: int = MAX_POINTS,
            batch_tokens: int = BATCH_TOKENS, progress: Progress | None = None, stop: Stop | None = None) -> QKPlane:
    """The joint query/key plane of one head over a corpus (see QKPlane). Each kept token gives two points,
    its query and its key; above max_points // 2 tokens the kept ones are spread evenly through the corpus
    (chosen_tokens), the same whatever the batching, and the note says how many of how many."""
    texts = check_texts(model, texts)
    layer, head = model.check_head(layer, head)
    stack, kind = model.attention_stack()
    if max_points < 4:
        raise ValueError(f"max_points must be at least 4 (two tokens, a query and a key each), got {max_points}")
    cfg = stack.cfg
    kv_head = cfg.kv_head(head)
    keep = chosen_tokens([len(t) for t in texts], max_points // 2)
    names = (Probe.full_name(kind, "q"), Probe.full_name(kind, "k"))
    job = Job(len(texts), "text", progress, stop)

    def measure(batch: list[int]) -> None:
        ids, mask = padded([texts[i] for i in batch], pad_id(model))
        probe = Probe(model.config, record=names, layers=[layer])
        with torch.inference_mode():
            model.run_stack(stack, ids.to(model.device), None if mask.all() else mask.to(model.device), kind=kind,
                            causal=cfg.causal, probe=probe, n_layers=layer + 1)
        q = probe.records[names[0]][layer][:, :, head].float().cpu()          # [B, T, d_head]
        k = probe.records[names[1]][layer][:, :, kv_head].float().cpu()
        for row, i in enumerate(batch):
            job.finish(i, (q[row, keep[i]], k[row, keep[i]]))

    job.run(length_batches([len(t) for t in texts], batch_tokens), measure)
    done = sorted(job.values)
    queries = torch.cat([job.values[i][0] for i in done]) if done else torch.empty(0, cfg.head_dim)
    keys = torch.cat([job.values[i][1] for i in done]) if done else torch.empty(0, cfg.head_dim)
    text = torch.cat([torch.full((len(keep[i]),), i) for i in done]) if done else torch.empty(0, dtype=torch.long)
    position = torch.cat([keep[i] for i in done]) if done else torch.empty(0, dtype=torch.long)
    token = torch.cat([texts[i][keep[i]] for i in done]) if done else torch.empty(0, dtype=torch.long)
    plane = joint_plane(queries, keys)
    read = sum(len(texts[i]) for i in done)
    notes = [job.note()] if job.note() else []
    if len(queries) < read:
        notes.append(f"{len(queries)} of the {read} tokens read, spread evenly through the corpus "
                     f"(max_points={max_points}: a query and a key each)")
    return QKPlane(layer, head, queries, keys, plane.points, torch.arange(2 * len(queries)) >= len(queries),
                   text.repeat(2), position.repeat(2), token.repeat(2), plane.shift, plane.components,
                   plane.explained, cfg.score_scale, read, len(done), "; ".join(notes))

