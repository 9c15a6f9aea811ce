"""The induction circuit of a Lab run (core.lab.induction), as plain values for the Lab's section and the
Learn lesson on composition: the run the project ships (assets/lessons/induction, a two-layer attention-only
decoder trained on copy-62), or a session's own run of the same shape. Never imports gradio.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from core.analysis.circuits import INDUCTION_MIN, OLSSON, PREVIOUS_MIN, InductionCircuit  # noqa: F401 - the page says them
from core.analysis import MLP
from core.corpus.stats import summarise
from core.lab import induction as engine
from core.lab.train import VOCAB, LabConfig
from ui.services.checks import UserError, check_range
from ui.services.corpus.composition import top_and_rest
from ui.services.lab import saved as shipped

RUN = shipped.INDUCTION
FOLDER = shipped.SAVED_RUNS[RUN]
MIN_STEPS = 100


@dataclass
class Traced:
    run_id: str
    lab: LabConfig
    previous: np.ndarray         # [H] layer 0's previous-token scores over the probe texts
    induction: np.ndarray        # [H] layer 1's induction scores
    previous_head: int           # layer 0's head of largest previous-token score (named only where finding.found)
    induction_head: int          # layer 1's head of largest induction score, whose keys were traced
    finding: InductionCircuit    # the one rule's decision (core.analysis.circuits), with the scores it read
    traced: object               # core.analysis.qk.CompositionOver: every part of the keys, typed
    labels: list[str]            # what feeds the induction head's keys: named parts, then "rest"
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    weights: np.ndarray          # [1, H] K-composition of the induction head with each layer-0 head, weights only
    n: int
    pairs: str
    tokens: list[str]            # the first probe text
    previous_map: np.ndarray     # [T, T] the previous-token head's attention on it
    induction_map: np.ndarray    # [T, T] the induction head's


def preset(seed, steps, max_steps: int) -> LabConfig:
    """The shipped run's config with the page's seed and steps (checked)."""
    seed = check_range("Seed", seed, 0, 2**31 - 1)
    steps = check_range("Steps", steps, MIN_STEPS, max_steps)
    return replace(shipped.lab_config(FOLDER), seed=seed, steps=steps, eval_every=max(1, steps // 4))


def check_shape(run_id: str, lab: LabConfig) -> None:
    if lab.family != "llama" or lab.n_layers != 2:
        raise UserError(f"Run {run_id} is a {lab.n_layers}-layer {lab.family} model: the induction circuit is "
                        "traced on a two-layer decoder (family llama), as the saved run and 'Train one' make.")


def model_parts(keys, lab: LabConfig):
    """(shares, labels) of the parts the run's model has: an attention-only run's MLPs keep their place in the
    checkpoint with their output weights zero and frozen (core.lab.train), so each writes nothing (share 0 on every
    text) and is no part of the model the page describes."""
    keep = [i for i, part in enumerate(keys.parts) if not (lab.attention_only and part.kind == MLP)]
    over = keys.shares
    return (summarise(over.per_item[:, keep], over.note, over.items, over.left_out, bounds=over.bounds),
            [keys.labels[i] for i in keep])


def trace(model, run_id: str, lab: LabConfig) -> Traced:
    """The circuit of a trained two-layer decoder on core.lab.induction's probe texts."""
    check_shape(run_id, lab)
    texts = engine.probe_texts()
    found = engine.circuit(model, texts)
    labels, over = top_and_rest(*model_parts(found.keys, lab))
    first = texts[0]
    with torch.inference_mode():
        probs = model(first[None], capture_attention=True, return_logits=False).attentions
    finding = found.finding
    previous, induction = finding.previous.head, finding.induction.head
    return Traced(run_id, lab, found.previous_token[0].numpy(), found.induction[1].numpy(), previous, induction,
                  finding, found.keys, labels, over.mean.numpy(), over.low.numpy(), over.high.numpy(),
                  found.keys.weights.k.numpy(), over.n, found.keys.pairs, [VOCAB[i] for i in first.tolist()],
                  probs[0][0, previous].float().cpu().numpy(), probs[1][0, induction].float().cpu().numpy())


def trace_saved() -> Traced | None:
    """The shipped run's circuit, or None where its folder is missing."""
    if not (FOLDER / "model.safetensors").is_file():
        return None
    run = shipped.load(RUN)
    return trace(run.model, RUN, run.lab)
