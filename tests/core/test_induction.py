"""Ground truth for "what feeds a head" (core/analysis/induction.py): a two-layer attention-only Lab decoder trained
on copy-62 has to learn the induction circuit, and composition_over on its induction head's keys must name its
previous-token head first. Once on the run the project ships (assets/lessons/induction), once on a run trained
here from the same seeded config."""
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from core import load_model
from core.lab import train as lab
from core.analysis import induction

SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "lessons" / "induction"


def check_circuit(found: induction.Circuit) -> None:
    assert found.previous_token[found.previous_head] > 0.5          # a clear previous-token head in layer 0 ...
    assert found.induction[found.induction_head] > 0.5              # ... and an induction head in layer 1
    assert found.found, (found.first_source, found.previous_head)
    shares = found.keys.shares
    labels = found.keys.labels
    first = labels.index(found.first_source)
    others = [i for i, label in enumerate(labels) if " H" in label and i != first]
    assert all(shares.low[first] > shares.high[i] for i in others)  # first by more than the intervals


def test_the_probe_texts_and_their_places():
    texts = induction.probe_texts(3, 5, seed=1)
    assert texts[0].shape == (12,) and texts[0][0] == lab.BOS and texts[0][6] == lab.SEP
    assert torch.equal(texts[0][1:6], texts[0][7:]) and not torch.equal(texts[0], texts[1])
    queries, keys = induction.second_copy_places(5)
    assert queries.tolist() == [7, 8, 9, 10] and keys.tolist() == [2, 3, 4, 5]   # s[i] (second copy) → s[i + 1]


def test_the_shipped_run_finds_its_previous_token_head():
    found = induction.circuit(load_model(SHIPPED, device="cpu"))
    check_circuit(found)
    assert "L0 MLP" in found.keys.labels                           # attention only: its MLP writes exactly 0
    assert found.keys.shares.mean[found.keys.labels.index("L0 MLP")] == 0


def test_the_circuit_is_refused_on_another_shape():
    with pytest.raises(ValueError, match="two-layer decoder-only"):
        induction.circuit(lab.build_model(lab.LabConfig(family="llama", n_layers=1, d_model=32)))


@pytest.mark.slow
def test_a_seeded_lab_run_learns_the_circuit():
    """The shipped run's config (its manifest), trained again here: about 75 s on one thread. The test asks for
    the circuit, not for the same weights, which another CPU's float sums may move."""
    from ui.services.lab import saved

    config = saved.lab_config(SHIPPED)
    config = replace(config, eval_every=config.steps)            # one evaluation, at the end
    assert config.attention_only and (config.n_layers, config.task) == (2, "copy-62")
    for result, _ in lab.train(config):
        pass
    assert result.final.exact_match >= 0.9
    check_circuit(induction.circuit(result.model))
