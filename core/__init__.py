"""A from-scratch Transformer in PyTorch that loads GPT-2, Llama-style, BERT and Marian weights.

    from core import load_model
    model = load_model("smollm2-135m-instruct")   # or a folder with config.json + *.safetensors

Names are imported on first use, so `python -m core.store` starts without loading torch.
"""
from importlib import import_module

_EXPORTS = {
    "load_model": "loading", "CheckpointError": "loading", "ConfigError": "config", "ModelConfig": "config",
    "ModelOutput": "model", "Transformer": "model",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'core' has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
