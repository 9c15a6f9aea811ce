"""What feeds a head (ui/services/composition.py, the Heads tab's section): the bars are the core's
composition_over shares of the named components and the rest summed per text, the map its weights-only scores;
bad input is refused in words; on SmolLM2 the strongest induction head's keys come first from the atlas's
strongest previous-token head."""

from __future__ import annotations

import pytest
import torch
from tiny_app_model import build_tiny_llama

from core import load_model
from core.analysis import qk
from core.analysis import over as overs
from core.corpus import stats, texts as corpora
from ui.plots.heads import composition_figure
from ui.services.checks import UserError
from ui.services.corpus.composition import TOP, composition, top_and_rest
from ui.services.corpus.over import induction_length


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load_model(str(build_tiny_llama(tmp_path_factory.mktemp("composition") / "llama")), device="cpu")


def test_the_bars_are_the_cores_shares_with_the_rest_summed_per_text(llama):
    found = composition(llama, 1, 2, "key", 3)
    grid = stats.summarise(torch.arange(24.).reshape(2, 12) - 5, bounds=stats.UNBOUNDED)     # 2 texts, 12 parts
    labels, over = top_and_rest(grid, [str(i) for i in range(12)], 3)
    assert labels == ["11", "10", "9", "rest"]
    assert over.per_item[:, 3].tolist() == [-9.0, 99.0]                      # parts 0..8 of each text, summed
    texts = corpora.induction_texts(llama.tokenizer, 3, induction_length(llama), bos=llama.config.bos_token_id)
    core = qk.composition_over(llama, texts, 1, 2, "key")
    per_text = core.shares.per_item                                    # [n, parts], each text's shares add to 1
    torch.testing.assert_close(per_text.sum(1), torch.ones(len(per_text)), atol=1e-4, rtol=0)
    order = core.shares.mean.abs().argsort(descending=True, stable=True).tolist()
    assert found.labels[:TOP] == [core.labels[i] for i in order[:TOP]]
    named = per_text[:, order[:TOP]]
    if len(order) > TOP:           # the parts past the top 8, summed on each text
        assert found.labels[-1] == "rest" and len(found.labels) == TOP + 1
        named = torch.cat([named, per_text[:, order[TOP:]].sum(1, keepdim=True)], 1)
    want = stats.summarise(named, bounds=stats.UNBOUNDED)        # a share of a signed sum: no range
    torch.testing.assert_close(torch.from_numpy(found.mean), want.mean.float())
    torch.testing.assert_close(torch.from_numpy(found.low), want.low.float(), equal_nan=True)
    assert found.mean.sum() == pytest.approx(1.0, abs=1e-4) and found.n == 3 and found.interval == ""   # too few
    torch.testing.assert_close(torch.from_numpy(found.weights), core.weights.k)
    assert composition(llama, 1, 2, "query", 3).weights.tolist() == core.weights.q.tolist()
    figure = composition_figure(found.labels, found.mean, found.low, found.high, found.weights, "key", "t")
    assert list(figure.data[0].y) == found.labels and figure.data[1].z.shape == found.weights.shape
    for side, words in (("key", "on its keys"), ("query", "on its queries")):   # the plural, in the subplot title
        titles = composition_figure(found.labels, found.mean, found.low, found.high, found.weights, side, "t")
        assert any(words in a.text for a in titles.layout.annotations), side


def test_layer_0_has_only_the_embeddings_and_no_map(llama):
    found = composition(llama, 0, 0, "key", 2)
    assert found.weights.size == 0 and not any(" H" in label for label in found.labels)
    assert len(composition_figure(found.labels, found.mean, found.low, found.high, found.weights, "key",
                                  "t").data) == 1


@pytest.mark.parametrize("layer, head, side, n, words", [
    (9, 0, "key", 3, "Layer must be"), (1, 0, "value", 3, "Side must be one of key, query"),
    (1, 0, "key", 0, "Texts (n) must be"), (1, 0, "key", "many", "Texts (n)"),
])
def test_bad_input_is_refused_in_words(llama, layer, head, side, n, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        composition(llama, layer, head, side, n)


def test_on_smollm2_the_induction_heads_keys_come_from_the_previous_token_head(smollm):
    """The classic circuit on a real model: the atlas's strongest induction head (over these texts) reads keys
    written first by its strongest previous-token head among the earlier layers."""
    texts = corpora.induction_texts(smollm.tokenizer, 5, induction_length(smollm), bos=smollm.config.bos_token_id)
    scores = overs.head_scores_over(smollm, texts)
    n_heads = smollm.config.n_heads
    layer, head = divmod(int(scores["induction"].mean.flatten().argmax()), n_heads)
    previous = scores["previous_token"].mean[:layer]
    source = divmod(int(previous.flatten().argmax()), n_heads)
    found = composition(smollm, layer, head, "key", 5)  # five texts: the fewest that get an interval
    assert found.labels[0] == f"L{source[0]} H{source[1]}", (found.labels, source)
    assert found.low[0] > max(abs(v) for v in found.high[1:])     # first with its whole interval
