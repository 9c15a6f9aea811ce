"""Long-text capture: the pooled overview and the on-demand full resolution equal the plain capture."""
import numpy as np
import pytest
import torch

from core import load_model
from core.analysis.capture import capture, layer_map, pool_columns
from tests import tiny


@pytest.fixture(scope="module")
def model():
    return load_model(tiny.save(tiny.llama(max_position_embeddings=512)), device="cpu")


def ids(n):
    return torch.randint(3, tiny.VOCAB - 1, (1, n), generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("keep_full_up_to", [512, 0])  # kept in float16, or recomputed per layer
def test_full_resolution_equals_plain_capture(model, keep_full_up_to):
    x = ids(40)
    maps = capture(model, x, keep_full_up_to=keep_full_up_to)
    reference = model(x, capture_attention=True).attentions
    tol = 1e-3 if keep_full_up_to else 1e-6  # float16 storage, or the same float32 computation
    for layer, probs in enumerate(reference):
        np.testing.assert_allclose(maps.head(layer, 1), probs[0, 1].numpy(), atol=tol)
        np.testing.assert_allclose(maps.head(layer), probs[0].mean(0).numpy(), atol=tol)
    window = maps.head(1, 2, queries=(30, 40), keys=(0, 10))
    np.testing.assert_allclose(window, reference[1][0, 2, 30:40, :10].numpy(), atol=tol)


def test_overview_is_block_mean(model):
    x = ids(300)
    maps = capture(model, x, overview_size=100)
    assert maps.overview.shape == (2, 4, 100, 100) and maps.block == 3
    reference = model(x, capture_attention=True).attentions[1][0, 3]
    pooled = reference.reshape(100, 3, 100, 3).mean((1, 3))
    np.testing.assert_allclose(maps.overview[1, 3], pooled.numpy(), atol=1e-6)
    # rows of the pooled map still sum to one (each averages whole rows)
    np.testing.assert_allclose(maps.overview.sum(-1) * maps.block, 1.0, atol=1e-4)


def test_bad_requests_are_named(model):
    maps = capture(model, ids(20))
    with pytest.raises(IndexError, match="layer 5 is out of range"):
        maps.head(5)
    with pytest.raises(IndexError, match="head 9 is out of range"):
        maps.head(0, 9)
    with pytest.raises(ValueError, match="exceed the model's 512 positions"):
        capture(model, ids(513))


def test_kept_layers_need_no_second_pass_and_progress_counts_layers(model, monkeypatch):
    x = ids(60)
    seen = []
    maps = capture(model, x, keep_full_up_to=0, keep_layers={1}, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)]
    reference = model(x, capture_attention=True).attentions[1][0]
    monkeypatch.setattr(model, "run_stack", None)  # any recomputation would now fail
    np.testing.assert_allclose(maps.head(1, 3), reference[3].numpy(), atol=1e-6)


@pytest.mark.parametrize("n, width, size", [(301, 301, 37), (301, 120, 37), (50, 20, 64), (2048, 1792, 128),
                                            (2048, 1800, 128)])
def test_column_pooling_equals_adaptive_pooling_of_the_zero_padded_row(n, width, size):
    import torch.nn.functional as F
    block = torch.rand(3, 5, width, generator=torch.Generator().manual_seed(n + width))
    expected = F.pad(block, (0, n - width))
    if n > size:
        expected = F.adaptive_avg_pool1d(expected, size)
    torch.testing.assert_close(pool_columns(block, n, size), expected, atol=1e-5, rtol=1e-5)


def test_seq2seq_capture_reads_the_encoder():
    model = load_model(tiny.save(tiny.marian()), device="cpu")
    x = ids(30)
    maps = capture(model, x, keep_full_up_to=0)
    reference = model(x, capture_attention=True).encoder_attentions
    assert maps.overview.shape == (2, 4, 30, 30)
    for layer, probs in enumerate(reference):
        np.testing.assert_allclose(maps.head(layer, 2), probs[0, 2].numpy(), atol=1e-6)
    assert (maps.head(0)[0, 1:] > 0).all(), "the encoder attends both ways"
    assert model.attention_stack() == (model.encoder, "encoder")
    np.testing.assert_allclose(layer_map(model, x, 1).numpy(), reference[1][0].numpy(), atol=1e-6)


def test_layer_map_is_one_layer_of_the_full_pass(model):
    x = ids(50)
    reference = model(x, capture_attention=True).attentions
    assert model.attention_stack() == (model.stack, "self")
    for layer, probs in enumerate(reference):
        one = layer_map(model, x, layer)
        assert one.shape == (4, 50, 50) and one.dtype == torch.float32
        np.testing.assert_allclose(one.numpy(), probs[0].numpy(), atol=1e-6)
    with pytest.raises(IndexError, match="layer 2 is out of range"):
        layer_map(model, x, 2)
    with pytest.raises(ValueError, match="one text"):
        layer_map(model, x.expand(2, -1), 0)


@pytest.mark.parametrize("n, size, first, width", [(40, 8, 10, 25), (40, 8, 15, 17), (37, 5, 9, 20), (12, 16, 4, 6)])
def test_a_block_that_starts_past_key_0_pools_as_if_zeros_stood_before_it(n, size, first, width):
    """A sliding window's block holds keys first .. first + width - 1 only; pooling it must equal pooling the
    whole row with zeros before and after (every path: equal bins, running sums, no pooling)."""
    block = torch.rand(3, 5, width, generator=torch.Generator().manual_seed(n + first))
    whole = torch.nn.functional.pad(block, (first, n - first - width))
    torch.testing.assert_close(pool_columns(block, n, size, first), pool_columns(whole, n, size), atol=1e-6, rtol=1e-5)
