"""One head's top examples over a corpus (core/corpus/heads.py top_examples) as the page lists them: each place
with the text around its query and key token, and the text a link carries to open it in the Attention tab at that
head (the view writes the link: ui.links);
run in a worker thread (ui.services.jobs.stream_job) so the page can stop it, or, on the Ray backend, in one call
of the model's deployment (chunked.ChunkRunner.examples) with the texts' token ids."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from core.corpus import heads as head_places
from core.corpus.texts import ids_of
from ui.services.checks import check_head, check_range
from ui.services.corpus.chunked import CHUNKS, ChunkRunner, waited
from ui.services.corpus.over import Corpus, refusals_in_words
from ui.services.jobs import stream_job
from ui.services.text import token_pieces

MAX_EXAMPLES = 50        # top places one job lists
PER_DECILE = 2           # places shown from each decile of the head's weights


@dataclass
class Place:
    """One place as the page lists it: the texts around the query and the key, the two tokens apart, and the text
    a link carries to open it in the Attention tab at this head."""
    label: str               # "1", "decile 10"
    text: int
    query: int
    key: int
    weight: float
    query_parts: tuple[str, str, str]     # before, the query token, after
    key_parts: tuple[str, str, str]
    link_text: str | None    # the text as the Attention tab reads it back into these very tokens, or None: `why`
    why: str = ""            # why there is no link: the text does not read back as its tokens


NOT_READ_BACK = "no link: as text, these tokens read back as other tokens (random tokens do)"


def check_examples(model, layer, head, k) -> tuple[int, int, int]:
    layer, head = check_head(model, layer, head)
    return layer, head, check_range("Examples (k)", k, 1, MAX_EXAMPLES)


def shown_piece(piece: str) -> str:
    """A token's text as a table shows it: spaces kept, a newline as ↵, a tab as ⇥, other unprintable characters
    as ·, and an empty piece as ∅, so every token has a visible place."""
    piece = piece.replace("\n", "↵").replace("\t", "⇥")
    return "".join(ch if ch.isprintable() else "·" for ch in piece) or "∅"


def parts_of(model, ids, start: int, at: int) -> tuple[str, str, str]:
    pieces = [shown_piece(piece) for piece in token_pieces(model, ids)]
    i = at - start
    return "".join(pieces[:i]), pieces[i], "".join(pieces[i + 1:])


def linked_text(model, ids: list[int]) -> tuple[str | None, str]:
    """(the text a link carries, "") when the Attention tab, encoding it as it encodes any text, reads back these
    very tokens, so the positions listed are its positions; else (None, why not)."""
    text = model.tokenizer.decode(ids, skip_special_tokens=True)
    if not text.strip() or ids_of(model.tokenizer, text) != ids:
        return None, NOT_READ_BACK
    return text, ""


def place_of(model, corpus: Corpus, example, label: str, texts: dict[int, tuple[str | None, str]]) -> Place:
    """texts: linked_text of each text index met so far (each text is checked once)."""
    if example.text not in texts:
        texts[example.text] = linked_text(model, corpus.items[example.text].tolist())
    text, why = texts[example.text]
    return Place(label, example.text, example.query, example.key, example.weight,
                 parts_of(model, example.query_ids, example.query_from, example.query),
                 parts_of(model, example.key_ids, example.key_from, example.key), text, why)


def run_examples(model, corpus: Corpus, find: Callable, report) -> tuple[list[Place], list[Place], object]:
    """(top places, decile samples highest first, the core's HeadExamples) of one head over the corpus, the
    HeadExamples from find(report) (found_here's or found_on's)."""
    with refusals_in_words():
        found = find(report)
    texts: dict[int, tuple[str | None, str]] = {}
    top = [place_of(model, corpus, e, str(i + 1), texts) for i, e in enumerate(found.top)]
    deciles = [place_of(model, corpus, e, f"decile {d + 1}", texts)
               for d in reversed(range(len(found.deciles))) for e in found.deciles[d]]
    return top, deciles, found


def found_here(model, corpus: Corpus, layer: int, head: int, k: int) -> Callable:
    return lambda report: head_places.top_examples(model, corpus.items, layer, head, k, per_decile=PER_DECILE,
                                                   progress=report)


def found_on(runner: ChunkRunner, corpus: Corpus, layer: int, head: int, k: int) -> Callable:
    """top_examples in one call where the runner's model is, sent the texts' token ids (read and encoded here, so
    no node needs the uploaded file). One call, not chunks: the exact top k and the deciles are of every place of
    the corpus at once. Asked every chunked.WAIT_S whether the page stopped, which cancels the call."""
    return lambda report: waited(runner.examples(list(corpus.items), layer, head, k, PER_DECILE), report,
                                 len(corpus.items))


def stream_examples(model, corpus: Corpus, layer: int, head: int, k: int, max_seconds: float | None = None):
    """run_examples in a worker thread, as ui.services.jobs.stream_job updates (closing it stops the job); the
    measuring on the runner of chunked.chunks_on where one is set; past max_seconds it stops with a message."""
    runner = CHUNKS.get()
    find = found_here(model, corpus, layer, head, k) if runner is None else found_on(runner, corpus, layer, head, k)
    return stream_job(lambda report: run_examples(model, corpus, find, report),
                      len(corpus.items), "corpus-examples", max_seconds=max_seconds)
