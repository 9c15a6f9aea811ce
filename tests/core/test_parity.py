"""The core against transformers' eager fp32 forward on the same tiny random weights, family by family."""
import pytest
import torch

from core import load_model
from tests import tiny

TOL = 1e-5


def positions(mask):
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def padded_batch(pad_side: str, lengths=(9, 5), seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, tiny.VOCAB - 1, (len(lengths), width), generator=gen)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        if pad_side == "left":
            mask[row, width - n:] = 1
        else:
            mask[row, :n] = 1
    return ids, mask


def assert_close(ours, theirs, what, rows=None):
    if rows is not None:  # compare only real (non-padding) query positions
        ours, theirs = ours[rows], theirs[rows]
    diff = (ours.float() - theirs.float()).abs().max().item()
    assert diff <= TOL, f"{what}: max |Δ| = {diff:.3g} > {TOL}"


def compare(hf_model, ids, mask=None, hf_extra=None, ours_extra=None, decoder_ids=None):
    folder = tiny.save(hf_model)
    model = load_model(folder, device="cpu", dtype=torch.float32)
    hf_kwargs = dict(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    if mask is not None and decoder_ids is None:
        hf_kwargs["position_ids"] = positions(mask)
    if decoder_ids is not None:
        hf_kwargs["decoder_input_ids"] = decoder_ids
    hf_kwargs.update(hf_extra or {})
    with torch.no_grad():
        ref = hf_model(**hf_kwargs)
    out = model(ids, attention_mask=mask, decoder_input_ids=decoder_ids, capture_attention=True, **(ours_extra or {}))
    rows = None if mask is None or decoder_ids is not None else mask.bool()
    if decoder_ids is None:
        hidden = ref.hidden_states[-1]
        attentions = ref.attentions
    else:
        hidden = ref.decoder_hidden_states[-1]
        attentions = ref.decoder_attentions
        source_rows = None if mask is None else mask.bool()  # padding positions' own rows are never used
        for i, (a, b) in enumerate(zip(out.encoder_attentions, ref.encoder_attentions)):
            assert_close(a.transpose(1, 2), b.transpose(1, 2), f"encoder attention layer {i}", source_rows)
        for i, (a, b) in enumerate(zip(out.cross_attentions, ref.cross_attentions)):
            assert_close(a, b, f"cross attention layer {i}")
        assert len(out.encoder_attentions) == len(ref.encoder_attentions)
    if getattr(ref, "logits", None) is not None:
        assert_close(out.logits, ref.logits, "logits", rows)
    else:
        assert out.logits is None
    assert_close(out.hidden_states, hidden, "hidden states", rows)
    assert len(out.attentions) == len(attentions)
    for i, (a, b) in enumerate(zip(out.attentions, attentions)):
        assert a.dtype == torch.float32
        assert a.shape == b.shape
        if rows is None:
            assert_close(a, b, f"attention layer {i}")
        else:
            assert_close(a.transpose(1, 2), b.transpose(1, 2), f"attention layer {i}", rows)
    # the fused fast path (no capture) gives the same numbers as the explicit one
    fast = model(ids, attention_mask=mask, decoder_input_ids=decoder_ids, **(ours_extra or {}))
    assert_close(fast.hidden_states, out.hidden_states, "fast path vs explicit path", rows)
    return model, out


GPT2_CASES = {"plain": {}, "relu": {"activation_function": "relu"}}
LLAMA_CASES = {
    "gqa": dict(num_attention_heads=4, num_key_value_heads=2),
    "mqa": dict(num_attention_heads=4, num_key_value_heads=1),
    "mha-untied": dict(num_key_value_heads=4, tie_word_embeddings=False),
    "head-dim-32": dict(head_dim=32, num_key_value_heads=2),
    "tied": dict(tie_word_embeddings=True),
    "attention-bias": dict(attention_bias=True, rope_theta=500.0),
    "mlp-bias": dict(mlp_bias=True),
}


@pytest.mark.parametrize("case", GPT2_CASES)
def test_gpt2_matches_transformers(case):
    ids = torch.randint(0, tiny.VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    compare(tiny.gpt2(**GPT2_CASES[case]), ids)


@pytest.mark.parametrize("case", LLAMA_CASES)
def test_llama_matches_transformers(case):
    ids = torch.randint(0, tiny.VOCAB, (2, 13), generator=torch.Generator().manual_seed(2))
    model, _ = compare(tiny.llama(**LLAMA_CASES[case]), ids)
    kw = LLAMA_CASES[case]
    assert model.config.n_kv_heads == kw.get("num_key_value_heads", 2)
    assert model.config.head_dim == kw.get("head_dim", 48 // 4)


def test_qwen2_biases_match_transformers():
    ids = torch.randint(0, tiny.VOCAB, (1, 10), generator=torch.Generator().manual_seed(3))
    model, _ = compare(tiny.llama("qwen2", num_key_value_heads=2, tie_word_embeddings=False), ids)
    assert model.config.qkv_bias and not model.config.out_bias


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_padded_batches_match_transformers(family, side):
    ids, mask = padded_batch(side)
    compare(getattr(tiny, family)(), ids, mask)


@pytest.mark.parametrize("mlm", [True, False])
def test_bert_matches_transformers(mlm):
    ids = torch.randint(0, tiny.VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    model, out = compare(tiny.bert(mlm=mlm), ids)
    assert model.config.has_lm_head == mlm and not model.config.causal


def test_marian_matches_transformers():
    gen = torch.Generator().manual_seed(5)
    ids, mask = padded_batch("right", (10, 6), seed=5)
    decoder_ids = torch.randint(3, tiny.VOCAB - 1, (2, 7), generator=gen)
    model, out = compare(tiny.marian(), ids, mask, decoder_ids=decoder_ids)
    assert model.config.is_encoder_decoder and model.config.positional == "sinusoidal"
    assert out.cross_attentions[0].shape == (2, 4, 7, 10)
