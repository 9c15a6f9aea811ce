"""Tiny random transformers models of every family, saved as safetensors folders, for parity tests."""
from __future__ import annotations

import tempfile

import torch
import transformers as tf

VOCAB = 97


def spread_weights(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Re-draw every weight with a larger spread than transformers' init, so differences would show."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:  # Marian's fixed sinusoids are not learned weights
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
