"""The analyses that read logits over many positions read them a block of positions at a time: on a random
Llama-style model with a 250,000-token vocabulary, each gives what the whole [T, vocab] logits give, and no call
of model.logits ever makes more than one block of rows (the forward pass included), however long the text."""
import contextlib

import pytest
import torch
import torch.nn.functional as F
import transformers as tf

from core import load_model
from core.analysis import heads, patching
from core.logits import LOGITS_BUDGET, block_rows, by_blocks
from tests import tiny

VOCAB = 250_000
SHORT = 70          # more than one block (block_rows(1, VOCAB) rows each), the last one partial
LONG = 1024         # its whole logits, T × vocab × 4 bytes (1 GB), would be 15 × LOGITS_BUDGET


@pytest.fixture(scope="module")
def model():
    cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         attn_implementation="eager")
    return load_model(tiny.save(tiny.spread_weights(tf.LlamaForCausalLM(cfg))), device="cpu", dtype=torch.float32)


def text(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


@contextlib.contextmanager
def logits_calls(model):
    """The shape of every logits tensor model.logits returns inside the block (the forward's own included)."""
    shapes, original = [], model.logits

    def recorded(hidden):
        out = original(hidden)
        shapes.append(tuple(out.shape))
        return out

    model.logits = recorded
    try:
        yield shapes
    finally:
        del model.logits


def assert_blocked(shapes, batch: int = 1):
    """Every call made at most one block: batch × rows × vocab float32 logits within the budget."""
    assert shapes, "the analysis never read the logits"
    rows = block_rows(batch, VOCAB)
    for shape in shapes:
        assert shape[-1] == VOCAB
        positions = shape[1] if len(shape) == 3 else 1
        assert shape[0] * positions <= batch * rows, f"a call made logits {shape}: more than a block of {rows} rows"
        assert shape[0] * positions * VOCAB * 4 <= LOGITS_BUDGET


def close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


def test_blocks_are_cut_from_the_budget_and_joined_in_order(model):
    assert block_rows(1, VOCAB) == LOGITS_BUDGET // (VOCAB * 4) and 1 < block_rows(1, VOCAB) < SHORT
    assert block_rows(4, VOCAB) == LOGITS_BUDGET // (4 * VOCAB * 4)
    assert block_rows(1, 10**12) == 1                                    # one row even over the budget
    ids = text(SHORT)
    with torch.inference_mode():
        full = model(ids).logits
        hidden = model(ids, return_logits=False).hidden_states
        with logits_calls(model) as shapes:
            seen = []
            whole = by_blocks(model, hidden, lambda logits, at: (seen.append(at), logits)[1])
            empty = by_blocks(model, hidden[:, :0], lambda logits, at: logits.argmax(-1))
    rows = block_rows(1, VOCAB)
    assert seen == [slice(s, min(s + rows, SHORT)) for s in range(0, SHORT, rows)] and len(seen) == 2
    assert [s[1] for s in shapes] == [rows, SHORT - rows, 0]
    close(whole, full)
    assert empty.shape == (1, 0)


def test_prediction_losses_and_ablation_equal_the_whole_logits(model):
    ids = text(SHORT, 1)
    with torch.inference_mode():
        clean = model(ids).logits[0]
        ablated = model(ids, ablate_heads=[(1, 0)]).logits[0]
        hidden = model(ids, return_logits=False).hidden_states
        with logits_calls(model) as shapes:
            losses = heads.prediction_losses(model, hidden, ids)
            result = heads.ablate(model, ids, [(1, 0)])
    assert_blocked(shapes)
    want = F.cross_entropy(clean[:-1], ids[0, 1:], reduction="none")        # [T - 1]
    close(losses[0], want)
    close(result.clean_loss, want)
    close(result.ablated_loss, F.cross_entropy(ablated[:-1], ids[0, 1:], reduction="none"))
    assert torch.equal(result.clean_top, clean.argmax(-1)) and torch.equal(result.ablated_top, ablated.argmax(-1))
    assert result.delta.abs().max() > 1e-3                                 # the head matters, so the check can fail


def test_ablation_sweep_equals_one_whole_pass_per_head(model):
    ids = text(20, 2)
    with torch.inference_mode():
        def mean_loss(**ablate):
            logits = model(ids, **ablate).logits[0]
            return F.cross_entropy(logits[:-1], ids[0, 1:]).item()
        clean = mean_loss()
        want = torch.tensor([[mean_loss(ablate_heads=[(l, h)]) - clean for h in range(2)] for l in range(2)])
        with logits_calls(model) as shapes:
            got = heads.ablation_sweep(model, ids, batch=4)
    assert_blocked(shapes, batch=4)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_surprisal_and_induction_equal_the_whole_logits(model):
    ids = text(SHORT, 3)
    with torch.inference_mode():
        logits = model(ids).logits[0, :-1]
        with logits_calls(model) as shapes:
            s = heads.surprisal(model, ids, k=5)
            probe = heads.induction(model, length=40)
        probe_logits = model(probe.ids).logits[0]
    assert_blocked(shapes)
    close(s.loss, F.cross_entropy(logits, ids[0, 1:], reduction="none"))
    top = logits.softmax(-1).topk(5, dim=-1)
    assert torch.equal(s.alternatives, top.indices)
    close(s.probs, top.values)
    n = probe.ids.shape[1]                                                  # BOS + two copies of 40
    want = F.cross_entropy(probe_logits[:-1], probe.ids[0, 1:], reduction="none")
    assert probe.loss_first == pytest.approx(want[1:40].mean().item(), rel=1e-6)
    assert probe.loss_second == pytest.approx(want[41:n - 1].mean().item(), rel=1e-6)


@pytest.mark.parametrize("top_k", [3, None])
def test_logit_lens_equals_each_layers_whole_logits(model, top_k):
    ids = text(SHORT, 4)
    with torch.inference_mode():
        out = model(ids, record="resid_post")
        with logits_calls(model) as shapes:
            lens = model(ids, logit_lens=True, logit_lens_top_k=top_k, return_logits=False).logit_lens
    assert_blocked(shapes)
    final = out.logits[0].argmax(-1)                                        # [T] the last layer's answer
    for layer, h in enumerate(out.records["resid_post"]):
        logits = model.logits(model.stack.final_norm(h))[0]                 # [T, vocab], whole
        p = logits.softmax(-1)
        close(lens.final_probs[layer, 0], p.gather(-1, final[:, None])[:, 0])
        if top_k is None:
            close(lens.values[layer, 0], logits)
            continue
        top = logits.topk(top_k, dim=-1)
        close(lens.values[layer, 0], top.values)
        assert torch.equal(lens.indices[layer, 0], top.indices)
        close(lens.probs[layer, 0], p.gather(-1, top.indices))
    table = heads.lens_table(model, ids)
    assert torch.equal(table.top[-1], final)


def test_attribution_reads_one_position_with_its_gradient(model):
    ids, position = text(24, 5), 17
    out = model(ids[:, :position + 1], grad=True)                           # the whole logits, as reference
    logits = out.logits[0, position]
    target = int(logits.argmax())
    logits[target].backward()
    grad_input = (out.token_embeddings.grad[0] * out.token_embeddings.detach()[0]).sum(-1)
    with logits_calls(model) as shapes:
        result = heads.attribute(model, ids, position, steps=2, baseline="mean")
    assert all(len(shape) == 2 for shape in shapes), f"attribution read whole texts' logits: {shapes}"
    assert result.target == target
    close(result.grad_input, grad_input)
    base = heads.baseline_embeddings(model, out.token_embeddings.detach()[0], "mean")
    with torch.inference_mode():
        at_base = model(ids[:, :position + 1], token_embeddings=base[None]).logits[0, position, target]
    assert result.logit_difference == pytest.approx((logits[target] - at_base).item(), abs=1e-4)


def test_patching_metrics_equal_the_whole_logits(model):
    clean, corrupted = text(12, 6), text(12, 6).clone()
    corrupted[0, 4] = 7
    with torch.inference_mode():
        clean_logits, corrupted_logits = model(clean).logits[0, -1], model(corrupted).logits[0, -1]
    answer, foil = clean_logits.topk(2).indices.tolist()
    with logits_calls(model) as shapes:
        sweep = patching.patch_sweep(model, clean, corrupted, answer, foil, site="resid_pre")
        attribution = patching.logit_attribution(model, clean, answer, foil, position=6)
    assert all(len(shape) == 2 or shape[1] == 1 for shape in shapes), f"a metric read many positions: {shapes}"
    assert sweep.clean_metric == pytest.approx((clean_logits[answer] - clean_logits[foil]).item(), abs=1e-5)
    assert sweep.corrupted_metric == pytest.approx((corrupted_logits[answer] - corrupted_logits[foil]).item(),
                                                   abs=1e-5)
    with torch.inference_mode():
        at_6 = model(clean).logits[0, 6]
    assert attribution.total == pytest.approx((at_6[answer] - at_6[foil]).item(), abs=1e-5)


@pytest.mark.parametrize("analysis", ["ablate", "lens_table"])
def test_a_long_text_never_holds_its_whole_logits(model, analysis):
    """The two that read every position of every pass (surprisal and attribution read through the same helpers,
    checked above on a text of more than one block)."""
    ids = text(LONG, 7)
    assert LONG * VOCAB * 4 >= 15 * LOGITS_BUDGET
    run = {"ablate": lambda: heads.ablate(model, ids, [(0, 1)]), "lens_table": lambda: heads.lens_table(model, ids)}
    with logits_calls(model) as shapes:
        run[analysis]()
    assert_blocked(shapes)
    rows = block_rows(1, VOCAB)
    passes = 2                                                              # clean and ablated; or the 2 layers
    assert sum(s[1] for s in shapes) == passes * LONG and len(shapes) == passes * -(-LONG // rows)
