"""Ground truth for "what feeds a head" (core/lab/induction.py): a two-layer attention-only Lab decoder trained
on copy-62 has to learn the induction circuit, and composition_over on its induction head's keys must name its
previous-token head first, as core.analysis.circuits' rule decides it. Once on the run the project ships
(assets/lessons/induction), once on a run trained here from the same seeded config; and a run too short to learn
the task names no circuit."""
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from core import load_model
from core.analysis import MLP, Part, circuits, head
from core.lab import induction, shipped, train as lab

SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "lessons" / "induction"


def check_circuit(found: induction.Circuit) -> None:
    finding = found.finding
    assert found.found, finding.words()
    source, target = finding.source, finding.induction
    assert source.layer == 0 and target.layer == 1
    assert found.previous_token[0, source.head] >= circuits.PREVIOUS_MIN    # a clear previous-token head in layer 0
    assert found.induction[1, target.head] >= circuits.INDUCTION_MIN        # ... and an induction head in layer 1
    assert finding.previous == source                                      # the strongest one feeds the keys
    shares = found.keys.shares
    first = found.keys.index(source)
    others = [i for i in found.keys.heads() if i != first]
    assert all(shares.low[first] > shares.high[i] for i in others)  # first by more than the intervals
    assert finding.words().startswith(f"{source} (previous-token score") and "Olsson" in finding.words()


def test_the_probe_texts_and_their_places():
    texts = induction.probe_texts(3, 5, seed=1)
    assert texts[0].shape == (12,) and texts[0][0] == lab.BOS and texts[0][6] == lab.SEP
    assert torch.equal(texts[0][1:6], texts[0][7:]) and not torch.equal(texts[0], texts[1])
    queries, keys = induction.second_copy_places(5)
    assert queries.tolist() == [7, 8, 9, 10] and keys.tolist() == [2, 3, 4, 5]   # s[i] (second copy) → s[i + 1]


def test_the_shipped_run_finds_its_previous_token_head():
    found = induction.circuit(load_model(SHIPPED, device="cpu"))
    check_circuit(found)
    assert found.finding.source == head(0, 3) and found.finding.induction == head(1, 1)
    mlp = found.keys.index(Part(MLP, 0))                 # attention only: its MLP writes exactly 0
    assert found.keys.labels[mlp] == "L0 MLP" and found.keys.shares.mean[mlp] == 0


def test_a_run_too_short_to_learn_the_task_names_no_circuit():
    """The Lab's shortest "Train one like it" run (100 steps of the shipped config): its best scores are chance
    level, so the rule names no circuit and says the scores it read."""
    config = replace(shipped.lab_config(SHIPPED), steps=100, eval_every=100)
    for result, _ in lab.train(config):
        pass
    found = induction.circuit(result.model)
    finding = found.finding
    assert not found.found
    assert finding.induction_score < circuits.INDUCTION_MIN or finding.source_previous < circuits.PREVIOUS_MIN
    words = finding.words()
    assert words.startswith("no circuit formed (scores: ") and "Olsson" not in words
    assert f"{finding.induction_score:.2f}" in words and str(finding.induction) in words


def test_the_circuit_is_refused_on_another_shape():
    with pytest.raises(ValueError, match="two-layer decoder-only"):
        induction.circuit(lab.build_model(lab.LabConfig(family="llama", n_layers=1, d_model=32)))


@pytest.mark.slow
def test_a_seeded_lab_run_learns_the_circuit():
    """The shipped run's config (its manifest), trained again here: about 75 s on one thread. The test asks for
    the circuit, not for the same weights, which another CPU's float sums may move."""
    config = shipped.lab_config(SHIPPED)
    config = replace(config, eval_every=config.steps)            # one evaluation, at the end
    assert config.attention_only and (config.n_layers, config.task) == (2, "copy-62")
    for result, _ in lab.train(config):
        pass
    assert result.final.exact_match >= 0.9
    check_circuit(induction.circuit(result.model))
