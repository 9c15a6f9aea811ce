"""The one rule that names an induction circuit (core.analysis.circuits), on constructed scores: below either
minimum no circuit is named and the words give the scores; above both, with the previous-token head feeding the
induction head's keys most, the circuit is found. And the typed parts it reads (core.analysis.Part)."""
from types import SimpleNamespace

import pytest
import torch

from core.analysis import circuits
from core.analysis import Part, head, upstream_parts
from core.analysis.qk import CompositionOver

LABELS = ["embeddings", "L0 H0", "L0 H1", "L0 H2", "L0 MLP", "bias"]


def keys(shares: list[float], layer: int = 1, head: int = 2) -> CompositionOver:
    """What feeds L1 H2's keys in a two-layer, three-head model: the shares of LABELS' parts."""
    return CompositionOver(layer, head, "key", LABELS, SimpleNamespace(mean=torch.tensor(shares)), "constructed",
                           None, upstream_parts(LABELS, layer, 3))


def tables(previous: float, induction: float, previous_head: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    p, i = torch.full((2, 3), 0.05), torch.full((2, 3), 0.03)
    p[0, previous_head], i[1, 2] = previous, induction
    return p, i


FED_BY_H1 = [0.2, 0.05, 0.6, 0.1, 0.0, 0.05]       # L0 H1 has the largest share of the keys


def test_a_fed_induction_head_above_both_minimums_is_the_circuit():
    found = circuits.induction_circuit(*tables(0.69, 0.81), keys(FED_BY_H1))
    assert found.found
    assert (found.source, found.induction) == (head(0, 1), head(1, 2))
    assert found.source_share == pytest.approx(0.6) and found.source_previous == pytest.approx(0.69)
    words = found.words()
    assert "L0 H1" in words and "L1 H2" in words and "Olsson" in words and "no circuit" not in words


@pytest.mark.parametrize("previous, induction", [(0.08, 0.06), (0.08, 0.81), (0.69, 0.06),
                                                 (circuits.PREVIOUS_MIN - 0.01, 0.81),
                                                 (0.69, circuits.INDUCTION_MIN - 0.01)])
def test_below_either_minimum_no_circuit_is_named_and_the_scores_are_said(previous, induction):
    found = circuits.induction_circuit(*tables(previous, induction), keys(FED_BY_H1))
    assert not found.found
    words = found.words()
    assert words.startswith("no circuit formed (scores: ")
    assert f"{induction:.2f}" in words and f"{previous:.2f}" in words
    assert "Olsson" not in words


def test_at_the_minimums_the_circuit_passes():
    found = circuits.induction_circuit(*tables(circuits.PREVIOUS_MIN, circuits.INDUCTION_MIN), keys(FED_BY_H1))
    assert found.found


def test_a_previous_token_head_that_does_not_feed_the_keys_most_is_no_circuit():
    # L0 H1 is a clear previous-token head, but L0 H2 (previous-token 0.05) writes more of the keys
    found = circuits.induction_circuit(*tables(0.69, 0.81), keys([0.1, 0.0, 0.3, 0.6, 0.0, 0.0]))
    assert not found.found and found.source == head(0, 2)
    assert found.previous == head(0, 1) and "L0 H2" in found.words()


def test_a_negative_largest_share_feeds_nothing():
    found = circuits.induction_circuit(*tables(0.69, 0.81), keys([1.5, -0.1, -0.05, -0.2, 0.0, -0.15]))
    assert found.source == head(0, 1) and found.source_share < 0 and not found.found


def test_the_embeddings_feeding_most_does_not_hide_the_largest_single_head():
    found = circuits.induction_circuit(*tables(0.69, 0.81), keys([0.7, 0.0, 0.25, 0.05, 0.0, 0.0]))
    assert found.found and found.source == head(0, 1)


def test_the_rule_reads_only_what_feeds_keys_of_a_measured_head():
    with pytest.raises(ValueError, match="side 'key'"):
        circuits.induction_circuit(*tables(0.69, 0.81), CompositionOver(
            1, 2, "query", LABELS, SimpleNamespace(mean=torch.zeros(6)), "", None, upstream_parts(LABELS, 1, 3)))
    with pytest.raises(ValueError, match=r"\[layers, heads\] reaching layer 1"):
        circuits.induction_circuit(torch.zeros(2, 3), torch.zeros(1, 3), keys(FED_BY_H1))


def test_the_induction_head_traced_is_the_strongest_past_layer_0():
    table = torch.tensor([[0.9, 0.1], [0.2, float("nan")], [0.3, 0.25]])
    assert circuits.induction_head(table) == (head(2, 0), pytest.approx(0.3))
    with pytest.raises(ValueError, match="layers ≥ 2"):
        circuits.induction_head(torch.zeros(1, 4))


def test_typed_parts_show_as_labels_and_are_looked_up_not_guessed():
    assert str(head(3, 5)) == "L3 H5" and str(Part("MLP", 2)) == "L2 MLP" and str(Part("bias")) == "bias"
    typed = upstream_parts(LABELS + ["L0 attn bias"], 1, 3)
    assert [str(p) for p in typed] == LABELS + ["L0 attn bias"]
    assert [p for p in typed if p.is_head] == [head(0, h) for h in range(3)]
    with pytest.raises(ValueError, match="L1 H0"):          # a head of the layer read itself is no upstream part
        upstream_parts(["L1 H0"], 1, 3)
