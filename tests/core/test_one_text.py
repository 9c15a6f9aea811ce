"""Every analysis of one text takes its ids as [T] or [1, T] (core.corpus.jobs.one_text) and gives the same result
either way; a batch of texts, or ids that are not integers, is refused in words naming the shape or the type."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from core import load_model
from core.analysis import anatomy, heads, patching, qk, shortcuts, sinks
from core.corpus.jobs import one_text
from tests import tiny

T = 10


@pytest.fixture(scope="module")
def model():
    return load_model(tiny.save(tiny.llama(num_key_value_heads=2)), device="cpu")


@pytest.fixture(scope="module")
def graph(model):
    return patching.flow_graph(model, text()[None], threshold=0.0)


def text(seed: int = 0) -> torch.Tensor:
    return torch.randint(3, tiny.VOCAB, (T,), generator=torch.Generator().manual_seed(seed))


def corrupted(ids: torch.Tensor) -> torch.Tensor:
    """ids of the same shape and type with the token at position 4 changed: the pair's other prompt."""
    changed = ids.clone()
    changed[..., 4] = (changed[..., 4] + 1 - 3) % (tiny.VOCAB - 3) + 3
    return changed


# name → a call of the analysis on one text given as `ids` (both prompts of a pair take the same shape)
CALLS = {
    "heads.pattern_scores": lambda m, ids, g: heads.pattern_scores(m, ids),
    "heads.ablate": lambda m, ids, g: heads.ablate(m, ids, [(0, 0)]),
    "heads.ablation_sweep": lambda m, ids, g: heads.ablation_sweep(m, ids),
    "heads.attribute": lambda m, ids, g: heads.attribute(m, ids, steps=4),
    "heads.completeness_by_steps": lambda m, ids, g: heads.completeness_by_steps(m, ids, steps=(2, 4)),
    "heads.lens_table": lambda m, ids, g: heads.lens_table(m, ids),
    "heads.surprisal": lambda m, ids, g: heads.surprisal(m, ids),
    "patching.patch_sweep": lambda m, ids, g: patching.patch_sweep(m, ids, corrupted(ids), 5, 6,
                                                                   "resid_pre"),
    "patching.logit_attribution": lambda m, ids, g: patching.logit_attribution(m, ids, 5, 6),
    "patching.flow_graph": lambda m, ids, g: patching.flow_graph(m, ids),
    "anatomy.forward_stages": lambda m, ids, g: anatomy.forward_stages(m, ids, 1, 0),
    "anatomy.qk_geometry": lambda m, ids, g: anatomy.qk_geometry(m, ids, 1, 0),
    "qk.qk_attribution": lambda m, ids, g: qk.qk_attribution(m, ids, 1, 0, 6, 2),
    "qk.score_decomposition": lambda m, ids, g: qk.score_decomposition(m, ids, 1, 0, 6, 2),
    "qk.graph_attribution": lambda m, ids, g: qk.graph_attribution(m, ids, g),
    "qk.edge_attribution": lambda m, ids, g: qk.edge_attribution(m, ids, g, *first_edge(g)),
    "shortcuts.approximate_sweep": lambda m, ids, g: shortcuts.approximate_sweep(
        m, ids, corrupted(ids), 5, 6, "resid_pre", method="atp"),
    "sinks.streaming_perplexity": lambda m, ids, g: sinks.streaming_perplexity(m, ids, window=4, sinks=1,
                                                                               positions="text"),
}


def first_edge(graph) -> tuple[int, int, int]:
    edge = qk.attention_edges(graph)[0]
    return edge.layer, edge.target, edge.source


def same(a, b, where: str = "result") -> None:
    """a and b equal all through: tensors to the bit (NaN where NaN), dataclasses, mappings and sequences by part."""
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{where}: {m}")
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize("name", CALLS)
def test_one_text_as_t_or_1_t_gives_the_same_result(model, graph, name):
    call = CALLS[name]
    same(call(model, text(), graph), call(model, text()[None], graph), name)


@pytest.mark.parametrize("name", CALLS)
def test_a_batch_or_float_ids_are_refused_in_words(model, graph, name):
    call = CALLS[name]
    with pytest.raises(ValueError, match=r"must be one text, \[T\] or \[1, T\]; got shape \[2, 10\] \(a batch of 2"):
        call(model, torch.stack([text(), text(1)]), graph)
    with pytest.raises(ValueError, match=r"must be integer token ids, \[T\] or \[1, T\]; got torch.float32"):
        call(model, text().float(), graph)


def test_one_text_names_what_it_was_given():
    assert one_text(torch.arange(4)).shape == (1, 4) and one_text(torch.arange(4)[None]).shape == (1, 4)
    with pytest.raises(ValueError, match=r"clean_ids must be one text, \[T\] or \[1, T\]; got shape \[1, 2, 3\]$"):
        one_text(torch.zeros(1, 2, 3, dtype=torch.long), "clean_ids")
    with pytest.raises(ValueError, match=r"ids must be a tensor of token ids, \[T\] or \[1, T\]; got list"):
        one_text([1, 2, 3])
    with pytest.raises(ValueError, match="got torch.bool"):
        one_text(torch.ones(3, dtype=torch.bool))
