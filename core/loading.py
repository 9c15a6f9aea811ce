"""Safetensors in, checked against the family's weight-name table, into a Transformer. Never unpickles."""
from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path
from types import ModuleType

import torch
from safetensors import safe_open
from torch import nn

from .config import ConfigError, ModelConfig
from .families import family_for
from .families.table import check_fields
from .model import Block, Transformer

log = logging.getLogger(__name__)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "source.spm", "tokenizer.model")


class CheckpointError(ValueError):
    """The weights in a folder do not fit the model its config.json describes."""


def read_config(folder: Path) -> tuple[ModelConfig, ModuleType]:
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(f"{folder}: no config.json (a model folder needs config.json and *.safetensors)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: malformed JSON ({err})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    family = family_for(raw, str(path))
    try:
        unread = check_fields(raw, family.FIELDS)  # refuses, by name, any value the core does not implement
        cfg = with_overrides(family.read_config(raw), raw.get("attention_explorer"))
        return dataclasses.replace(cfg, unread_fields=unread), family
    except (TypeError, ValueError, KeyError) as err:
        if isinstance(err, ConfigError):
            raise ConfigError(f"{path}: {err}") from None
        raise ConfigError(f"{path}: malformed config ({type(err).__name__}: {err})") from None


# What a model trained in this project's lab may change that its family's config cannot say (core/lab/train.py)
OVERRIDES = {"positional": ("learned", "sinusoidal", "rope", "none"), "norm_placement": ("pre", "post"),
             "scale_attention": (True, False), "score_bias": ("none", "alibi")}


def with_overrides(cfg: ModelConfig, overrides: dict | None) -> ModelConfig:
    if not overrides:
        return cfg
    if not isinstance(overrides, dict):
        raise ConfigError(f"attention_explorer must be an object, got {type(overrides).__name__}")
    for key, value in overrides.items():
        if key not in OVERRIDES or value not in OVERRIDES[key]:
            raise ConfigError(f"attention_explorer: {key}={value!r} is not understood; keys and values: {OVERRIDES}")
    placement = overrides.get("norm_placement", cfg.norm_placement)
    return dataclasses.replace(cfg, **overrides, final_norm=placement == "pre")


def safetensors_files(folder: Path) -> list[Path]:
    """The shard files named by model.safetensors.index.json, or the folder's single *.safetensors file(s)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise CheckpointError(f"{index}: malformed shard index ({err})") from None
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard files that are not there: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(f"{folder}: only pickle checkpoints ({', '.join(pickles)}); they are refused and "
                              "never unpickled. Convert them to safetensors (model.safetensors) first.")
    raise CheckpointError(f"{folder}: no *.safetensors weights found")


class TensorSource:
    """Every tensor of a (possibly sharded) checkpoint by name, read lazily through memory maps."""

    def __init__(self, files: list[Path], prefixes: tuple[str, ...]):
        self.handles, self.where = {}, {}
        for file in files:
            try:
                handle = safe_open(str(file), framework="pt")
            except Exception as err:  # safetensors raises its own error types on corrupt headers
                raise CheckpointError(f"{file}: not a readable safetensors file ({err})") from None
            self.handles[file] = handle
            for key in handle.keys():
                self.where[strip_prefix(key, prefixes)] = (file, key)

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str) -> torch.Tensor:
        file, key = self.where[name]
        return self.handles[file].get_tensor(key)

    def describe(self, name: str) -> str:
        file, key = self.where[name]
        return f"{file.name}: tensor {key!r}"


def strip_prefix(key: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def layer_template(name: str) -> tuple[str, str | None]:
    """'stack.blocks.3.attn.qkv.weight' → ('stack.blocks.{}.attn.qkv.weight', '3')."""
    match = re.search(r"\.(\d+)\.", name)
    if match is None:
        return name, None
    return name[:match.start()] + ".{}." + name[match.end():], match.group(1)


def with_checkpoint(cfg: ModelConfig, folder: Path, family: ModuleType) -> ModelConfig:
    """The config as the checkpoint settles it, for a family whose config.json cannot say all (a T5 file holds
    its own output matrix or reuses the embeddings, whatever the tying flag says): family.WITH_CHECKPOINT."""
    settle = getattr(family, "WITH_CHECKPOINT", None)
    if settle is None:
        return cfg
    return settle(cfg, set(TensorSource(safetensors_files(folder), family.PREFIXES).where))


def load_weights(model: Transformer, folder: Path, family: ModuleType, device, dtype) -> None:
    """Fill every parameter of `model` (built on the meta device) from the folder's safetensors.

    Checks that each parameter has a source of the right shape and that every tensor in the files
    is used, known as an alias of a used one, or listed in the family's IGNORE.
    """
    source = TensorSource(safetensors_files(folder), family.PREFIXES)
    used: set[str] = set()
    for name, param in list(model.named_parameters()):
        template, layer = layer_template(name)
        if template not in family.WEIGHTS:
            raise CheckpointError(f"family {family.__name__.rsplit('.', 1)[-1]!r} has no weight-name entry for {template}")
        alternatives = [alt if isinstance(alt, tuple) else (alt,) for alt in family.WEIGHTS[template]]
        alternatives = [tuple(n.format(layer) for n in alt) for alt in alternatives]
        chosen = next((alt for alt in alternatives if all(n in source for n in alt)), None)
        if chosen is None:
            wanted = " or ".join("+".join(alt) for alt in alternatives)
            raise CheckpointError(f"{folder}: missing tensor {wanted} (needed for {name}, shape {list(param.shape)})")
        used.update(n for alt in alternatives for n in alt if n in source)  # aliases of tied weights count as used
        tensor = torch.cat([source.get(n) for n in chosen]) if len(chosen) > 1 else source.get(chosen[0])
        for pattern, transform in family.TRANSFORMS.items():
            if re.search(pattern, name):
                tensor = transform(tensor, model.config)
        if tensor.shape != param.shape:
            parts = ", ".join(f"{source.describe(n)} {list(source.get(n).shape)}" for n in chosen)
            raise CheckpointError(f"shape mismatch: {parts} gives {list(tensor.shape)} but {name} "
                                  f"needs {list(param.shape)} by config.json")
        tensor = tensor.to(device=device, dtype=dtype).contiguous()
        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name)
        module._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
    unexpected = [n for n in source.where if n not in used and not any(re.search(p, n) for p in family.IGNORE)]
    if unexpected:
        shown = ", ".join(source.describe(n) for n in unexpected[:5])
        more = f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""
        raise CheckpointError(f"unexpected tensors that config.json does not account for: {shown}{more}")


def load_tokenizer(folder: Path):
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as err:  # transformers raises many kinds here; the folder is what matters
        raise CheckpointError(f"{folder}: tokenizer files present but unreadable ({type(err).__name__}: {err})") from None


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(path: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None,
               device_map: str | dict | None = None, offload_dir: str | Path | None = None) -> Transformer:
    """Build the model a folder (or a registered model name) describes and fill it from safetensors.

    device None: cuda if available, else cpu. dtype None: float32 on cpu, bfloat16 on cuda.
    device_map: spread the layers over several devices instead (accelerate): "auto" fills the GPUs, then the CPU,
    then the disk (`offload_dir`), whole blocks at a time; or a dict of module name → device ("cuda:0", "cpu",
    "disk"), e.g. {"stack.embed": 0, "stack.blocks.0": 0, "stack.blocks.1": 1, ...}. See `spread`.
    """
    from . import store  # a registered name or hub id is fetched into the weight store; a folder is checked
    folder = Path(path)
    if folder.is_dir():
        try:
            if not store.check_folder(folder):
                log.info("%s has no manifest.json: its files are not verified", folder)
        except store.WeightsError as err:
            raise CheckpointError(str(err)) from None
    else:
        folder = store.ensure(str(path))
    if device_map is not None and device is not None:
        raise ValueError("give device or device_map, not both")
    if device_map is not None:
        device = torch.device("cpu")  # the weights are read here first, then spread
        dtype = dtype or (torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    cfg, family = read_config(folder)
    cfg = with_checkpoint(cfg, folder, family)
    with torch.device("meta"):
        model = Transformer(cfg)
    load_weights(model, folder, family, device, dtype)
    model.to(device)  # buffers (RoPE's θ_i) follow the weights
    if device_map is not None:
        spread(model, device_map, dtype, offload_dir)
    model.eval()
    model.tokenizer = load_tokenizer(folder)
    return model


def spread(model: Transformer, device_map: str | dict, dtype: torch.dtype, offload_dir: str | Path | None) -> None:
    """Place the model's modules on several devices with accelerate's hooks (each block runs where its weights
    are, its inputs moved there; "disk" weights are read from `offload_dir` when their block runs). A block is
    never split. The embeddings must stay on a real device: model.device (theirs) is where inputs start. Forward
    passes work across devices; generation keeps its KV cache on model.device, so it needs one device."""
    try:
        from accelerate import dispatch_model, infer_auto_device_map
    except ImportError as exc:
        raise CheckpointError(f"device_map needs accelerate: pip install -r requirements-scale.txt ({exc})") from None

    if device_map == "auto":
        device_map = infer_auto_device_map(model, no_split_module_classes=["Block"], dtype=dtype)
    if not isinstance(device_map, dict):
        raise ValueError(f'device_map must be "auto" or a dict of module name → device, got {device_map!r}')
    if str(device_map.get("stack.embed", device_map.get("stack", "cpu"))) == "disk":
        raise ValueError("device_map: the embeddings (stack.embed) cannot be on disk: inputs start on their device")
    if "disk" in map(str, device_map.values()) and offload_dir is None:
        raise ValueError('device_map puts modules on "disk": give offload_dir, the folder for their weights')
    dispatch_model(model, device_map=device_map, offload_dir=str(offload_dir) if offload_dir else None)
    for module in model.modules():
        if isinstance(module, Block):
            module.register_forward_pre_hook(setup_follows, with_kwargs=True)
    model.device_map = dict(device_map)


def setup_follows(block: nn.Module, args: tuple, kwargs: dict):
    """A block's AttentionSetup (masks, rotary angles) moved to the block's device: accelerate moves tensors
    and containers, not dataclasses."""
    hook = getattr(block, "_hf_hook", None)  # accelerate's: where an offloaded block's weights are brought to run
    device = getattr(hook, "execution_device", None)
    if device is None:
        device = next((p.device for p in block.parameters() if p.device.type != "meta"), None)
    device = None if device is None else torch.device(device)
    if device is None or len(args) < 2 or not dataclasses.is_dataclass(args[1]):
        return None
    setup = args[1]
    moved = {f.name: moved_to(getattr(setup, f.name), device) for f in dataclasses.fields(setup)}
    moved = {name: value for name, value in moved.items() if value is not getattr(setup, name)}
    if not moved:
        return None  # already there: the block gets the stack's own setup
    return (args[0], dataclasses.replace(setup, **moved), *args[2:]), kwargs


def moved_to(value, device: torch.device):
    if isinstance(value, torch.Tensor):
        return value if value.device == device else value.to(device)
    if isinstance(value, tuple) and any(isinstance(v, torch.Tensor) and v.device != device for v in value):
        return tuple(moved_to(v, device) for v in value)
    return value
