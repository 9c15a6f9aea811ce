"""The sinks experiment (core/lab/sinks): its task follows its rule, both kinds train on the same batches and are
measured by the project's own sink_scores and streaming_perplexity, and what it reports about the learned sink is
what the model's own attention says."""
from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch

from core.lab import sinks as lab
from core.analysis.sinks import streaming_perplexity
from core.lab.train import BOS, VOCAB

SMALL = lab.SinksLabConfig(steps=40, context=32, window=8, test_texts=5, d_model=32, n_heads=2, batch=8)


def test_every_letter_is_drawn_at_random_or_copies_the_letter_before_its_trigger():
    rng = random.Random(0)
    for _ in range(50):
        ids = lab.sequence(rng, 64)
        assert ids[0] == BOS and ids[1] not in lab.TRIGGER_IDS and len(ids) == 64
        for t in range(1, 63):
            if ids[t] in lab.TRIGGER_IDS:
                assert ids[t + 1] == ids[t - 1], (t, "".join(VOCAB[i] for i in ids))
            else:
                assert ids[t + 1] in lab.LETTER_IDS
    assert sum(i in lab.TRIGGER_IDS for i in lab.sequence(random.Random(1), 2000)) > 50   # triggers do occur


def test_the_two_kinds_see_the_same_batches_and_differ_only_in_the_sink():
    soft, _, _ = lab.train_kind(replace(SMALL, steps=1), "softmax")
    sink, _, _ = lab.train_kind(replace(SMALL, steps=1), "sink")
    soft_params, sink_params = dict(soft.named_parameters()), dict(sink.named_parameters())
    assert set(sink_params) - set(soft_params) == {f"stack.blocks.{i}.attn.sinks" for i in range(SMALL.n_layers)}
    assert not soft.config.attention_sinks and sink.config.attention_sinks


def test_the_learned_sinks_weight_is_what_the_rows_of_the_models_attention_leave():
    config = replace(SMALL, steps=60)
    model, loss, steps = lab.train_kind(config, "sink")
    assert steps == 60 and loss < math.log(len(VOCAB))   # below a uniform guess over the vocabulary: it learns
    held = lab.held_out(config)
    measured = lab.measure(model, config, "sink", held)
    with torch.inference_mode():
        attentions = model(torch.stack(held), capture_attention=True).attentions
    for layer, probs in enumerate(attentions):                     # [B, H, T, T]
        left = (1 - probs[:, :, 1:].sum(-1)).mean(-1).mean(0)       # queries 1..T−1, then the texts
        torch.testing.assert_close(torch.tensor(measured["learned"][layer]), left, atol=1e-4, rtol=0)
        on_bos = probs[:, :, 1:, 0].mean(-1).mean(0)
        torch.testing.assert_close(torch.tensor(measured["first"][layer]), on_bos, atol=1e-4, rtol=0)
    assert measured["sink_logits"] is None and model.stack.blocks[0].attn.sinks.shape == (2, 16)   # a key per head
    # the window reads: a window as long as the text is full attention, and the past-window figure reads the
    # predictions of queries ≥ window − 1
    full = torch.stack([streaming_perplexity(model, ids, config.context, 0, positions="text").loss for ids in held])
    assert measured["perplexity"]["full"] == pytest.approx(float(full.double().mean().exp()), abs=1e-3)
    assert measured["past_window"]["full"] == pytest.approx(float(full[:, config.window - 1:].double().mean().exp()),
                                                            abs=1e-3)


def test_a_run_saves_and_loads_and_a_stop_keeps_nothing_half_trained(tmp_path):
    result = lab.run_all(SMALL)
    assert [k.kind for k in result.kinds] == list(lab.KINDS) and not result.stopped
    assert result.kind("softmax").learned is None and result.kind("sink").learned is not None
    assert set(result.kind("sink").perplexity) == set(lab.READS)
    again = lab.load(lab.save(result, tmp_path / "sinks"))
    assert again == result
    calls = []
    stopped = lab.run_all(SMALL, stop=lambda: len(calls) > 0, progress=lambda *a: calls.append(a))
    assert stopped.stopped and stopped.kinds == []


def test_a_logit_sink_reports_its_trained_logits():
    config = replace(SMALL, steps=5, sink="logit")
    model, _, _ = lab.train_kind(config, "sink")
    measured = lab.measure(model, config, "sink", lab.held_out(config))
    assert measured["sink_logits"] == [[round(float(x), 4) for x in block.attn.sinks.detach()]
                                       for block in model.stack.blocks]


@pytest.mark.parametrize("field, value", [("steps", 0), ("window", 31), ("window", 0), ("context", 4),
                                          ("test_texts", 1), ("steps", 2.5), ("sink", "bias")])
def test_a_bad_config_is_named(field, value):
    with pytest.raises(ValueError, match=field):
        replace(SMALL, **{field: value}).check()
