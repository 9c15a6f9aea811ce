"""What each head does, measured: scores on constructed patterns, the induction probe, ablation and its sweep,
attribution, the logit lens and surprisal; on tiny models, a random-weights SmolLM2 and the real one."""
import json
import math
from pathlib import Path

import pytest
import torch

from core import load_model
from core.analysis import heads
from core.store import ensure
from tests import tiny

CONFIG = Path(__file__).resolve().parents[2] / "bench" / "configs" / "smollm2-135m-instruct.json"


@pytest.fixture(scope="module")
def llama():
    return load_model(tiny.save(tiny.llama(num_key_value_heads=2)), device="cpu")


def causal_uniform(heads_: int, n: int) -> torch.Tensor:
    p = torch.tril(torch.ones(n, n))
    return (p / p.sum(-1, keepdim=True)).expand(heads_, n, n)


def test_scores_of_constructed_patterns():
    n = 8
    ids = torch.tensor([5, 6, 7, 5, 6, 9, 5, 10])
    previous = torch.zeros(n, n)
    previous[0, 0] = 1
    previous[torch.arange(1, n), torch.arange(n - 1)] = 1                  # every query on the key before it
    sink = torch.zeros(n, n)
    sink[:, 0] = 1
    duplicate = torch.eye(n)
    for i, j in ((3, 0), (4, 1), (6, 3)):                                   # the latest earlier copy
        duplicate[i] = 0
        duplicate[i, j] = 1
    scores = heads.row_scores(torch.stack([previous, sink, duplicate, causal_uniform(1, n)[0]]), ids, causal=True)
    assert scores["previous_token"][0] == 1 and scores["first_token"][1] == 1 and scores["duplicate_token"][2] == 1
    assert scores["local"][0] == 1 and scores["entropy"][0] == 0
    uniform_previous = sum(1 / (i + 1) for i in range(1, n)) / (n - 1)     # row i spreads 1 over i + 1 keys
    assert scores["previous_token"][3].item() == pytest.approx(uniform_previous)
    # causal rows: query 0 sees only the first key, so it is left out (core.analysis.sinks's definition)
    assert scores["first_token"][3].item() == pytest.approx(sum(1 / (i + 1) for i in range(1, n)) / (n - 1))
    both_ways = heads.row_scores(torch.full((1, n, n), 1 / n), ids, causal=False)   # an encoder's every query
    assert both_ways["first_token"].item() == pytest.approx(1 / n)
    assert scores["entropy"][3].item() == pytest.approx(sum(math.log(i + 1) for i in range(n)) / n)
    # rows 3, 4 and 6 have earlier copies; uniform rows put (copies)/(i + 1) on them
    assert scores["duplicate_token"][3].item() == pytest.approx((1 / 4 + 1 / 5 + 2 / 7) / 3)


def test_induction_probe_repeats_random_tokens_and_avoids_special_ones():
    ids = heads.induction_probe(50, length=20, seed=3, bos=1, avoid=(0, 1, 2))
    assert ids.shape == (1, 41) and ids[0, 0] == 1
    assert torch.equal(ids[0, 1:21], ids[0, 21:])
    assert not torch.isin(ids[0, 1:], torch.tensor([0, 1, 2])).any()
    assert torch.equal(ids, heads.induction_probe(50, length=20, seed=3, bos=1, avoid=(0, 1, 2)))


def test_induction_scores_read_the_right_keys(llama):
    result = heads.induction(llama, length=30)
    assert result.scores.shape == (2, 4) and math.isfinite(result.loss_first) and math.isfinite(result.loss_second)
    ids = result.ids.to(llama.device)
    out = llama(ids, capture_attention=True)
    n, offset, length = ids.shape[1], 1, 30                                # bos first
    second = torch.arange(offset + length, n)                              # every token of the second copy
    assert second[0] == 31 and torch.equal(ids[0, second[0]], ids[0, offset])  # its first token, copied from 1
    keys = second - length + 1                                             # the token after each earlier copy
    assert keys[0] == offset + 1 and keys[-1] == n - length
    assert torch.equal(ids[0, keys[:-1]], ids[0, second[1:]])              # the key is what comes next
    expected = torch.stack([a[0][:, second, keys].mean(-1) for a in out.attentions])
    torch.testing.assert_close(result.scores, expected)
    by_hand = torch.tensor([[sum(a[0, h, q, q - length + 1].item() for q in range(31, n)) / (n - 31)
                             for h in range(4)] for a in out.attentions])
    torch.testing.assert_close(result.scores, by_hand)
    without_first = torch.stack([a[0][:, second[1:], keys[1:]].mean(-1) for a in out.attentions])
    assert not torch.allclose(result.scores, without_first)               # the first query is really counted


def test_named_heads_use_the_stated_thresholds():
    table = torch.tensor([[0.2, 0.55], [0.9, 0.1]])
    named = heads.named_heads({"previous_token": table, "entropy": table})
    assert named == {"previous_token": [(1, 0, pytest.approx(0.9)), (0, 1, pytest.approx(0.55))]}
    assert heads.top_heads(table, 2) == [(1, 0, pytest.approx(0.9)), (0, 1, pytest.approx(0.55))]


def test_a_random_weights_model_of_smollm2s_shape_gets_no_names(tmp_path):
    """The naming thresholds are set so that attention which learned nothing names no head."""
    transformers = pytest.importorskip("transformers")
    raw = json.loads(CONFIG.read_text())
    raw["num_hidden_layers"] = 8  # the same heads and widths; fewer layers keep the test short
    (tmp_path / "config.json").write_text(json.dumps(raw))
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path)) \
        .save_pretrained(tmp_path)
    model = load_model(tmp_path, device="cpu")
    text = torch.randint(3, 5000, (1, 60), generator=torch.Generator().manual_seed(1))
    scores = heads.pattern_scores(model, torch.cat([text, text], dim=1))   # repeats, for duplicate tokens
    scores["induction"] = heads.induction(model).scores
    assert all(not found for found in heads.named_heads(scores).values()), heads.named_heads(scores)


def test_sweep_equals_ablating_each_head_alone(llama):
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 16), generator=torch.Generator().manual_seed(2))
    seen = []
    sweep = heads.ablation_sweep(llama, ids, batch=3, progress=lambda done, total: seen.append((done, total)))
    assert sweep.shape == (2, 4) and seen[-1] == (8, 8) and len(seen) == 3
    for layer, head in ((0, 1), (1, 3)):
        one = heads.ablate(llama, ids, [(layer, head)])
        assert sweep[layer, head].item() == pytest.approx(one.delta.mean().item(), abs=1e-5)
    mean_sweep = heads.ablation_sweep(llama, ids, ablation="mean", batch=8)
    one = heads.ablate(llama, ids, [(1, 2)], ablation="mean")
    assert mean_sweep[1, 2].item() == pytest.approx(one.delta.mean().item(), abs=1e-5)


def test_rollout_keeps_rows_stochastic_and_adds_the_residual():
    probs = causal_uniform(2, 5)
    flow = heads.rollout([probs, probs])
    torch.testing.assert_close(flow.sum(-1), torch.ones(5))
    assert torch.equal(flow, torch.tril(flow)), "causal attention rolls out causally"
    one = heads.rollout([probs])
    torch.testing.assert_close(one, 0.5 * probs[0] + 0.5 * torch.eye(5))


@pytest.mark.parametrize("build", [tiny.gpt2, tiny.llama], ids=["gpt2", "llama"])
def test_integrated_gradients_converge_to_the_logit_difference(build):
    model = load_model(tiny.save(build()), device="cpu")
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 12), generator=torch.Generator().manual_seed(0))
    coarse, fine = heads.attribute(model, ids, steps=8), heads.attribute(model, ids, steps=128, layer=1, head=3)
    assert fine.completeness_error < coarse.completeness_error
    scale = fine.integrated.abs().sum().item()  # the attributions' own size
    assert fine.completeness_error <= 1e-3 * scale
    assert fine.integrated.sum().item() == pytest.approx(fine.logit_difference, abs=1e-3 * scale)
    out = model(ids, capture_attention=True)
    assert fine.target == out.logits[0, -1].argmax().item()
    torch.testing.assert_close(fine.head, out.attentions[1][0, 3, -1])
    assert fine.correlations()["rollout"]["rollout"] == pytest.approx(1)
    with pytest.raises(IndexError, match="position 12 is out of range"):
        heads.attribute(model, ids, position=12)
    with pytest.raises(ValueError, match=r"layer 5 is out of range: the model has layers"):
        heads.attribute(model, ids, layer=5)


def test_contrastive_attribution_is_the_difference_of_the_two_logits_attributions(llama):
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 12), generator=torch.Generator().manual_seed(0))
    logits = llama(ids).logits[0, -1]
    top, other = logits.argsort(descending=True)[:2].tolist()
    of_target, of_foil = heads.attribute(llama, ids, steps=16), heads.attribute(llama, ids, steps=16, target=other)
    contrast = heads.attribute(llama, ids, steps=16, target=top, foil=other)
    assert (of_target.target, of_target.foil, contrast.target, contrast.foil) == (top, None, top, other)
    assert of_foil.target == other and contrast.baseline == "pad" and contrast.steps == 16
    # gradients are linear: the gradient of logit(t) − logit(f) is the gradient of one minus the other's
    torch.testing.assert_close(contrast.grad_input, of_target.grad_input - of_foil.grad_input, atol=1e-4, rtol=0)
    torch.testing.assert_close(contrast.integrated, of_target.integrated - of_foil.integrated, atol=1e-4, rtol=0)
    assert contrast.logit_difference == pytest.approx(of_target.logit_difference - of_foil.logit_difference, abs=1e-4)
    baseline = heads.baseline_embeddings(llama, llama(ids, grad=True).token_embeddings.detach()[0])
    at_baseline = llama(ids, token_embeddings=baseline[None]).logits[0, -1]
    difference = (logits[top] - logits[other]) - (at_baseline[top] - at_baseline[other])
    assert contrast.logit_difference == pytest.approx(difference.item(), abs=1e-4)
    assert contrast.completeness_error == pytest.approx(abs(contrast.integrated.sum().item() - difference.item()),
                                                        abs=1e-4)
    with pytest.raises(ValueError, match="the foil must differ from the target"):
        heads.attribute(llama, ids, steps=2, foil=top)
    with pytest.raises(IndexError, match=f"foil token id {tiny.VOCAB} is out of range"):
        heads.attribute(llama, ids, steps=2, foil=tiny.VOCAB)


@pytest.mark.parametrize("build", [tiny.gpt2, tiny.llama], ids=["gpt2", "llama"])
def test_each_baseline_starts_elsewhere_and_the_completeness_identity_holds(build):
    model = load_model(tiny.save(build()), device="cpu")
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 12), generator=torch.Generator().manual_seed(0))
    embeds = model(ids, grad=True).token_embeddings.detach()[0]
    table = model.stack.embed.tokens.weight.detach()
    starts = {name: heads.baseline_embeddings(model, embeds, name) for name in heads.BASELINES}
    torch.testing.assert_close(starts["pad"], table[2].expand_as(embeds))  # no padding token: end-of-text's row
    torch.testing.assert_close(starts["mean"], table.mean(0).expand_as(embeds))
    assert not starts["zero"].any()
    assert all(not torch.equal(starts[a], starts[b]) for a in heads.BASELINES for b in heads.BASELINES if a < b)
    errors = {}
    for name in heads.BASELINES:
        result = heads.attribute(model, ids, steps=128, baseline=name)
        assert result.baseline == name
        errors[name] = result.completeness_error
        at_baseline = model(ids, token_embeddings=starts[name][None]).logits[0, -1, result.target]
        assert result.logit_difference == pytest.approx(
            (model(ids).logits[0, -1, result.target] - at_baseline).item(), abs=1e-4)
    scale = result.integrated.abs().sum().item()
    assert errors["pad"] <= 1e-3 * scale and errors["mean"] <= 1e-3 * scale
    if build is tiny.gpt2:  # learned positions and biases: even an all-zero start gives a smooth path
        assert errors["zero"] <= 1e-3 * scale
    else:  # RMSNorm of an all-zero stream: the path's change is a jump near its start, which the midpoints miss
        assert errors["zero"] > 100 * max(errors["pad"], errors["mean"])
    for call in (lambda: heads.attribute(model, ids, baseline="ones"),
                 lambda: heads.completeness_by_steps(model, ids, baseline="ones")):
        with pytest.raises(ValueError, match="baseline must be one of 'pad', 'mean', 'zero', got 'ones'"):
            call()


def test_completeness_by_steps_measures_what_attribute_reports(llama):
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 10), generator=torch.Generator().manual_seed(3))
    for target, foil, baseline in ((None, None, "pad"), (5, 7, "mean"), (None, 11, "zero")):
        measured = heads.completeness_by_steps(llama, ids, 6, steps=(3, 8, 20), target=target, foil=foil,
                                               baseline=baseline)
        assert [m.steps for m in measured] == [3, 8, 20]
        for m in measured:
            one = heads.attribute(llama, ids, 6, steps=m.steps, target=target, foil=foil, baseline=baseline)
            assert m.error == pytest.approx(one.completeness_error, abs=1e-5)
            assert m.difference == pytest.approx(one.logit_difference, abs=1e-5)
            assert m.total == pytest.approx(one.integrated.sum().item(), abs=1e-5)
    with pytest.raises(ValueError, match="steps must be ≥ 1, got 0"):
        heads.completeness_by_steps(llama, ids, steps=(8, 0))


def test_logit_lens_table_and_surprisal(llama):
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 10), generator=torch.Generator().manual_seed(4))
    table = heads.lens_table(llama, ids)
    logits = llama(ids).logits[0]
    assert torch.equal(table.top[-1], logits.argmax(-1))
    torch.testing.assert_close(table.final_prob[-1], logits.softmax(-1).max(-1).values)
    torch.testing.assert_close(table.top_prob[-1], table.final_prob[-1])
    for t in range(10):  # from the settling layer on, every layer agrees with the last
        assert (table.top[table.settles[t]:, t] == table.top[-1, t]).all()
        if table.settles[t] > 0:
            assert table.top[table.settles[t] - 1, t] != table.top[-1, t]
    s = heads.surprisal(llama, ids)
    expected = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="none")
    torch.testing.assert_close(s.loss, expected)
    assert s.perplexity == pytest.approx(math.exp(expected.mean().item()), rel=1e-5)
    assert torch.equal(s.alternatives[:, 0], logits[:-1].argmax(-1))


def test_encoders_are_told_what_does_not_apply():
    bert = load_model(tiny.save(tiny.bert(mlm=False)), device="cpu")
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 8))
    assert set(heads.pattern_scores(bert, ids)) == {"previous_token", "first_token", "local", "entropy",
                                                    "duplicate_token"}
    with pytest.raises(ValueError, match="induction probe needs"):
        heads.induction(bert)
    with pytest.raises(ValueError, match="no LM head"):
        heads.lens_table(bert, ids)
    with pytest.raises(ValueError, match="surprisal needs"):
        heads.surprisal(bert, ids)


@pytest.mark.real_weights
def test_smollm2_has_induction_heads_that_matter(smollm):
    result = heads.induction(smollm)
    layer, head, score = heads.top_heads(result.scores, 1)[0]
    assert score >= 0.5, f"strongest induction head ({layer}, {head}) scores only {score:.2f}"
    assert result.loss_second <= 0.5 * result.loss_first, (result.loss_first, result.loss_second)
    ablated = heads.ablate(smollm, result.ids, [(layer, head)])
    second = slice(101, None)  # the second copy's predictions (after bos and the first 100 tokens)
    assert ablated.ablated_loss[second].mean() > ablated.clean_loss[second].mean() + 0.2


def test_smollm2_lens_ends_at_the_logits_and_gradient_x_input_equals_transformers(smollm):
    transformers = pytest.importorskip("transformers")
    ids = smollm.tokenizer("The capital of France is the city of", return_tensors="pt").input_ids
    table = heads.lens_table(smollm, ids)
    logits = smollm(ids).logits[0]
    assert torch.equal(table.top[-1], logits.argmax(-1))
    torch.testing.assert_close(table.final_prob[-1], logits.softmax(-1).max(-1).values, atol=1e-5, rtol=1e-4)
    result = heads.attribute(smollm, ids, steps=4)
    reference = transformers.AutoModelForCausalLM.from_pretrained(ensure("smollm2-135m-instruct"))
    embeds = reference.get_input_embeddings()(ids).detach().requires_grad_(True)
    reference(inputs_embeds=embeds).logits[0, -1, result.target].backward()
    expected = (embeds.grad[0] * embeds[0].detach()).sum(-1)
    torch.testing.assert_close(result.grad_input, expected, atol=1e-3, rtol=1e-3)
    assert abs(result.integrated.sum().item() - result.logit_difference) == pytest.approx(result.completeness_error)


@pytest.mark.real_weights
def test_smollm2_contrastive_gradient_x_input_equals_transformers(smollm):
    transformers = pytest.importorskip("transformers")
    tok = smollm.tokenizer
    ids = tok("When Mary and John went to the store, John gave a drink to", return_tensors="pt").input_ids
    (mary,), (john,) = (tok(word, add_special_tokens=False).input_ids for word in (" Mary", " John"))
    result = heads.attribute(smollm, ids, steps=4, target=mary, foil=john)
    assert (result.target, result.foil) == (mary, john)
    reference = transformers.AutoModelForCausalLM.from_pretrained(ensure("smollm2-135m-instruct"))
    embeds = reference.get_input_embeddings()(ids).detach().requires_grad_(True)
    logits = reference(inputs_embeds=embeds).logits[0, -1]
    (logits[mary] - logits[john]).backward()
    torch.testing.assert_close(result.grad_input, (embeds.grad[0] * embeds[0].detach()).sum(-1), atol=1e-3, rtol=1e-3)


def test_ablating_an_mlm_encoder_measures_its_own_tokens():
    bert = load_model(tiny.save(tiny.bert()), device="cpu")
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 9), generator=torch.Generator().manual_seed(5))
    result = heads.ablate(bert, ids, [(1, 0)])
    logits = bert(ids, ablate_heads=[(1, 0)]).logits[0]
    torch.testing.assert_close(result.ablated_loss, torch.nn.functional.cross_entropy(logits, ids[0], reduction="none"))
    sweep = heads.ablation_sweep(bert, ids, batch=5)
    assert sweep[1, 0].item() == pytest.approx(result.delta.mean().item(), abs=1e-5)
    with pytest.raises(ValueError, match="needs an LM head"):
        heads.ablate(load_model(tiny.save(tiny.bert(mlm=False)), device="cpu"), ids, [(0, 0)])


def test_seq2seq_models_are_told_what_does_not_apply():
    marian = load_model(tiny.save(tiny.marian()), device="cpu")
    ids = torch.randint(3, tiny.VOCAB - 2, (1, 8))
    for fn, message in ((heads.induction, "decoder-only"), (lambda m: heads.surprisal(m, ids), "decoder-only"),
                        (lambda m: heads.lens_table(m, ids), "encoder-decoder")):
        with pytest.raises(ValueError, match=message):
            fn(marian)


def test_integrated_gradients_in_chunks_equal_one_pass(llama, monkeypatch):
    ids = torch.randint(3, tiny.VOCAB - 1, (1, 10), generator=torch.Generator().manual_seed(6))
    whole = heads.attribute(llama, ids, steps=12)
    monkeypatch.setattr(heads, "IG_TOKENS_PER_PASS", 25)  # two path points per pass
    torch.testing.assert_close(heads.attribute(llama, ids, steps=12).integrated, whole.integrated)
