"""A from-scratch Transformer in PyTorch that loads the weights of ten families (core/families/, one file each):
GPT-2, Llama-style decoders (Llama, Mistral, Qwen2, Qwen3), BERT, Marian, GPT-NeoX (Pythia), BLOOM, T5, Gemma
(1, 2 and 3), Phi-3 and OPT; by config.json's model_type: gpt2, llama, mistral, qwen2, qwen3, bert, marian,
gpt_neox, bloom, t5, gemma, gemma2, gemma3_text, phi3, opt.

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
