"""Tiny random transformers models of every family, saved as safetensors folders, for parity tests."""
from __future__ import annotations

import tempfile

import torch
import transformers as tf

VOCAB = 97


class OneModel:
    """The model store as the Learn views read it, holding one loaded model."""

    def __init__(self, model):
        self.model = model

    def get(self, name, progress=None):
        return self.model

    def key(self, name):
        return name


class Ticking:
    """A clock for a time cap that moves one second each time it is read (0, 1, 2, …): tests that never sleep."""

    def __init__(self):
        self.now = -1.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def spread_weights(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Re-draw every weight with a larger spread than transformers' init, so differences would show."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:  # Marian's fixed sinusoids are not learned weights (OPT's positions are)
                continue
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim == 1 and name.endswith("weight"):  # norm gains stay near 1
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.15 * noise)
        for name, buf in model.named_buffers():
            if name.endswith("final_logits_bias"):
                buf.copy_(0.1 * torch.randn(buf.shape, generator=gen))
    return model.eval()


def save(model: torch.nn.Module, folder: str | None = None) -> str:
    folder = folder or tempfile.mkdtemp(prefix="tiny-")
    model.save_pretrained(folder)
    return folder


def gpt2(**kw):
    base = dict(vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=4, n_positions=128, bos_token_id=1, eos_token_id=2,
                attn_implementation="eager")
    cfg = tf.GPT2Config(**{**base, **kw})
    return spread_weights(tf.GPT2LMHeadModel(cfg))


def llama(kind: str = "llama", **kw):
    base = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                attn_implementation="eager")
    base.update(kw)
    if kind == "qwen2":
        return spread_weights(tf.Qwen2ForCausalLM(tf.Qwen2Config(**base)))
    return spread_weights(tf.LlamaForCausalLM(tf.LlamaConfig(**base)))


def bert(mlm: bool = True, **kw):
    cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128, attn_implementation="eager", **kw)
    return spread_weights(tf.BertForMaskedLM(cfg) if mlm else tf.BertModel(cfg, add_pooling_layer=True))


def marian(**kw):
    base = dict(vocab_size=VOCAB, d_model=48, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=64, max_position_embeddings=128,
                pad_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 1, eos_token_id=2, scale_embedding=True,
                attn_implementation="eager")
    cfg = tf.MarianConfig(**{**base, **kw})
    return spread_weights(tf.MarianMTModel(cfg))


# ---- the families with named attention terms (each small, each exercising its terms) ----

DECODER = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
               max_position_embeddings=256, bos_token_id=1, eos_token_id=2, attn_implementation="eager")


def gpt_neox(**kw):
    base = {**DECODER, "rotary_pct": 0.5, "tie_word_embeddings": False, **kw}
    return spread_weights(tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**base)))


def bloom(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=48, n_layer=3, n_head=6, bos_token_id=1, eos_token_id=2,
                attn_implementation="eager", **kw)
    return spread_weights(tf.BloomForCausalLM(tf.BloomConfig(**base)))


def opt(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=3, num_attention_heads=4, ffn_dim=96,
                max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2, word_embed_proj_dim=48,
                attn_implementation="eager", **kw)
    return spread_weights(tf.OPTForCausalLM(tf.OPTConfig(**base)))


def mistral(**kw):
    base = {**DECODER, "num_key_value_heads": 2, "sliding_window": 5, **kw}
    return spread_weights(tf.MistralForCausalLM(tf.MistralConfig(**base)))


def qwen3(**kw):
    base = {**DECODER, "num_key_value_heads": 2, "head_dim": 16, **kw}
    return spread_weights(tf.Qwen3ForCausalLM(tf.Qwen3Config(**base)))


def phi3(**kw):
    base = {**DECODER, "num_key_value_heads": 2, "pad_token_id": 0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, **kw}
    return spread_weights(tf.Phi3ForCausalLM(tf.Phi3Config(**base)))


def gemma(version: int = 1, **kw):
    base = {**DECODER, "num_key_value_heads": 2, "head_dim": 16, "pad_token_id": 0, "num_hidden_layers": 4, **kw}
    if version == 1:
        return spread_weights(tf.GemmaForCausalLM(tf.GemmaConfig(**base)))
    base = {"sliding_window": 4, "query_pre_attn_scalar": 24, **base}
    if version == 2:
        base = {"attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0, **base}
        return spread_weights(tf.Gemma2ForCausalLM(tf.Gemma2Config(**base)))
    base = {"sliding_window_pattern": 2, "rope_theta": 50000.0, "rope_local_base_freq": 500.0, **base}
    return spread_weights(tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**base)))


def t5(**kw):
    base = dict(vocab_size=VOCAB, d_model=48, d_kv=16, d_ff=96, num_layers=2, num_decoder_layers=2, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=20, pad_token_id=0, eos_token_id=2,
                decoder_start_token_id=0, attn_implementation="eager")
    return spread_weights(tf.T5ForConditionalGeneration(tf.T5Config(**{**base, **kw})))


# one small model of each family with named terms, every term live on a text of 13 tokens; analyses' tests
# loop over these (the parity tests in tests/core/test_families.py use them too)
FAMILY_DECODERS = {
    "gpt_neox-parallel": lambda: gpt_neox(),
    "gpt_neox-sequential": lambda: gpt_neox(use_parallel_residual=False, rotary_pct=0.25),
    "bloom": lambda: bloom(),
    "opt-pre-ln": lambda: opt(),
    "opt-post-ln": lambda: opt(do_layer_norm_before=False),
    "mistral-window": lambda: mistral(),
    "qwen3": lambda: qwen3(),
    "qwen3-window": lambda: qwen3(use_sliding_window=True, sliding_window=4, max_window_layers=1),
    "phi3-window": lambda: phi3(sliding_window=5),
    "gemma": lambda: gemma(1),
    "gemma2": lambda: gemma(2),
    "gemma3": lambda: gemma(3),
}
FAMILY_SEQ2SEQ = {"t5-relu": lambda: t5(), "t5-gated-gelu": lambda: t5(feed_forward_proj="gated-gelu",
                                                                       tie_word_embeddings=False)}
_FAMILY_PAIRS: dict = {}


def family_pair(name: str):
    """(transformers model, our model on the same weights) for a name of FAMILY_DECODERS or FAMILY_SEQ2SEQ,
    built once per test process."""
    if name not in _FAMILY_PAIRS:
        from core import load_model
        hf = {**FAMILY_DECODERS, **FAMILY_SEQ2SEQ}[name]()
        _FAMILY_PAIRS[name] = (hf, load_model(save(hf), device="cpu", dtype=torch.float32))
    return _FAMILY_PAIRS[name]
