"""The families with named attention terms against transformers' eager fp32 forward on the same tiny random weights:
logits within 1e-4 and every attention map within 1e-5, unpadded and left-padded, and with the KV cache."""
import inspect

import pytest
import torch

from core import load_model
from tests import tiny

LOGITS_TOL, ATTENTION_TOL = 1e-4, 1e-5

DECODERS, SEQ2SEQ = tiny.FAMILY_DECODERS, tiny.FAMILY_SEQ2SEQ
# a decoder deeper than its encoder: forward only (transformers' generate sizes its cache by the encoder's depth)
SEQ2SEQ_FORWARD = {**SEQ2SEQ, "t5-deeper-decoder": lambda: tiny.t5(num_decoder_layers=3)}


@pytest.fixture(scope="module")
def pairs():
    """name → (transformers model, our model on the same weights), built once per module."""
    made = {name: tiny.family_pair(name) for name in {**DECODERS, **SEQ2SEQ}}
    hf = SEQ2SEQ_FORWARD["t5-deeper-decoder"]()
    made["t5-deeper-decoder"] = (hf, load_model(tiny.save(hf), device="cpu", dtype=torch.float32))
    return made


def left_padded(batch=2, n=13, pad=4, seed=0):
    ids = torch.randint(3, tiny.VOCAB - 1, (batch, n), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    return ids, mask


def worst(ours, theirs, rows=None):
    if rows is not None:
        ours, theirs = ours[rows], theirs[rows]
    return (ours.float() - theirs.float()).abs().max().item()


def hf_forward(hf, ids, mask, **kw):
    """transformers' forward; position ids from the mask for the families that take them (as generate makes them),
    so left padding shifts no position."""
    if mask is not None and "position_ids" in inspect.signature(hf.forward).parameters:
        kw["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask, output_attentions=True, **kw)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder_matches_transformers(pairs, name, padded):
    hf, model = pairs[name]
    ids, mask = left_padded()
    mask = mask if padded else None
    ref = hf_forward(hf, ids, mask)
    out = model(ids, attention_mask=mask, capture_attention=True)
    rows = None if mask is None else mask.bool()
    assert worst(out.logits, ref.logits, rows) <= LOGITS_TOL, "logits"
    assert len(out.attentions) == len(ref.attentions)
    for layer, (a, b) in enumerate(zip(out.attentions, ref.attentions)):
        a, b = a.transpose(1, 2), b.transpose(1, 2)                  # [B, Tq, H, Tk]: pick real query rows
        assert worst(a, b, rows) <= ATTENTION_TOL, f"attention layer {layer}"
    fast = model(ids, attention_mask=mask).logits                    # the fused path, no probabilities
    assert worst(fast, ref.logits, rows) <= LOGITS_TOL, "fast path"


@pytest.mark.parametrize("name", list(SEQ2SEQ_FORWARD))
def test_seq2seq_matches_transformers(pairs, name):
    hf, model = pairs[name]
    ids, mask = left_padded(n=12)
    mask[1] = mask[1].flip(0)                                         # T5 pads on the right
    decoder_ids = torch.randint(3, tiny.VOCAB - 1, (2, 7), generator=torch.Generator().manual_seed(1))
    ref = hf_forward(hf, ids, mask, decoder_input_ids=decoder_ids)
    out = model(ids, attention_mask=mask, decoder_input_ids=decoder_ids, capture_attention=True)
    assert worst(out.logits, ref.logits) <= LOGITS_TOL
    source_rows = mask.bool()
    for a, b in zip(out.encoder_attentions, ref.encoder_attentions):
        assert worst(a.transpose(1, 2), b.transpose(1, 2), source_rows) <= ATTENTION_TOL, "encoder"
    for a, b in zip(out.attentions, ref.decoder_attentions):
        assert worst(a, b) <= ATTENTION_TOL, "decoder self-attention"
    for a, b in zip(out.cross_attentions, ref.cross_attentions):
        assert worst(a, b) <= ATTENTION_TOL, "cross-attention"


@pytest.mark.parametrize("name", list(DECODERS))
def test_cached_logits_equal_uncached(pairs, name):
    """Prefill 5 tokens, then one at a time through the cache (windows, biases and caps on cached keys)."""
    _, model = pairs[name]
    ids, mask = left_padded(n=13, pad=3)
    full = model(ids, attention_mask=mask).logits
    cache = model.new_cache(2, 13)
    chunks = [(0, 5)] + [(i, i + 1) for i in range(5, 13)]
    with torch.inference_mode():
        for a, b in chunks:
            hidden = model.run_stack(model.stack, ids[:, a:b], mask[:, :b], kind="self", causal=True, cache=cache)
            assert worst(model.logits(hidden), full[:, a:b], mask[:, a:b].bool()) <= 1e-5, f"positions {a}..{b}"


@pytest.mark.parametrize("name", list(DECODERS))
def test_greedy_equals_transformers_generate(pairs, name):
    """32 greedy tokens through the static one-token decode step equal transformers' generate, token for token."""
    hf, model = pairs[name]
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(3))
    ours = model.generate(ids, 32, stop=None)
    with torch.no_grad():
        ref = hf.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False, num_beams=1,
                          pad_token_id=0, eos_token_id=None)
    width = min(ours.shape[1], ref.shape[1])
    assert torch.equal(ours[:, :width], ref[:, :width]), f"\nours {ours.tolist()}\nref  {ref.tolist()}"


@pytest.mark.parametrize("name", list(SEQ2SEQ))
def test_seq2seq_greedy_equals_transformers_generate(pairs, name):
    hf, model = pairs[name]
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 9), generator=torch.Generator().manual_seed(4))
    ours = model.generate(ids, 24)
    with torch.no_grad():
        ref = hf.generate(ids, max_new_tokens=24, do_sample=False, num_beams=1)
    width = min(ours.shape[1], ref.shape[1])
    assert width > 1 and torch.equal(ours[:, :width], ref[:, :width]), f"\nours {ours.tolist()}\nref  {ref.tolist()}"


def test_the_terms_each_family_uses_are_on(pairs):
    """The configs above really switch the terms on, so the parity tests cover them."""
    cfg = {name: model.config for name, (_, model) in pairs.items()}
    assert cfg["gpt_neox-parallel"].parallel_block and cfg["gpt_neox-parallel"].rotary_dim == 6
    assert not cfg["gpt_neox-sequential"].parallel_block
    assert cfg["bloom"].score_bias == "alibi" and cfg["bloom"].positional == "none" and cfg["bloom"].n_heads == 6
    assert cfg["opt-post-ln"].norm_placement == "post" and cfg["opt-pre-ln"].position_offset == 2
    assert cfg["mistral-window"].sliding_window == 5 and set(cfg["mistral-window"].layer_types) == {"sliding"}
    assert cfg["qwen3"].qk_norm and cfg["qwen3"].layer_types == ()
    assert cfg["qwen3-window"].layer_types == ("full", "sliding", "sliding")
    assert cfg["phi3-window"].rotary_dim == 6 and cfg["phi3-window"].sliding_window == 5
    assert cfg["gemma2"].attn_softcap == 5.0 and cfg["gemma2"].final_softcap == 3.0 and cfg["gemma2"].sandwich_norm
    assert cfg["gemma2"].layer_types == ("sliding", "full", "sliding", "full")
    assert cfg["gemma3"].qk_norm and cfg["gemma3"].rope_local_theta == 500.0 and cfg["gemma3"].rope_theta == 50000.0
    assert cfg["t5-relu"].score_bias == "relative" and cfg["t5-relu"].lm_head_scale != 1.0
    assert cfg["t5-gated-gelu"].gated_ffn and cfg["t5-gated-gelu"].lm_head_scale == 1.0
    assert cfg["t5-deeper-decoder"].n_layers == 3 and cfg["t5-deeper-decoder"].n_encoder_layers == 2


@pytest.mark.parametrize("name", ["mistral-window", "gemma2", "bloom", "phi3-window"])
def test_block_by_block_capture_equals_the_explicit_path(pairs, name):
    """The long-text path (core.attention.attention_rows, 256 query rows at a time) on 600 tokens: windows skip
    the keys before them, biases and caps are sliced per block, and every probability equals the explicit path."""
    from core.analysis.capture import LayerObserver
    _, model = pairs[name]
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 600), generator=torch.Generator().manual_seed(5))
    explicit = model(ids, capture_attention=True).attentions
    for layer in range(model.config.n_layers):
        observer = LayerObserver(layer)
        with torch.inference_mode():
            model(ids, observer=observer)
        assert worst(observer.probs, explicit[layer][0]) <= 1e-5, f"layer {layer}"
