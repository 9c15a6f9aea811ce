"""The core on a GPU: the same numbers as transformers on the same device, the compiled decode step under
CUDA graphs, and no host sync while decoding. bench/gpu.sh runs these where a GPU is lent."""
import copy

import pytest
import torch

from core import load_model
from core.analysis.capture import capture
from core.generate import decode_step
from tests import tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU, and this machine has none (bench/gpu.sh runs these on one)")

BUILDERS = {
    "gpt2": lambda: tiny.gpt2(eos_token_id=None),
    "llama-gqa": lambda: tiny.llama(num_key_value_heads=2, eos_token_id=None),
    "bert": lambda: tiny.bert(),
    "marian": lambda: tiny.marian(eos_token_id=tiny.VOCAB - 2, forced_eos_token_id=None),
}


@pytest.fixture(scope="module")
def pairs():
    """name → (transformers model on the GPU, its folder)"""
    made = {}
    for name, build in BUILDERS.items():
        hf = build()
        made[name] = (hf.cuda(), tiny.save(hf))
    return made


def ids(batch=2, n=12, seed=0):
    return torch.randint(3, tiny.VOCAB - 1, (batch, n), generator=torch.Generator().manual_seed(seed)).cuda()


@pytest.mark.parametrize("name", list(BUILDERS))
def test_float32_on_cuda_equals_transformers(pairs, name):
    hf, folder = pairs[name]
    model = load_model(folder, device="cuda", dtype=torch.float32)
    x = ids()
    extra = {"decoder_input_ids": ids(n=5, seed=1)} if name == "marian" else {}
    with torch.no_grad():
        ref = hf(input_ids=x, output_attentions=True, **extra)
    out = model(x, capture_attention=True, **extra)
    if out.logits is not None:
        assert (out.logits - ref.logits).abs().max() <= 1e-4
    ref_attentions = ref.decoder_attentions if name == "marian" else ref.attentions
    for ours, theirs in zip(out.attentions, ref_attentions):
        assert (ours - theirs).abs().max() <= 1e-4


def test_bfloat16_error_is_no_larger_than_transformers(pairs):
    """In bfloat16 neither side equals float32; this core's distance from it stays within transformers' own."""
    hf, folder = pairs["llama-gqa"]
    x = ids()
    with torch.no_grad():
        exact = hf(input_ids=x).logits
        theirs = copy.deepcopy(hf).to(torch.bfloat16)(input_ids=x).logits.float()
    ours = load_model(folder, device="cuda")(x).logits.float()   # bfloat16 is the GPU default
    err_ours, err_theirs = (ours - exact).abs().max().item(), (theirs - exact).abs().max().item()
    assert err_ours <= 2 * err_theirs + 1e-2, f"bfloat16 error {err_ours:.3g}, transformers' {err_theirs:.3g}"


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "marian"])
def test_greedy_on_cuda_equals_transformers_generate(pairs, name):
    hf, folder = pairs[name]
    model = load_model(folder, device="cuda", dtype=torch.float32)
    x = ids(batch=1, n=6, seed=3)
    with torch.no_grad():
        ref = hf.generate(x, max_new_tokens=32, do_sample=False, num_beams=1)
    assert torch.equal(model.generate(x, 32), ref)


@pytest.mark.parametrize("name", ["llama-gqa", "marian"])
def test_compiled_step_under_cuda_graphs_gives_the_same_tokens(pairs, name):
    _, folder = pairs[name]
    model = load_model(folder, device="cuda", dtype=torch.float32)
    for n in (6, 11):
        x = ids(batch=2, n=n, seed=n)
        expected = model.generate(x, 24)
        assert torch.equal(model.generate(x, 24, compile=True), expected)


def test_decode_step_never_waits_for_the_host(pairs):
    _, folder = pairs["llama-gqa"]
    model = load_model(folder, device="cuda")
    x = ids(batch=2, n=8)
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    cache = model.new_cache(2, 32)
    with torch.inference_mode():
        model.run_stack(model.stack, x, mask, kind="self", cache=cache)
        token = x[:, -1:]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")   # any synchronising call inside raises
        try:
            for _ in range(4):
                logits = decode_step(model, token, cache)
                cache.advance(1)
                token = logits.argmax(-1, keepdim=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert cache.length == 12


def test_capture_gradients_and_ablation_on_cuda_equal_the_cpu(pairs):
    _, folder = pairs["llama-gqa"]
    gpu, cpu = load_model(folder, device="cuda", dtype=torch.float32), load_model(folder, device="cpu")
    x = ids(batch=1, n=250)
    torch.testing.assert_close(capture(gpu, x, overview_size=32).overview, capture(cpu, x.cpu(), overview_size=32).overview,
                               atol=1e-5, rtol=1e-4)
    outs = [m(x.to(m.device), grad=True, ablate_heads=[(1, 2)]) for m in (gpu, cpu)]
    for out in outs:
        out.logits[0, -1].logsumexp(-1).backward()
    torch.testing.assert_close(outs[0].token_embeddings.grad.cpu(), outs[1].token_embeddings.grad, atol=1e-4, rtol=1e-3)
