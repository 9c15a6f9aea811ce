"""What the four switches and the two attention paths do, on tiny random models."""
import math

import pytest
import torch

from core import load_model
from core.attention import attention, attention_rows, attention_stages, causal_mask
from core.analysis.inspect import queries_keys
from core.layers import apply_rope, rope_inv_freq, sinusoidal_encoding
from tests import tiny


@pytest.fixture(scope="module")
def models():
    return {name: load_model(tiny.save(getattr(tiny, name)()), device="cpu") for name in ("gpt2", "llama", "bert")}


def ids(batch=2, n=10, seed=0):
    return torch.randint(3, tiny.VOCAB - 1, (batch, n), generator=torch.Generator().manual_seed(seed))


def test_explicit_path_equals_fast_path_for_gqa():
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 6, 9, 8, generator=gen), torch.randn(2, 2, 9, 8, generator=gen), torch.randn(2, 2, 9, 8, generator=gen)
    allowed = torch.rand(2, 1, 9, 9, generator=gen) > 0.3
    allowed[..., 0] = True
    for mask, causal in ((None, True), (allowed, False), (allowed, True), (None, False)):
        fast, none = attention(q, k, v, mask, causal)
        slow, probs = attention(q, k, v, mask, causal, return_probs=True)
        assert none is None and probs.shape == (2, 6, 9, 9)
        torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)


def test_stages_follow_equation_2_1():
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 4, 16, generator=gen), torch.randn(1, 1, 4, 16, generator=gen)
    allowed = causal_mask(4, 4)
    scores, masked, probs = attention_stages(q, k, allowed, 1 / math.sqrt(16))
    torch.testing.assert_close(scores, q @ k.transpose(-1, -2) / 4)
    assert torch.isneginf(masked[0, 0, 0, 1:]).all() and torch.equal(masked[0, 0, 3], scores[0, 0, 3])
    torch.testing.assert_close(probs, torch.softmax(masked, -1))


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_rows_sum_to_one_and_masked_entries_are_zero(models, name):
    model = models[name]
    x = ids()
    mask = torch.ones_like(x)
    mask[1, :4] = 0  # left padding on the second row
    out = model(x, attention_mask=mask, capture_attention=True)
    for probs in out.attentions:
        torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
        assert (probs[1, :, 4:, :4] == 0).all(), "real tokens put weight on padding"
        if model.config.causal:
            future = ~causal_mask(x.shape[1], x.shape[1])
            assert (probs[:, :, future] == 0).all(), "a causal model looked ahead"


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_without_causal_mask_first_position_sees_the_future(models, name):
    model = models[name]
    x = ids()
    masked = model(x, capture_attention=True).attentions[0]
    open_ = model(x, capture_attention=True, causal_mask=False).attentions[0]
    assert torch.equal(masked[:, :, 0, 0], torch.ones_like(masked[:, :, 0, 0]))
    assert (open_[:, :, 0, 1:].sum(-1) > 0.05).all()
    # position 0's output now depends on later tokens
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % tiny.VOCAB
    a = model(x, causal_mask=False).hidden_states[:, 0]
    b = model(changed, causal_mask=False).hidden_states[:, 0]
    assert (a - b).abs().max() > 1e-4
    assert torch.equal(model(x).hidden_states[:, 0], model(changed).hidden_states[:, 0])


def test_padding_mask_switch_lets_attention_reach_padding(models):
    model = models["bert"]
    x = ids()
    mask = torch.ones_like(x)
    mask[1, 6:] = 0
    off = model(x, attention_mask=mask, padding_mask=False, capture_attention=True).attentions[0]
    assert (off[1, :, :6, 6:].sum(-1) > 0).all()
    on = model(x, attention_mask=mask, capture_attention=True).attentions[0]
    assert (on[1, :, :, 6:] == 0).all()


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_without_positions_attention_is_permutation_equivariant(models, name):
    """Self-attention without positional information: permuting the tokens permutes the outputs."""
    model = models[name]
    x = ids(batch=1, n=9)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(3))
    off = dict(positions=False, causal_mask=False)
    out = model(x, **off).hidden_states
    permuted = model(x[:, perm], **off).hidden_states
    torch.testing.assert_close(permuted, out[:, perm], atol=1e-5, rtol=1e-4)
    with_positions = model(x[:, perm], causal_mask=False).hidden_states
    assert (with_positions - out[:, perm]).abs().max() > 1e-3, "positions should break the symmetry"


def test_scale_switch_changes_only_the_factor(models):
    model = models["llama"]
    x = ids(batch=1)
    q, k = queries_keys(model, x, layer=0)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    allowed = causal_mask(x.shape[1], x.shape[1])
    _, _, unscaled = attention_stages(q, k, allowed, 1.0)
    captured = model(x, scale=False, capture_attention=True).attentions[0]
    torch.testing.assert_close(captured, unscaled, atol=1e-6, rtol=1e-5)
    _, _, scaled = attention_stages(q, k, allowed, model.config.head_dim ** -0.5)
    torch.testing.assert_close(model(x, capture_attention=True).attentions[0], scaled, atol=1e-6, rtol=1e-5)


def test_sinusoidal_encoding_values():
    pe = sinusoidal_encoding(4, 6)
    assert pe.shape == (4, 6)
    assert torch.allclose(pe[0], torch.tensor([0.0, 1.0] * 3))
    # the theory's erratum: 10000^(2/6) ≈ 21.54, so PE(1, 2) = sin(1/21.54) ≈ 0.046
    assert abs(pe[1, 2].item() - math.sin(1 / 10000 ** (2 / 6))) < 1e-6 and abs(pe[1, 2].item() - 0.046) < 5e-4


def test_rope_matches_transformers():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    from transformers import LlamaConfig
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, rope_theta=500.0)
    rotary = LlamaRotaryEmbedding(cfg)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 7, 16, generator=gen), torch.randn(2, 2, 7, 16, generator=gen)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 2, 3, 4]])
    cos, sin = rotary(q, pos)
    ref_q, ref_k = apply_rotary_pos_emb(q, k, cos, sin)
    inv = rope_inv_freq(16, 500.0)
    torch.testing.assert_close(apply_rope(q, pos, inv), ref_q, atol=1e-6, rtol=0)
    torch.testing.assert_close(apply_rope(k, pos, inv), ref_k, atol=1e-6, rtol=0)


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_row_blocks_equal_the_explicit_path(causal, padded):
    """attention_rows (used for long captures) gives the explicit path's probabilities, block by block,
    with grouped-query heads, a padding mask and more keys than queries (a cache)."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 6, 11, 8, generator=gen), torch.randn(2, 3, 14, 8, generator=gen), torch.randn(2, 3, 14, 8, generator=gen)
    allowed = torch.ones(2, 1, 1, 14, dtype=torch.bool)
    allowed[1, ..., :4] = False
    allowed = allowed if padded else None
    out, expected = attention(q, k, v, allowed, causal, scale=0.3, return_probs=True)
    blocks = list(attention_rows(q, k, v, allowed, causal, 0.3, rows=4))
    assert [start for start, _, _, _ in blocks] == [0, 4, 8] and {first for *_, first in blocks} == {0}
    padded_blocks = [torch.nn.functional.pad(b, (0, 14 - b.shape[-1])) for _, b, _, _ in blocks]
    assert not causal or [b.shape[-1] for _, b, _, _ in blocks] == [7, 11, 14]  # keys after a block are not scored
    torch.testing.assert_close(torch.cat(padded_blocks, dim=2), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(torch.cat([o for _, _, o, _ in blocks], dim=2), out, atol=1e-6, rtol=1e-5)
