"""A from-scratch Transformer in PyTorch that loads GPT-2, Llama-style, BERT and Marian weights."""
from .config import ConfigError, ModelConfig
from .loading import CheckpointError, load_model
from .model import ModelOutput, Transformer

__all__ = ["load_model", "ModelConfig", "ModelOutput", "Transformer", "ConfigError", "CheckpointError"]
