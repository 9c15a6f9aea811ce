"""Recurrence beside attention (core/lab/recurrent): the GRU's shapes and parameter count against the attention
decoder's, the gradient reaching each position measured against the core's own gradient seam and a hand-made
GRU, path lengths, a tiny side-by-side run saved and read back, and bad settings refused."""

from __future__ import annotations

import pytest
import torch

from core.lab import recurrent as rec
from core.lab import train as lab_engine

TINY = rec.RecurrenceConfig(steps=3, test_examples=3, lengths=(2, 5), n_layers=1, d_model=32, n_heads=2, d_ff=32,
                            gru_embed=16, batch=4)


def test_the_gru_matches_the_decoders_parameter_count_and_gives_one_logit_row_per_token():
    attention, gru = rec.build_models(rec.RecurrenceConfig())
    vocab = len(lab_engine.VOCAB)
    assert rec.parameter_count(gru) == rec.gru_parameters(vocab, 64, gru.gru.hidden_size)
    assert abs(rec.parameter_count(gru) - rec.parameter_count(attention)) / rec.parameter_count(attention) < 0.01
    # the next hidden size either way is further from the decoder's count
    for other in (gru.gru.hidden_size - 1, gru.gru.hidden_size + 1):
        assert abs(rec.gru_parameters(vocab, 64, other) - rec.parameter_count(attention)) >= \
            abs(rec.parameter_count(gru) - rec.parameter_count(attention))
    ids = torch.randint(0, vocab, (3, 11))
    assert gru(ids).shape == (3, 11, vocab)


def test_sequential_steps_are_n_for_the_gru_and_one_per_layer_for_attention():
    attention, gru = rec.build_models(TINY)
    assert rec.sequential_steps(gru, 43) == 43
    assert rec.sequential_steps(attention, 43) == TINY.n_layers


def test_the_gradient_by_distance_equals_the_cores_own_gradient_seam():
    """The decoder's ‖∂loss/∂x_t‖ through token_embeddings equals the one out.token_embeddings carries (grad=True)."""
    attention, _ = rec.build_models(TINY)
    pairs = rec.held_out(TINY, 4)
    norms = rec.gradient_by_distance(attention, pairs)
    assert len(norms) == 2 * 4 + 1                                       # positions 0..2L, distance 0 first
    batch = lab_engine.make_batch(pairs, seq2seq=False)
    out = attention(**batch.inputs, grad=True)
    loss = torch.nn.functional.cross_entropy(out.logits[:, 8].float(), batch.labels[:, 8])
    (grad,) = torch.autograd.grad(loss, out.token_embeddings)
    expected = grad[:, :9].norm(dim=-1).mean(0).flip(0)
    torch.testing.assert_close(torch.tensor(norms), expected, rtol=1e-4, atol=1e-8)


def test_the_gru_gradient_matches_a_hand_made_recurrence_and_shrinks_with_distance_untrained():
    """The same GRU unrolled by hand with nn.GRUCell's equations gives the same gradient norms; untrained, they
    shrink from the loss's position back to <bos> (the vanishing gradient)."""
    _, gru = rec.build_models(TINY)
    pairs = rec.held_out(TINY, 5)
    norms = rec.gradient_by_distance(gru, pairs)
    ids = lab_engine.make_batch(pairs, seq2seq=False).inputs["input_ids"]
    labels = lab_engine.make_batch(pairs, seq2seq=False).labels
    cell = torch.nn.GRUCell(gru.gru.input_size, gru.gru.hidden_size)
    cell.load_state_dict({k.replace("_l0", ""): v for k, v in gru.gru.state_dict().items()})
    x = gru.embed(ids).detach().requires_grad_(True)
    h = torch.zeros(ids.shape[0], gru.gru.hidden_size)
    for t in range(11):                                                  # up to position 2L = 10
        h = cell(x[:, t], h)
    loss = torch.nn.functional.cross_entropy(gru.head(h), labels[:, 10])
    (grad,) = torch.autograd.grad(loss, x)
    torch.testing.assert_close(torch.tensor(norms), grad[:, :11].norm(dim=-1).mean(0).flip(0), rtol=1e-4, atol=1e-9)
    assert norms[-1] < norms[0] / 10


def test_a_tiny_run_trains_both_measures_them_and_reads_back(tmp_path):
    result = rec.run(TINY)
    assert [m.name for m in result.models] == ["attention", "GRU"]
    assert result.longest_tokens == 2 * 5 + 3
    for m in result.models:
        assert sorted(m.accuracy) == [3, 4, 5, 6]                        # source lengths 2..5, distance L + 1
        assert all(0 <= a <= 1 for a in m.accuracy.values())
        assert len(m.step_ms) == len(m.train_loss) == TINY.steps and all(t > 0 for t in m.step_ms)
        assert len(m.gradient_trained) == len(m.gradient_untrained) == 2 * 5 + 1
    loaded = rec.load(rec.save(result, tmp_path, "python -m core.lab.recurrent").parent)
    assert loaded.config == result.config and loaded.gru_hidden == result.gru_hidden
    for a, b in zip(loaded.models, result.models):
        assert a.accuracy == b.accuracy and a.gradient_trained == pytest.approx(b.gradient_trained)
        assert a.median_step_ms == pytest.approx(b.median_step_ms)


@pytest.mark.parametrize("change, words", [({"lengths": (0, 5)}, "lengths"), ({"steps": 0}, "steps"),
                                           ({"lengths": (3, 25)}, "lengths"), ({"d_model": 33}, "multiple")])
def test_bad_settings_are_refused_in_words(change, words):
    from dataclasses import replace
    with pytest.raises(ValueError, match=words):
        replace(TINY, **change).check()
