"""Every analysis of core.analysis on every family with named attention terms (sliding windows, ALiBi and T5's
score bias, soft-caps, QK-norm, partial rotary, parallel and sandwich blocks): each either equals its definition,
measured on the model's own forward pass, or refuses with a ValueError that says why in words.

Capture, head scores, ablation (zero and mean), attribution, the logit lens and generation with the KV cache."""
import pytest
import torch

from core.analysis import capture as cap
from core.analysis import heads
from core.probe import Patch
from tests import tiny

DECODERS, SEQ2SEQ = list(tiny.FAMILY_DECODERS), list(tiny.FAMILY_SEQ2SEQ)
FAMILIES = DECODERS + SEQ2SEQ
TOL = 1e-5


def text(n=13, seed=0):
    return torch.randint(3, tiny.VOCAB - 1, (1, n), generator=torch.Generator().manual_seed(seed))


def model_of(name):
    return tiny.family_pair(name)[1]


def text_attentions(model, ids):
    """The reference: every layer's map [H, n, n] of the stack the capture reads, from one forward pass."""
    out = model(ids, capture_attention=True)
    maps = out.encoder_attentions if model.encoder is not None else out.attentions
    return [m[0] for m in maps]


@pytest.fixture
def small_blocks(monkeypatch):
    """Query rows a few at a time, so the block-by-block path cuts each map (window, bias, cap) into pieces."""
    monkeypatch.setattr(cap.OverviewObserver, "rows_per_block", 4)
    monkeypatch.setattr(cap.LayerObserver, "rows_per_block", 4)


# ---- capture ----

@pytest.mark.parametrize("name", FAMILIES)
def test_capture_equals_the_forward_pass_attentions(name, small_blocks):
    model = model_of(name)
    ids = text()
    want = text_attentions(model, ids)
    maps = cap.capture(model, ids, overview_size=5, keep_full_up_to=64, keep_layers=(1,))
    assert maps.overview.shape == (len(want), want[0].shape[0], 5, 5)
    for layer, ref in enumerate(want):
        kept = maps.full[layer].float()
        assert (kept - ref).abs().max() <= (TOL if layer == 1 else 1e-3), f"layer {layer} kept"
        # the overview is the 2-D block average of the same map
        pooled = torch.nn.functional.adaptive_avg_pool2d(ref, 5)
        assert torch.allclose(torch.from_numpy(maps.overview[layer]), pooled, atol=1e-5), f"layer {layer} overview"
    # a map not kept is recomputed by a pass up to its layer, block by block
    last = len(want) - 1
    short = cap.capture(model, ids, keep_full_up_to=0)
    assert not short.full
    assert (short.layer(last) - want[last]).abs().max() <= TOL
    assert (cap.layer_map(model, ids, last) - want[last]).abs().max() <= TOL


@pytest.mark.parametrize("name", FAMILIES)
def test_capture_of_a_left_padded_text_equals_the_forward_pass(name, small_blocks):
    """Padding shifts ALiBi's and RoPE's positions but not T5's places; the real queries' rows must agree."""
    model = model_of(name)
    ids, mask = text(), torch.ones(1, 13, dtype=torch.long)
    mask[0, :3] = 0
    out = model(ids, attention_mask=mask, capture_attention=True)
    want = out.encoder_attentions if model.encoder is not None else out.attentions
    maps = cap.capture(model, ids, attention_mask=mask, keep_layers=range(len(want)))
    for layer, ref in enumerate(want):
        assert (maps.full[layer][:, 3:] - ref[0, :, 3:]).abs().max() <= TOL, f"layer {layer}"


# ---- head scores ----

@pytest.mark.parametrize("name", FAMILIES)
def test_pattern_scores_are_the_row_scores_of_the_maps(name):
    model = model_of(name)
    ids = text(seed=1)
    ids[0, 8:11] = ids[0, 2:5]                     # earlier copies, so duplicate-token has rows to score
    got = heads.pattern_scores(model, ids)
    causal = model.attention_stack()[0].cfg.causal        # T5's encoder reads both ways
    want = [heads.row_scores(m, ids[0], causal) for m in text_attentions(model, ids)]
    for key, table in got.items():
        assert torch.allclose(table, torch.stack([w[key] for w in want]), atol=TOL), key


@pytest.mark.parametrize("name", FAMILIES)
def test_induction_probe_reads_the_maps_or_refuses(name):
    model = model_of(name)
    if name in SEQ2SEQ:
        with pytest.raises(ValueError, match="decoder-only model .* t5 is an encoder-decoder"):
            heads.induction(model, length=8)
        return
    result = heads.induction(model, length=8)
    n, offset = result.ids.shape[1], n_prefix(model)
    maps = model(result.ids, capture_attention=True).attentions
    second = torch.arange(offset + 8, n)
    for layer, probs in enumerate(maps):
        want = probs[0][:, second, second - 8 + 1].mean(-1)
        assert torch.allclose(result.scores[layer], want, atol=TOL)
    losses = torch.nn.functional.cross_entropy(model(result.ids).logits[0, :-1], result.ids[0, 1:], reduction="none")
    assert result.loss_second == pytest.approx(losses[offset + 8:].mean().item(), abs=1e-4)


def n_prefix(model):
    return 0 if model.config.bos_token_id is None else 1


# ---- ablation ----

def z_of(model, ids):
    return model(ids, record="z").records["z"]                       # per layer [1, T, H, d_head]


def loss_per_token(model, logits, ids):
    return torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")


@pytest.mark.parametrize("ablation", ["zero", "mean"])
@pytest.mark.parametrize("name", FAMILIES)
def test_ablation_equals_the_pass_with_that_head_written_over(name, ablation):
    model = model_of(name)
    ids = text(seed=2)
    if name in SEQ2SEQ:
        with pytest.raises(ValueError, match="t5 is an encoder-decoder model"):
            heads.ablate(model, ids, [(0, 1)], ablation)
        with pytest.raises(ValueError, match="t5 is an encoder-decoder model"):
            heads.ablation_sweep(model, ids, ablation)
        return
    layer, head = 1, 2
    z = z_of(model, ids)[layer]                                      # [1, T, H, d_head]
    value = torch.zeros_like(z) if ablation == "zero" else z.mean(1, keepdim=True).expand_as(z)
    where = torch.zeros(1, 1, z.shape[2], 1, dtype=torch.bool)
    where[:, :, head] = True
    logits = model(ids, patches=[Patch("z", layer, value, where)]).logits
    result = heads.ablate(model, ids, [(layer, head)], ablation)
    assert torch.allclose(result.ablated_loss, loss_per_token(model, logits, ids), atol=1e-4)
    assert torch.equal(result.ablated_top, logits[0].argmax(-1))
    assert torch.allclose(result.clean_loss, loss_per_token(model, model(ids).logits, ids), atol=1e-4)
    # the sweep resumes each head's pass mid-stack: the same increase as ablating that head alone
    sweep = heads.ablation_sweep(model, ids, ablation, batch=8)
    assert sweep.shape == (model.config.n_layers, model.config.n_heads)
    assert sweep[layer, head].item() == pytest.approx(result.delta.mean().item(), abs=1e-4)


# ---- attribution ----

@pytest.mark.parametrize("name", FAMILIES)
def test_attribution_is_its_definition_or_refuses(name):
    """Gradient × input and integrated gradients (midpoint rule from the mean embedding row) recomputed by autograd
    on the model's own full logits (final soft-cap and output scale included), and the attention views."""
    model = model_of(name)
    ids = text(n=9, seed=3)
    if name in SEQ2SEQ:
        with pytest.raises(ValueError, match="t5 is an encoder-decoder model"):
            heads.attribute(model, ids, steps=4)
        with pytest.raises(ValueError, match="t5 is an encoder-decoder model"):
            heads.completeness_by_steps(model, ids, steps=(4,))
        return
    position, steps = 6, 4
    result = heads.attribute(model, ids, position=position, layer=1, head=1, steps=steps, baseline="mean")
    seen = ids[:, :position + 1]
    out = model(seen, grad=True)
    logits = out.logits[0, position]
    target = result.target
    assert target == int(logits.argmax())
    logits[target].backward()
    embeds = out.token_embeddings.detach()[0]                        # [T, d]
    assert torch.allclose(result.grad_input, (out.token_embeddings.grad[0] * embeds).sum(-1), atol=1e-4)
    # eq.: IG_i = (x_i − x'_i) · (1/m) Σ_k ∂f(x' + α_k (x − x'))/∂x_i, α_k = (k + ½)/m
    base = model.stack.embed.tokens.weight.mean(0).expand_as(embeds)
    path = torch.zeros_like(embeds)
    for k in range(steps):
        walked = model(seen, grad=True, token_embeddings=(base + (k + 0.5) / steps * (embeds - base))[None])
        walked.logits[0, position, target].backward()
        path += walked.token_embeddings.grad[0]
    integrated = (path / steps * (embeds - base)).sum(-1)
    assert torch.allclose(result.integrated, integrated, atol=1e-4)
    difference = logits[target].item() - model(seen, token_embeddings=base[None]).logits[0, position, target].item()
    assert result.logit_difference == pytest.approx(difference, abs=1e-4)
    assert result.completeness_error == pytest.approx(abs(integrated.sum().item() - difference), abs=1e-4)
    measured = heads.completeness_by_steps(model, ids, position=position, steps=(steps,), baseline="mean")[0]
    assert measured.error == pytest.approx(result.completeness_error, abs=1e-4)
    maps = model(seen, capture_attention=True).attentions
    assert torch.allclose(result.head, maps[1][0, 1, position], atol=TOL)
    assert torch.allclose(result.head_mean, maps[1][0, :, position].mean(0), atol=TOL)


# ---- the logit lens ----

@pytest.mark.parametrize("name", FAMILIES)
def test_logit_lens_last_layer_is_the_models_logits(name):
    """Through the final norm and the whole LM head: Gemma 2's final soft-cap, T5's output scale."""
    model = model_of(name)
    ids = text(seed=4)
    out = model(ids, decoder_input_ids=ids[:, :5] if name in SEQ2SEQ else None, logit_lens=True,
                logit_lens_top_k=None)
    lens = out.logit_lens.values                                     # [L, B, T, vocab]
    assert lens.shape[0] == model.config.n_layers
    assert (lens[-1] - out.logits).abs().max() <= TOL
    assert torch.allclose(out.logit_lens.final_probs[-1], out.logits.softmax(-1).max(-1).values, atol=TOL)
    if name in SEQ2SEQ:
        with pytest.raises(ValueError, match=r"translation \(t5 here\): model\(ids, decoder_input_ids"):
            heads.lens_table(model, ids)
        with pytest.raises(ValueError, match="decoder-only model .* t5 is an encoder-decoder"):
            heads.surprisal(model, ids)
        return
    table = heads.lens_table(model, ids)
    assert torch.equal(table.top[-1], out.logits[0].argmax(-1))
    assert (table.settles <= model.config.n_layers - 1).all()
    surprise = heads.surprisal(model, ids)
    assert torch.allclose(surprise.loss, loss_per_token(model, out.logits, ids), atol=1e-4)


# ---- generation with the KV cache ----

@pytest.mark.parametrize("name", FAMILIES)
def test_generation_and_streamed_rows_equal_the_full_pass(name):
    """Greedy tokens with the cache equal the uncached greedy ones, and each streamed attention row equals the
    last query's row of a full pass over the text so far (past the window of sliding layers, too)."""
    model = model_of(name)
    prompt, new = text(n=7, seed=5), 4
    seq2seq = name in SEQ2SEQ
    made = model.generate(prompt, new)
    steps = list(model.stream(prompt, new, capture_attention=True))
    tokens = [s.token for s in steps]
    start = made.shape[1] - len(tokens)
    assert made[0, start:].tolist() == tokens
    decoder = made[:, :start]
    for i, step in enumerate(steps):
        so_far = torch.cat([decoder, made[:, start:start + i]], 1)
        if seq2seq:
            out = model(prompt, decoder_input_ids=so_far, capture_attention=True)
            cross = torch.stack([m[0, :, -1] for m in out.cross_attentions])
            assert (step.cross_rows.float() - cross).abs().max() <= 1e-3, f"step {i} cross rows"
        else:
            out = model(so_far, capture_attention=True)
        assert int(out.logits[0, -1].argmax()) == step.token, f"step {i} token"
        rows = torch.stack([m[0, :, -1] for m in out.attentions])    # [L, H, Tk]
        assert step.rows.shape == rows.shape
        assert (step.rows.float() - rows).abs().max() <= 1e-3, f"step {i} rows"  # float16 rows
