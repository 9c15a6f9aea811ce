"""The sink term of the attention function (a learned logit per head in each row's denominator, as gpt-oss has it),
against transformers' own gpt-oss attention on the same tensors, on both paths and in a model that learns it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from core.attention import attention, attention_rows, causal_mask
from core.config import ModelConfig
from core.model import Transformer

gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss",
                              reason="this transformers has no gpt-oss, the reference for the sink term")


def tensors(seed=0, heads=4, kv_heads=2, n=7, d=8):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, n, d, generator=gen)
    k, v = torch.randn(2, kv_heads, n, d, generator=gen), torch.randn(2, kv_heads, n, d, generator=gen)
    return q, k, v, torch.randn(heads, generator=gen) * 2


def reference(q, k, v, sinks, allowed):
    """transformers' eager gpt-oss attention: its module reads num_key_value_groups and sinks."""
    module = SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], sinks=sinks, training=False)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    out, weights = gpt_oss.eager_attention_forward(module, q, k, v, additive, scaling=q.shape[-1] ** -0.5)
    return out.transpose(1, 2), weights   # its output is [B, T, H, d]


def test_the_sink_term_equals_gpt_oss_with_gqa_a_causal_mask_and_a_window():
    q, k, v, sinks = tensors()
    n = q.shape[2]
    window = causal_mask(n, n) & (torch.arange(n)[:, None] - torch.arange(n)[None, :] < 3)
    for allowed, kwargs in ((causal_mask(n, n), {"is_causal": True}), (window, {"is_causal": True, "window": 3})):
        want_out, want_probs = reference(q, k, v, sinks, allowed)
        out, probs = attention(q, k, v, sink=sinks, return_probs=True, **kwargs)
        torch.testing.assert_close(probs, want_probs, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(out, want_out, atol=1e-6, rtol=1e-5)
        fast, none = attention(q, k, v, sink=sinks, **kwargs)   # the sink takes the explicit path either way
        torch.testing.assert_close(fast, want_out, atol=1e-6, rtol=1e-5)
        # a row's weights sum to 1 minus what the sink took, and the sink took some in every row
        share = 1 - probs.sum(-1)
        assert (share > 0).all() and (share < 1).all()


def test_the_rows_path_equals_the_whole_matrix_with_a_sink():
    q, k, v, sinks = tensors(seed=1, n=11)
    out, probs = attention(q, k, v, is_causal=True, sink=sinks, return_probs=True, window=4)
    for start, block, out_block, first in attention_rows(q, k, v, None, True, q.shape[-1] ** -0.5, 3,
                                                         window=4, sink=sinks):
        stop = start + block.shape[2]
        torch.testing.assert_close(block, probs[:, :, start:stop, first:first + block.shape[-1]], atol=1e-6,
                                   rtol=1e-5)
        torch.testing.assert_close(out_block, out[:, :, start:stop], atol=1e-6, rtol=1e-5)


def test_a_very_low_sink_is_plain_softmax_and_a_row_with_no_key_gives_zeros():
    q, k, v, _ = tensors(seed=2)
    plain, plain_probs = attention(q, k, v, is_causal=True, return_probs=True)
    low = torch.full((q.shape[1],), -1e4)
    out, probs = attention(q, k, v, is_causal=True, return_probs=True, sink=low)
    torch.testing.assert_close(probs, plain_probs)
    torch.testing.assert_close(out, plain)
    none = torch.zeros(1, 1, q.shape[2], k.shape[2], dtype=torch.bool)
    _, empty = attention(q, k, v, none, sink=torch.zeros(q.shape[1]), return_probs=True)
    assert torch.equal(empty, torch.zeros_like(empty))


def test_a_key_only_sink_is_a_key_with_a_zero_value_appended_to_every_row():
    """The sink scored per row (a learned key k_s per head, s = q·k_s·scale) against plain softmax over the keys
    with k_s appended and a zero value: the same output, and the same weights on the real keys."""
    q, k, v, _ = tensors(seed=3, kv_heads=4)
    gen = torch.Generator().manual_seed(4)
    sink_key = torch.randn(q.shape[1], q.shape[-1], generator=gen)
    scale = q.shape[-1] ** -0.5
    logits = (q * sink_key[None, :, None, :]).sum(-1, keepdim=True) * scale                    # [B, H, T, 1]
    out, probs = attention(q, k, v, is_causal=True, sink=logits, return_probs=True)
    n = q.shape[2]
    appended_k = torch.cat([k, sink_key[None, :, None, :].expand(2, -1, 1, -1)], dim=2)
    appended_v = torch.cat([v, torch.zeros(2, v.shape[1], 1, v.shape[-1])], dim=2)
    allowed = torch.cat([causal_mask(n, n), torch.ones(n, 1, dtype=torch.bool)], dim=1)
    want_out, want_probs = attention(q, appended_k, appended_v, allowed, return_probs=True)
    torch.testing.assert_close(out, want_out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(probs, want_probs[..., :n], atol=1e-6, rtol=1e-5)
    for start, block, out_block, first in attention_rows(q, k, v, None, True, scale, 3, sink=logits):
        torch.testing.assert_close(block, probs[:, :, start:start + block.shape[2], first:first + block.shape[-1]],
                                   atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("sinks, shape", [("logit", (4,)), ("key", (4, 4))])
def test_a_model_with_sinks_has_one_per_head_and_learns_it(sinks, shape):
    cfg = ModelConfig(family="llama", n_layers=2, n_heads=4, n_kv_heads=4, d_model=16, head_dim=4, d_ff=32,
                      vocab_size=20, max_positions=64, positional="rope", norm="rmsnorm", norm_placement="pre",
                      causal=True, is_encoder_decoder=False, attention_sinks=sinks)
    torch.manual_seed(0)
    model = Transformer(cfg)
    for p in model.parameters():   # a built model's tensors are uninitialised until weights are loaded
        torch.nn.init.normal_(p, std=0.2)
    sinks = [block.attn.sinks for block in model.stack.blocks]
    assert all(s.shape == shape for s in sinks)
    ids = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = model(ids).logits
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 20), ids[:, 1:].reshape(-1)).backward()
    assert all(s.grad is not None and s.grad.abs().sum() > 0 for s in sinks)
