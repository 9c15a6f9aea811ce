"""load_model(..., device_map=...): the layers spread over devices with accelerate give the numbers of a
single-device run. Here on the CPU: "auto" (everything fits in memory) and a map that offloads a block to disk,
so accelerate's hooks read its weights from the offload folder while it runs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate", reason="accelerate is not installed: pip install -r requirements-dev.txt")

from core import load_model  # noqa: E402
from tiny_app_model import build_tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("device-map") / "tiny-llama")


@pytest.fixture(scope="module")
def reference(folder):
    return load_model(folder, device="cpu")


def ids(model):
    return model.tokenizer("The keeper lit the lamp when the storm passed.", return_tensors="pt").input_ids


def same_forward(model, reference):
    x = ids(reference)
    with torch.inference_mode():
        want = reference(x, capture_attention=True)
        got = model(x, capture_attention=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-6)
    for a, b in zip(got.attentions, want.attentions):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_auto_map_equals_one_device(folder, reference):
    model = load_model(folder, device_map="auto", dtype=torch.float32)
    assert set(map(str, model.device_map.values())) <= {"cpu", "0"} or torch.cuda.is_available()
    same_forward(model, reference)


def test_a_block_offloaded_to_disk_equals_one_device(folder, reference, tmp_path):
    device_map = {"stack.embed": "cpu", "stack.blocks.0": "cpu", "stack.blocks.1": "disk",
                  "stack.final_norm": "cpu", "lm_head": "cpu"}
    model = load_model(folder, device_map=device_map, offload_dir=tmp_path, dtype=torch.float32)
    assert model.stack.blocks[1].attn.qkv.weight.device.type == "meta"  # its weights live in the offload folder
    assert any(tmp_path.iterdir())
    same_forward(model, reference)


def test_bad_maps_are_refused_in_words(folder, tmp_path):
    with pytest.raises(ValueError, match="offload_dir"):
        load_model(folder, device_map={"stack": "cpu", "stack.blocks.1": "disk", "lm_head": "cpu"})
    with pytest.raises(ValueError, match="device or device_map"):
        load_model(folder, device="cpu", device_map="auto")
    with pytest.raises(ValueError, match="embeddings"):
        load_model(folder, device_map={"stack.embed": "disk", "stack.blocks": "cpu"}, offload_dir=tmp_path)
