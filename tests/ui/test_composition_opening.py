""""What feeds a head" opens on the loaded model's strongest induction head by the Heads tab's own induction score
(its probe, layers ≥ 1), not on L0 H0, whose keys no earlier head can feed; an encoder opens on layer 1, head 0."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_app_model import build_tiny_bert, build_tiny_llama

from core import load_model
from ui.services.corpus.composition import opening_head
from ui.services.heads import HeadsCache, cached_induction


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load_model(str(build_tiny_llama(tmp_path_factory.mktemp("opening") / "llama")), device="cpu")


def test_it_opens_on_the_heads_tabs_strongest_induction_head(llama):
    scores = cached_induction(llama, HeadsCache(key=("llama",), tokens=None)).scores.numpy()   # [L, H], the atlas's
    later = scores[1:]
    layer, head = np.unravel_index(np.nanargmax(later), later.shape)
    assert opening_head(llama) == (int(layer) + 1, int(head))
    assert opening_head(llama)[0] >= 1


def test_an_encoder_opens_on_layer_one(tmp_path):
    bert = load_model(str(build_tiny_bert(tmp_path / "bert")), device="cpu")
    assert opening_head(bert) == (1, 0)
