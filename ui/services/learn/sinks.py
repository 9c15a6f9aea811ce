"""The course's lesson on long texts: attention sinks (each head's mean attention on the text's first token, Gu et
al.'s Sink^ε, through ui/services/sinks.py on the loaded model), and what they mean for a window of keys and the
KV cache, with the shipped StreamingLLM run (scripts/streaming_experiment.py, assets/measured/streaming.json)
read back, never typed."""

from __future__ import annotations

import json
from pathlib import Path

from ui.services.checks import UserError
from ui.services.learn import Lesson, Measured, ProgressFn, Question, number
from ui.services.sinks import EPSILON, sink_map

STREAMING_MEASURED = Path(__file__).resolve().parents[3] / "assets" / "measured" / "streaming.json"
STREAMING_MODEL = "smollm2-135m-instruct"   # the shipped run's model whose numbers the reason quotes
SINK_SAMPLE = ("The ferry left the island before dawn. On the deck a boy counted the gulls that followed it, lost "
               "count when the fog came down, and started again from the beginning once the sun broke through and "
               "the harbour walls came into sight.")


def not_measured(reason: str) -> Measured:
    return Measured(answer="not measured on this model", answer_text=reason,
                    why="A sink is read from a model's own attention over a text; this one cannot be read here.",
                    alt=f"Nothing to draw: {reason}", link={"tab": "heads"}, note=reason)


def shipped_window_run(path: Path = STREAMING_MEASURED) -> dict | None:
    """From the shipped StreamingLLM run, for STREAMING_MODEL: full attention, and its narrowest window alone and
    with one sink (text positions): {"tokens", "window", "full", "alone", "one_sink", "command", "date"}; None
    where the file or those runs are missing."""
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
        result = next(r for r in run["results"] if r["model"] == STREAMING_MODEL)
        runs = [r for r in result["runs"] if r["positions"] == "text"]
        window = min(r["window"] for r in runs if r["window"] is not None)
        pick = {(r["window"], r["sinks"]): r["perplexity"] for r in runs}
        return {"tokens": result["tokens"], "window": window, "full": pick[(None, 0)], "alone": pick[(window, 0)],
                "one_sink": pick[(window, 1)], "command": run["command"], "date": run["date"]}
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return None


def window_words(shipped: dict | None) -> str:
    if shipped is None:
        return "The StreamingLLM run on a long text is not shipped with this copy."
    return (f"Measured on SmolLM2 over {shipped['tokens']:,} tokens of Macbeth (this project's run of "
            f"{shipped['date']}): perplexity {shipped['full']:.1f} with full attention, {shipped['alone']:.1f} "
            f"through a window of the last {shipped['window']} keys, and {shipped['one_sink']:.1f} with the same "
            "window plus the first token kept.")


def measure_sinks(model, progress: ProgressFn | None = None) -> Measured:
    """Gu et al.'s share of sink heads on SINK_SAMPLE, with every head's mean attention on the first token."""
    if progress is not None:
        progress(0.1, "one pass with every head's attention")
    try:
        result = sink_map(model, SINK_SAMPLE)
    except UserError as error:
        return not_measured(str(error))
    above, heads = len(result.above), result.first.size
    share = 100 * result.share
    where = "[CLS]" if not result.causal and result.special[0] else "the first token"
    queries = (f"every query after it (queries 1–{len(result.tokens.ids) - 1})" if result.causal
               else f"all {len(result.tokens.ids)} queries (an encoder: every query sees every key)")
    answer_text = (f"{above} of {heads} heads ({number(share)} %) put more than ε = {result.epsilon:g} of their "
                   f"attention on {where}, on average over {queries} of this {len(result.tokens.ids)}-token text."
                   + (f" {result.tokens.note}" if result.tokens.note else ""))
    why = ("Each row of weights must sum to 1, so a head with nothing useful to read still puts its weight "
           "somewhere; trained models learn to park it on a token every query can see, the first one (Xiao et al., "
           "ICLR 2024), whatever that token says. Gu et al. (ICLR 2025) found such heads in every position scheme, "
           "92 % of Llama-2-7B's. That is why a window of keys alone fails once a text passes it: the window drops "
           "the parking place, and the weights land on tokens that mean something. Keeping the first few tokens "
           "beside the window, as StreamingLLM's rolling KV cache does, brings most of the loss back down at a fixed "
           "memory. "
           + window_words(shipped_window_run()))
    if progress is not None:
        progress(1.0, "done")
    return Measured(
        answer=share, answer_text=answer_text, why=why,
        alt=(f"Each head's mean attention on {where} over this text; {above} of {heads} heads "
             f"({number(share)} %) above ε = {result.epsilon:g}."),
        values={"first": result.first, "epsilon": result.epsilon, "where": where, "share": share,
                "above": result.above, "tokens": len(result.tokens.ids)},
        link={"tab": "heads", "text": SINK_SAMPLE, "show": "heads-sinks-map"})


LESSONS: tuple[Lesson, ...] = (
    Lesson(
        name="sinks",
        title="Long texts: attention sinks, and a window of keys",
        text=(
            "A long text makes the KV cache long (**eq. 6.9**) and every query's row of scores long. One way out "
            "is a **window**: each query reads only the last keys, so the cache can drop the oldest ones. It "
            "works only if no head depends on a token the window has dropped.\n\n"
            "Many heads of trained models do: they put much of their weight on the text's first token, whatever "
            "it says. Such a head is an **attention sink**: Gu et al. call a head a sink head when its mean "
            "attention on the first token, over a text's queries, exceeds a threshold ε, and report the share of "
            "such heads. Here that share is measured on the loaded model, over one short text."),
        question=Question(prompt=f"What share of this model's heads put more than ε = {EPSILON:g} of their "
                                 "attention on the first token, on average over the text?", unit="%"),
        measure=measure_sinks,
        text_sample=SINK_SAMPLE,
    ),
)
