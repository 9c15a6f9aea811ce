"""The compiled one-token decode step stays one graph, without breaks, for every family with named attention terms
(sliding windows, ALiBi and T5's bias on cached keys, soft-caps, QK-norm, partial rotary, parallel and sandwich
blocks) and the older ones; compiled with an eager back end (dynamo's graph capture alone, no C++
compile), its logits equal the uncompiled step's."""
import pytest
import torch

from core import load_model
from core.generate import decode_step
from tests import tiny

OLD = {"gpt2": tiny.gpt2, "llama": tiny.llama}
_OLD_MODELS: dict = {}


def model_of(name):
    if name in OLD:
        if name not in _OLD_MODELS:
            _OLD_MODELS[name] = load_model(tiny.save(OLD[name]()), device="cpu", dtype=torch.float32)
        return _OLD_MODELS[name]
    return tiny.family_pair(name)[1]


def prefilled(model, n=9):
    """A cache after a left-padded prefill of n tokens (two rows, the second padded), past every sliding window,
    and the next token per row; for seq2seq the encoder's output as context."""
    ids = torch.randint(3, tiny.VOCAB - 1, (2, n), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    cache = model.new_cache(2, n + 4)
    with torch.inference_mode():
        if model.encoder is not None:
            memory = model.run_stack(model.encoder, ids, mask, kind="encoder", causal=False)
            context = dict(memory=memory, memory_mask=mask)
            model.run_stack(model.stack, ids[:, :n - 3], None, kind="self", cache=cache, **context)
        else:
            context = {}
            model.run_stack(model.stack, ids, mask, kind="self", cache=cache)
    return ids[:, -1:], cache, context


@pytest.mark.parametrize("name", list(OLD) + list(tiny.FAMILY_DECODERS) + list(tiny.FAMILY_SEQ2SEQ))
def test_compiled_decode_step_is_one_graph_with_the_same_logits(name):
    model = model_of(name)
    token, cache, context = prefilled(model)
    graphs = []

    def counted(graph, inputs):  # dynamo's "eager" back end, counting the graphs it is handed
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    try:
        with torch.inference_mode():
            # the step writes its slot and leaves the cache where it was, so both runs see the same keys
            expected = decode_step(model, token, cache, None, **context)
            # fullgraph=True: a graph break raises, naming the line that broke it
            got = torch.compile(decode_step, backend=counted, fullgraph=True)(model, token, cache, None, **context)
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()
