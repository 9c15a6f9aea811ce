"""One head's joint query/key plane over a corpus (core/corpus/heads.py qk_over, the AttentionViz picture): its
queries and keys projected together to 2-D in the one plane the Inside tab draws too (PLANE_DEFINITION), each
point with its token as the page shows it, run in a worker thread (ui.services.jobs.stream_job) so the page can
stop it, or, on the Ray backend, in one call of the model's deployment (chunked.ChunkRunner.qk) with the texts'
token ids."""

from __future__ import annotations

from dataclasses import dataclass

from core.plane import DEFINITION as PLANE_DEFINITION
from core.corpus import heads as head_places
from core.corpus.heads import QKPlane
from ui.services.checks import check_head
from ui.services.corpus.chunked import CHUNKS, ChunkRunner, waited
from ui.services.corpus.over import Corpus, check_model, refusals_in_words
from ui.services.jobs import stream_job
from ui.services.text import token_texts

PLANE_POINTS = 6_000     # queries + keys one figure draws (3,000 tokens): an SVG scatter stays quick to hover


@dataclass
class PlaneShown:
    """The core's plane and what the page needs to say of it."""
    plane: QKPlane
    labels: list[str]        # [2N] each point's token as it reads on a page
    rope: bool               # q and k are read after the rotary embedding
    qk_norm: bool            # and after the RMSNorm on each head's q and k


def check_plane(model, layer, head) -> tuple[int, int]:
    """A model the corpus jobs read, and a layer and head of it."""
    check_model(model, "heads")
    return check_head(model, layer, head)


def token_labels(model, tokens) -> list[str]:
    """Each point's token as a page shows it, each distinct id decoded once."""
    ids = [int(i) for i in tokens]
    distinct = sorted(set(ids))
    names = dict(zip(distinct, token_texts(model, distinct)))
    return [names[i] for i in ids]


def run_plane(model, corpus: Corpus, layer: int, head: int, report=None, runner: ChunkRunner | None = None
              ) -> PlaneShown:
    """qk_over of the corpus at (layer, head), at most PLANE_POINTS points (the core spreads the kept tokens
    evenly through the corpus and says how many of how many): here, or, given a runner, in one call there sent
    the texts' token ids (read and encoded here, so no node needs the uploaded file; one call, not chunks: the
    plane's PCA and its kept tokens are of the whole corpus at once)."""
    with refusals_in_words():
        if runner is None:
            plane = head_places.qk_over(model, corpus.items, layer, head, max_points=PLANE_POINTS, progress=report)
        else:
            plane = waited(runner.qk(list(corpus.items), layer, head, PLANE_POINTS), report or (lambda *_: None),
                           len(corpus.items))
    cfg = model.config
    return PlaneShown(plane, token_labels(model, plane.token), cfg.positional == "rope", bool(cfg.qk_norm))


def stream_plane(model, corpus: Corpus, layer: int, head: int, max_seconds: float | None = None):
    """run_plane in a worker thread, as ui.services.jobs.stream_job updates (closing it stops the job); the
    measuring on the runner of chunked.chunks_on where one is set (read here: the worker thread has no context);
    past max_seconds it stops with a message."""
    runner = CHUNKS.get()
    return stream_job(lambda report: run_plane(model, corpus, layer, head, report, runner), len(corpus.items),
                      "corpus-qk", max_seconds=max_seconds)
