"""Each head's ablation over a corpus (core/corpus/summaries.py ablation_over: the mean increase of a text's
next-token loss when that head alone is removed, Over [L, H]) as the Across texts tab runs it: in a worker thread
(ui.services.jobs.stream_job), saved item by item for the page (core/corpus/saved.py run_over "ablation"), with
the summary of the texts finished so far. A sweep runs the model once per head and text, so only the first
ABLATION_TEXTS texts are swept; the core's note says how many of how many."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import torch

from core.corpus import saved, summaries
from core.corpus.summaries import ABLATION_TEXTS, summarise
from ui.services.checks import UserError
from ui.services.corpus.over import Corpus, OverUpdate, check_model, partial_note, refusals_in_words
from ui.services.corpus.pages import Saving, saved_words, unsaved
from ui.services.heads import check_ablation, lm_head_reason
from ui.services.jobs import stream_job

ADVICE = "Choose a model with an LM head (e.g. smollm2-135m-instruct)."


def check_ablation_model(model) -> None:
    """An encoder-decoder is refused as by every corpus job; a model without an LM head has no loss to change.
    (An encoder with its masked-LM head is swept on the loss it predicts its own tokens with, as the Heads tab's
    sweep is.)"""
    check_model(model, "heads")
    reason = lm_head_reason(model, "Ablation")
    if reason:
        raise UserError(f"{reason} {ADVICE}")


def partial_ablation(values: dict[int, torch.Tensor], total: int) -> summaries.Over | None:
    """The core's summarise over the [L, H] of the texts swept so far, in input order."""
    if not values:
        return None
    done = sorted(values)
    return summarise(torch.stack([values[i] for i in done]), partial_note(len(done), total, "text"), done)


def stream_ablation(model, corpus: Corpus, kind: str, saving: Saving, model_name: str) -> Iterator[OverUpdate]:
    """ablation_over of `kind` ("zero" or "mean") over the corpus: an update as each text's sweep finishes, with
    the summary of the texts swept so far, then the core's result (finished) and what saving did. Closing the
    iterator stops the sweep within one batch of heads (the core's stop), its finished texts kept on disk, so the
    same job resumes from them."""
    kind = check_ablation(kind)
    total = min(len(corpus.items), ABLATION_TEXTS)
    values: dict[int, torch.Tensor] = {}
    halt = threading.Event()

    def work(report):
        hooks = dict(progress=report, stop=halt.is_set, each=values.__setitem__)
        with refusals_in_words():
            if saving.root is not None:
                try:
                    run = saved.run_over("ablation", model, corpus.items, saving.root, model_name,
                                         max_bytes=saving.max_bytes, room=saving.room, wrote=saving.wrote,
                                         ablation=kind, **hooks)
                    return run.result, run, saving
                except saved.NoRoom as error:   # past a cap: measured all the same, and not saved
                    return summaries.ablation_over(model, corpus.items, kind, **hooks), None, unsaved(error)
            return summaries.ablation_over(model, corpus.items, kind, **hooks), None, saving

    try:
        for update in stream_job(work, total, "corpus-ablation"):
            if update.finished:
                result, run, used = update.result
                folder = run.folder if run is not None and run.finished else None
                yield OverUpdate(update.done, total, result, update.seconds, True, saved_words(run, used), folder)
                continue
            finished = dict(values)   # the worker may have swept more texts since this report: count those
            yield OverUpdate(max(update.done, len(finished)), total, partial_ablation(finished, total),
                             update.seconds)
    finally:
        halt.set()   # a page that stopped: the sweep ends at its next batch of heads
