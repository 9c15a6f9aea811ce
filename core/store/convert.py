"""A llama- or gemma3-architecture GGUF file -> a Hugging Face folder (config.json, model.safetensors, tokenizer).

Each architecture is a layout: its config reader, its tensor-name table, the shapes its config implies and a
per-tensor transform (llama: undo the q/k row permutation; gemma3, in convert_gemma3.py: undo the norms' offset).
Tensors are dequantised to float32 with gguf.dequantize and llama.cpp's q/k row permutation is undone,
exactly as transformers' own GGUF reader does, so the folder loads the same weights as
`from_pretrained(..., gguf_file=...)`.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from gguf import GGUFValueType, dequantize
from gguf.gguf_reader import GGUFReader  # the class, even while a test rebinds gguf.GGUFReader (parsed_once)
from safetensors.torch import save_file

from .convert_gemma3 import GEMMA3_GGUF_NAMES, gemma3_config_from_gguf, gemma3_expected_shapes, gemma3_tensor
from .errors import WeightsError
from .progress import Progress, no_progress

# GGUF tensor name -> Hugging Face Llama name; {} is the layer index.
LLAMA_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
}
GGUF_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


class PlainGGUFReader(GGUFReader):
    """gguf's GGUFReader parsing a plain array view of its memory map: the same parse of the same bytes, about 3
    times faster.

    The reader slices its np.memmap once per value it parses, and each slice of a memmap runs numpy's Python-level
    memmap bookkeeping (memmap.__getitem__, __array_finalize__); Gemma 3's 262,144-token vocabulary is about
    790,000 slices, 15 s here, and 5 s on an ndarray view of the same mapping (which keeps the map open as its
    base). Fields and tensor data are then ndarray views of the file instead of memmap ones: equal values, read
    alike by gguf.dequantize and by transformers."""

    @property
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, mapped: np.ndarray) -> None:
        self._plain = mapped.view(np.ndarray)


def _gguf_value(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    if field.types and field.types[0] == GGUFValueType.FLOAT32:
        value = float(str(np.float32(value)))  # the shortest decimal: 1e-05, not 9.999999747378752e-06
    return value


def llama_config_from_gguf(reader) -> dict:
    """config.json for a llama GGUF, from its llama.* metadata; head_dim is read, never assumed."""
    arch = _gguf_value(reader, "general.architecture")
    if arch != "llama":
        raise WeightsError(f"GGUF architecture {arch!r} is not supported; the store converts 'llama' GGUF files only")
    if _gguf_value(reader, "llama.rope.scaling.type", "none") != "none":
        raise WeightsError("the GGUF uses RoPE scaling, which the converter does not carry over; only plain RoPE")
    hidden = _gguf_value(reader, "llama.embedding_length")
    heads = _gguf_value(reader, "llama.attention.head_count")
    head_dim = _gguf_value(reader, "llama.attention.key_length") or _gguf_value(
        reader, "llama.rope.dimension_count", hidden // heads
    )
    vocab = _gguf_value(reader, "llama.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    rope_theta = _gguf_value(reader, "llama.rope.freq_base", 10000.0)
    eos = _gguf_value(reader, "tokenizer.ggml.eos_token_id")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": _gguf_value(reader, "llama.feed_forward_length"),
        "num_hidden_layers": _gguf_value(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _gguf_value(reader, "llama.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _gguf_value(reader, "llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "max_position_embeddings": _gguf_value(reader, "llama.context_length"),
        "vocab_size": vocab,
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": _gguf_value(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": _gguf_value(reader, "tokenizer.ggml.padding_token_id", eos),
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _hf_tensor_name(gguf_name: str, names: dict[str, str] = LLAMA_GGUF_NAMES) -> str:
    match = GGUF_LAYER.match(gguf_name)
    key, layer = (f"blk.{{}}.{match.group(2)}", match.group(1)) if match else (gguf_name, None)
    if key not in names:
        raise WeightsError(f"GGUF tensor {gguf_name!r} has no Hugging Face name; known: {sorted(names)}")
    return names[key].format(layer)


def unpermute_rope_rows(weight, n_head: int):
    """Undo llama.cpp's q/k row permutation (its convert_hf_to_gguf.py `permute`).

    llama.cpp stores each head's rows as interleaved (even, odd) rotary pairs; Hugging Face keeps the
    two halves apart ("rotate_half"). [n_head*head_dim, d_in] -> view [n_head, head_dim/2, 2, d_in],
    swap the middle axes -> [n_head, 2, head_dim/2, d_in] -> back to [n_head*head_dim, d_in].
    """
    rows = weight.shape[0]
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, d)
    per_layer = {
        "input_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (q, d),
        "self_attn.k_proj.weight": (kv, d),
        "self_attn.v_proj.weight": (kv, d),
        "self_attn.o_proj.weight": (d, q),
        "post_attention_layernorm.weight": (d,),
        "mlp.gate_proj.weight": (f, d),
        "mlp.up_proj.weight": (f, d),
        "mlp.down_proj.weight": (d, f),
    }
    for i in range(config["num_hidden_layers"]):
        shapes.update({f"model.layers.{i}.{k}": s for k, s in per_layer.items()})
    return shapes


def _llama_tensor(name: str, weight, config: dict):
    if name.endswith("q_proj.weight"):
        return unpermute_rope_rows(weight, config["num_attention_heads"])
    if name.endswith("k_proj.weight"):
        return unpermute_rope_rows(weight, config["num_key_value_heads"])
    return weight


@dataclass(frozen=True)
class GgufLayout:
    """How one GGUF architecture becomes a Hugging Face folder."""
    config: Callable       # reader -> config.json
    names: dict[str, str]  # GGUF tensor name ({} the layer) -> Hugging Face name
    shapes: Callable       # config -> {Hugging Face name: shape}
    tensor: Callable       # (Hugging Face name, float32 array, config) -> the array to save


LAYOUTS = {
    "llama": GgufLayout(llama_config_from_gguf, LLAMA_GGUF_NAMES, _expected_shapes, _llama_tensor),
    "gemma3": GgufLayout(lambda reader: gemma3_config_from_gguf(reader, _gguf_value), GEMMA3_GGUF_NAMES,
                         gemma3_expected_shapes, gemma3_tensor),
}


def convert_gguf(gguf_path: Path, out_dir: Path, progress: Progress = no_progress) -> dict:
    """Write config.json, model.safetensors (float32) and tokenizer files into out_dir; returns the config."""
    reader = PlainGGUFReader(gguf_path)
    arch = _gguf_value(reader, "general.architecture")
    if arch not in LAYOUTS:
        raise WeightsError(f"GGUF architecture {arch!r} is not supported; the store converts {sorted(LAYOUTS)}")
    layout = LAYOUTS[arch]
    config = layout.config(reader)
    expected = layout.shapes(config)
    tensors = {}
    for i, tensor in enumerate(reader.tensors):
        progress(0.8 * i / len(reader.tensors), f"dequantising {tensor.name} ({tensor.tensor_type.name})")
        name = _hf_tensor_name(tensor.name, layout.names)
        weight = layout.tensor(name, dequantize(tensor.data, tensor.tensor_type), config)  # float32 [out, in]
        if name not in expected or tuple(weight.shape) != expected[name]:
            raise WeightsError(
                f"{gguf_path.name}: tensor {tensor.name} -> {name} has shape {tuple(weight.shape)}, "
                f"config.json implies {expected.get(name, 'no such tensor')}"
            )
        weight = np.ascontiguousarray(weight, dtype=np.float32)  # dequantize's own arrays already are: no copy
        if not weight.flags.writeable:  # an F32 tensor comes back as a view of the read-only file map
            weight = weight.copy()
        tensors[name] = torch.from_numpy(weight)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise WeightsError(f"{gguf_path.name} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    progress(0.8, "writing model.safetensors")
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    progress(0.85, "building the tokenizer")
    write_gguf_tokenizer(gguf_path, out_dir, config)
    progress(1.0, "converted")
    return config


def _gguf_tokenizer(gguf_path: Path, config: dict):
    """transformers' tokenizer for the GGUF file, built by the tokenizer class of config.json's model type.
    AutoTokenizer would find that class by parsing the whole file once more (for Gemma 3, whose vocabulary is
    262,144 tokens, about 20 s here), to learn the model type config.json already names."""
    from transformers import AutoTokenizer  # noqa: PLC0415 - slow to import, needed only here
    from transformers.models.auto.tokenization_auto import (  # noqa: PLC0415
        TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name)

    named = TOKENIZER_MAPPING_NAMES.get(config.get("model_type", ""))
    names = [named] if isinstance(named, str) else [n for n in (named or ()) if n]
    tokenizer_class = next((c for c in map(tokenizer_class_from_name, names) if c is not None), AutoTokenizer)
    return tokenizer_class.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def write_gguf_tokenizer(gguf_path: Path, out_dir: Path, config: dict) -> None:
    """tokenizer.json and tokenizer_config.json (special tokens, chat template) from the GGUF vocabulary.

    transformers' GGUF tokenizer reader builds the fast tokenizer; we save it and rewrite its config
    so that the folder loads the same tokenizer without the GGUF file.
    """
    tokenizer = _gguf_tokenizer(gguf_path, config)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".tokenizer-") as scratch:
        tokenizer.save_pretrained(scratch)
        shutil.copyfile(Path(scratch) / "tokenizer.json", out_dir / "tokenizer.json")
        saved = json.loads((Path(scratch) / "tokenizer_config.json").read_text())
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }
    for key in ("bos_token", "eos_token", "unk_token", "pad_token", "add_bos_token", "add_eos_token"):
        if saved.get(key) is not None:
            tokenizer_config[key] = saved[key]
    if tokenizer.chat_template:
        tokenizer_config["chat_template"] = tokenizer.chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")


