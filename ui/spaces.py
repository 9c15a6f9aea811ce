"""Running as a Hugging Face Space: ZeroGPU's decorator on the events that run a model, and persistent storage.

On a ZeroGPU Space (SPACES_ZERO_GPU set, the `spaces` package importable) a GPU is attached only while a function
decorated with `spaces.GPU` runs. Everywhere else this module changes nothing, and `spaces` is never imported:
it is not in requirements.txt.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path

import gradio as gr

log = logging.getLogger(__name__)

ZERO_GPU_SETTING = "SPACES_ZERO_GPU"
PERSISTENT_STORAGE = Path("/data")  # a Space's persistent storage, when it has some
GPU_SECONDS = 120  # the longest a ZeroGPU call may hold the GPU: a long sweep or capture on a small GPU slice
CPU_EVENTS = ("extrapolation",)  # long jobs of their own small models on the CPU: no GPU to hold, longer than its slice


def on_space() -> bool:
    return bool(os.environ.get("SPACE_ID"))


def zero_gpu():
    """The `spaces` module on a ZeroGPU Space, else None."""
    if not os.environ.get(ZERO_GPU_SETTING):
        return None
    try:
        return importlib.import_module("spaces")
    except ImportError:
        log.warning("%s is set but the 'spaces' package is not installed: running without ZeroGPU", ZERO_GPU_SETTING)
        return None


def use_persistent_storage() -> Path | None:
    """On a Space with persistent storage, keep the weight store there (it outlives restarts), unless
    ATTN_WEIGHTS_DIR says otherwise. Returns the folder chosen, or None."""
    if not on_space() or os.environ.get("ATTN_WEIGHTS_DIR"):
        return None
    if not (PERSISTENT_STORAGE.is_dir() and os.access(PERSISTENT_STORAGE, os.W_OK)):
        return None
    folder = PERSISTENT_STORAGE / "weights"
    os.environ["ATTN_WEIGHTS_DIR"] = str(folder)
    return folder


def on_gpu(demo: gr.Blocks, groups: tuple[str, ...]) -> list[str]:
    """Decorate, with spaces.GPU, every event of the given concurrency groups (those that run a model). Returns
    the names of the functions decorated; [] off ZeroGPU, where nothing changes."""
    spaces = zero_gpu()
    if spaces is None:
        return []
    decorated = []
    for block_fn in demo.fns.values():
        if block_fn.fn is None or block_fn.concurrency_id not in groups or block_fn.api_name in CPU_EVENTS:
            continue
        block_fn.fn = spaces.GPU(duration=GPU_SECONDS)(block_fn.fn)
        decorated.append(block_fn.api_name or block_fn.name)
    return decorated
