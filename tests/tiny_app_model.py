"""Tiny random models for the app's API and browser tests, built offline in a temporary folder.

A 2-layer Llama (RoPE, grouped-query attention) and a 2-layer BERT (learned positions, bidirectional),
saved by transformers as safetensors with config.json, plus a small byte-level BPE tokenizer trained
here on a few sentences, so the tests need neither the hub nor the weight store. Their outputs are
random, but every view of the app runs on them exactly as on a real model, in a fraction of a second.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import torch

CORPUS = [
    "The lighthouse keeper rowed out to the rocks at dawn.",
    "When the storm passed, she climbed the stairs and lit the lamp again.",
    "Every morning the baker opens the shop at six, and the bread is warm.",
    "Attention lets every token look at every other token in one step.",
    "Positions are added to the embeddings, or rotated into queries and keys.",
    "A causal mask hides the future; a padding mask hides the filler.",
] * 20

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(folder: Path, bert_style: bool = False):
    """A byte-level BPE tokenizer (vocabulary ~400) with the special tokens each style of model expects."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = (
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        if bert_style
        else ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    )
    tok = Tokenizer(models.BPE(unk_token="[UNK]" if bert_style else None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    if bert_style:
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
        )
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            pad_token="[PAD]",
            unk_token="[UNK]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        )
    else:
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<|endoftext|>",
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            additional_special_tokens=["<|im_start|>"],
        )
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def build_tiny_llama(folder: Path, max_positions: int = 2048) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def build_tiny_bert(folder: Path, layers: int = 2, heads: int = 4) -> Path:
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder, bert_style=True)
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = BertModel(config, add_pooling_layer=False).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return folder


if __name__ == "__main__":
    import sys

    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny-app-models")
    print(build_tiny_llama(root / "tiny-llama"), build_tiny_bert(root / "tiny-bert"))


def build_tiny_marian(folder: Path) -> Path:
    """An encoder-decoder (the original Transformer's shape: sinusoidal positions, Post-LN, cross-attention)."""
    from transformers import MarianConfig, MarianMTModel

    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder)
    tok.chat_template = None
    tok.save_pretrained(folder)
    config = MarianConfig(
        vocab_size=len(tok),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        decoder_start_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        scale_embedding=True,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def launch_app(model_names: list[str], default: str):
    """Start the app in this process on a free loopback port, with the options `python app.py` uses.
    Returns (demo, url, services); call demo.close() when done."""
    import socket
    from argparse import Namespace

    import app
    from ui.page import build_page
    from ui.services import Services
    from ui.services.models import ModelStore
    from ui.settings import AppSettings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    services = Services.create(AppSettings.from_env(), ModelStore(extra_names=model_names))
    demo = build_page(services, default)
    demo.queue(max_size=app.QUEUE_SIZE, default_concurrency_limit=1)
    args = Namespace(host="127.0.0.1", port=port, share=False)
    _, url, _ = demo.launch(**app.launch_options(args, services.settings), prevent_thread_lock=True, quiet=True)
    return demo, url, services


def plotly_array(value) -> np.ndarray:
    """An array of a figure's JSON as the API returns it: a list, or the base64 typed array plotly writes for
    numpy data."""
    if isinstance(value, dict) and "bdata" in value:
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = [int(s) for s in str(value.get("shape", len(data))).split(",")]
        return data.reshape(shape)
    return np.asarray(value, dtype=np.float64)
