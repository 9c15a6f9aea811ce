"""The Lab's attention-only run lists only the parts its model has: its MLPs write nothing (their output weights
are zero and frozen), so what feeds its induction head's keys names no MLP, while a run with MLPs keeps them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from core.analysis import MLP
from core.lab import induction as engine
from ui.services.lab import induction
from ui.services.lab import saved as shipped


@pytest.fixture(scope="module")
def run():
    if induction.trace_saved() is None:
        pytest.skip("the shipped induction run is missing from this copy")
    return shipped.load(induction.RUN)


def test_an_attention_only_run_names_no_mlp_among_what_feeds_its_keys(run):
    assert run.lab.attention_only
    found = induction.trace(run.model, induction.RUN, run.lab)
    assert found.labels and not [label for label in found.labels if label.endswith(" MLP")], found.labels
    keys = engine.circuit(run.model).keys
    mlps = [i for i, part in enumerate(keys.parts) if part.kind == MLP]
    assert mlps                                                   # the checkpoint keeps each MLP's place ...
    np.testing.assert_allclose(keys.shares.per_item[:, mlps].numpy(), 0.0, atol=1e-6)   # ... writing nothing
    shares, labels = induction.model_parts(keys, run.lab)
    np.testing.assert_allclose(shares.per_item.sum(1).numpy(), keys.shares.per_item.sum(1).numpy(), atol=1e-5)
    with_mlps = induction.model_parts(keys, replace(run.lab, attention_only=False))[1]
    assert [keys.labels[i] for i in mlps] == [label for label in with_mlps if label.endswith(" MLP")]
