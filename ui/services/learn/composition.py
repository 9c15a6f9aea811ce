"""The course's lesson on composition: why a head attends where it does, traced to the earlier heads that wrote its
keys. Measured twice: on the Lab's two-layer attention-only decoder trained to need an induction circuit (the saved
run, ui/services/lab/induction.py: ground truth by construction), and on the loaded model, whose strongest
induction head's keys are traced over induction texts (ui/services/corpus/composition.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.analysis import circuits, heads as head_scores
from ui.services.checks import UserError
from ui.services.corpus.composition import composition
from ui.services.corpus.over import induction_length
from ui.services.lab import induction
from ui.services.learn import Lesson, Measured, ProgressFn, Question

PREVIOUS, OTHER, EMBEDDINGS = ("the first layer's previous-token head", "another head of the first layer",
                               "the token embeddings themselves")
REAL_TEXTS = 4              # induction texts the loaded model's head is traced over (one pass and 16 pairs each)
TRY_SOURCE = "a7Qz0kP3mX9tB2wR5yL8"   # 20 letters and digits: the saved run copies it, and its heads show


@dataclass
class Traced:
    """One head's keys traced: the head, its named parts (largest mean share first, "rest" last) with intervals."""
    title: str
    labels: list[str]
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


def lab_answer(found: induction.Traced) -> str:
    """Which choice writes most of the induction head's keys: the component of largest |share| (the bars' first),
    read by its typed key; the previous-token head only where the one rule found the circuit."""
    top = found.traced.parts[found.traced.labels.index(found.labels[0])]
    if found.finding.found and top == found.finding.source:
        return PREVIOUS
    return OTHER if top.is_head else EMBEDDINGS


def real_model(model, progress: ProgressFn | None) -> tuple[Traced | None, str]:
    """The loaded model's strongest induction head (layer ≥ 1) traced over REAL_TEXTS induction texts, and the
    finding in words (core.analysis.circuits decides it); (None, why) where the model has no induction probe (an
    encoder) or one layer."""
    if model.config.n_layers < 2:
        return None, "The loaded model has one layer: no earlier head can write its keys."
    try:
        probe = head_scores.induction(model, induction_length(model))
    except ValueError as error:
        return None, f"On the loaded model the second half is not measured: {error}."
    target, score = circuits.induction_head(probe.scores)
    if progress is not None:
        progress(0.5, f"what feeds {target}'s keys")
    found = composition(model, target.layer, target.head, "key", REAL_TEXTS)
    previous = head_scores.pattern_scores(model, probe.ids)["previous_token"]                # [L, H]
    finding = circuits.induction_circuit(previous, probe.scores, found.traced)
    words = (f"On the loaded model, the strongest induction head is **{target}** (induction score {score:.2f}); "
             f"over {found.n} induction texts its keys are fed most by **{found.labels[0]}** (share "
             f"{found.mean[0]:+.2f}). By the circuit's rule (induction score at least {circuits.INDUCTION_MIN:g}, "
             f"the earlier head feeding its keys most a previous-token head at least {circuits.PREVIOUS_MIN:g}): "
             f"{finding.words()}.")
    return Traced(f"{target} of the loaded model", found.labels, found.mean, found.low, found.high), words


def measure_composition(model, progress: ProgressFn | None = None) -> Measured:
    if progress is not None:
        progress(0.1, "the Lab's induction run")
    found = induction.trace_saved()
    if found is None:
        reason = "The Lab's saved induction run is missing from this copy of the app."
        return Measured(answer="not measured here", answer_text=reason, why=reason, alt=reason,
                        link={"tab": "lab"}, note=reason)
    lab = Traced(f"L1 H{found.induction_head} of the Lab's model", found.labels, found.mean, found.low, found.high)
    answer_text = (f"On the Lab's model, {found.finding.words()}. L1 H{found.induction_head}'s keys are fed most by "
                   f"**{found.labels[0]}** (share {found.mean[0]:+.2f} of the relative score, 95 % interval "
                   f"[{found.low[0]:.2f}, {found.high[0]:.2f}] over {found.n} texts).")
    try:
        real, words = real_model(model, progress)
    except UserError as error:
        real, words = None, f"On the loaded model the second half is not measured: {error}"
    why = ("Olsson et al. (2022) describe this circuit. An induction head must find the key whose *previous* token equals the query's token, but a key vector "
           "is written from its own position. Only an earlier head can carry the previous token into it: a "
           "previous-token head writes it into the residual stream, and the induction head's W_K reads it there "
           "(K-composition, Elhage et al. 2021). Splitting the score q·k over what wrote q and what wrote k, with "
           "every norm frozen, shows this head by head; the weights alone (Elhage et al.'s composition scores) say "
           "only what the heads *could* compose with: on the Lab's model they rank "
           f"L0 H{int(np.argmax(found.weights[0]))} first. The Lab's run is one seed: other seeds of the same "
           "config may learn the task without a clean previous-token head, which the same split shows (the Lab's "
           "*Train one like it* trains another seed and traces it). " + words)
    if progress is not None:
        progress(1.0, "done")
    return Measured(
        answer=lab_answer(found), answer_text=answer_text, why=why,
        alt=(f"What feeds the keys of {lab.title}" + (f" and of {real.title}" if real else "") +
             f": on the Lab's model {found.labels[0]} first ({found.mean[0]:+.2f})."),
        values={"panels": [lab] + ([real] if real else [])},
        link={"tab": "lab", "settings": {"lab_run": induction.RUN, "source": TRY_SOURCE}, "show": "lab-decoder"})


LESSONS: tuple[Lesson, ...] = (
    Lesson(
        name="composition",
        title="Composition: why a head attends where it does",
        text=(
            "A head attends where its query's score with a key is high (**eq. 2.1**), and both vectors are read "
            "from the residual stream, which every earlier head and MLP has written into. So the question *why "
            "does this head look there?* has an exact answer: split q·k into pairs (a part that wrote the query, a "
            "part that wrote the key), every norm frozen at its value on the text. Softmax compares a query's "
            "scores with each other, so the split that says why one key **wins** is of the score minus the "
            "query's attention-weighted mean score.\n\n"
            "The cleanest case is the **induction head** (Olsson et al.): on a repeated text it attends "
            "from a token to the token *after* that token's earlier copy. The Lab trained a two-layer decoder with "
            "attention alone to copy random letters and digits, which it can only do by looking back; its "
            "second layer's induction head's keys are traced here, then the loaded model's strongest induction head's. Before "
            "Reveal the bars have no names."),
        question=Question(prompt="On the Lab's two-layer model, which component writes most of what the second "
                                 "layer's induction head's keys are matched on?", choices=(PREVIOUS, OTHER, EMBEDDINGS)),
        measure=measure_composition,
    ),
)
