"""Activation patching, direct logit attribution and the information-flow graph on every family of tests/tiny.py:
the sweep's resumed rows against plain patched passes (windows, ALiBi and local RoPE bases all resume
mid-sequence), the attribution's parts against the model's own uncapped and capped logits, and a refusal in
words wherever an analysis is not exact."""
import pytest
import torch

from core.analysis import patching
from core.probe import Patch
from tests import tiny

ANSWER, FOIL = 11, 23
N = 13                      # every family's terms are live on 13 tokens (windows of 4 and 5 hide keys)
AT = (4, 9)                 # where the corrupted prompt differs: the sweep resumes from position 4
DECODERS = sorted(tiny.FAMILY_DECODERS)
POST_LN = {"opt-post-ln"}   # the final residual stream is not a sum of the parts: refused


def model_of(name):
    return tiny.family_pair(name)[1]


def prompts(seed=0):
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, tiny.VOCAB, (1, N), generator=gen)
    corrupted = clean.clone()
    for p in AT:
        corrupted[0, p] = (clean[0, p] + 7) % (tiny.VOCAB - 3) + 3
    return clean, corrupted


def logit_difference(model, ids, patches=(), position=-1):
    logits = model(ids, patches=patches).logits[0, position].float()
    return (logits[ANSWER] - logits[FOIL]).item()


def checked_cells(site, layer, rows, cols):
    """A few cells of each sweep: every row at the first changed position, the second and the last (z over
    layer × head: the first and last head of every layer)."""
    if site == "z" and layer is None:
        return [(r, c) for r in range(rows) for c in (0, cols - 1)]
    return [(r, c) for r in range(rows) for c in (AT[0], AT[1], N - 1)]


def one_patch(site, layer, r, c, n_heads):
    if site == "z" and layer is None:           # head c of layer r at every position
        where = torch.zeros(1, N, n_heads, 1, dtype=torch.bool)
        where[:, :, c] = True
        return r, where
    if site == "z":                              # head r of `layer` at position c
        where = torch.zeros(1, N, n_heads, 1, dtype=torch.bool)
        where[:, c, r] = True
        return layer, where
    where = torch.zeros(1, N, 1, dtype=torch.bool)
    where[:, c] = True
    return r, where


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize("mode", ["denoise", "noise"])
def test_sweep_equals_plain_patched_passes_on_every_family(name, mode):
    model = model_of(name)
    clean, corrupted = prompts()
    source, target = (clean, corrupted) if mode == "denoise" else (corrupted, clean)
    worst = 0.0
    for site, layer in (("resid_pre", None), ("attn_out", None), ("mlp_out", None), ("z", None), ("z", 1)):
        # small batches: several of them, each resuming from its own first changed position
        result = patching.patch_sweep(model, clean, corrupted, ANSWER, FOIL, site, mode=mode, layer=layer,
                                      batch_tokens=20)
        with torch.inference_mode():
            records = model(source, record=site).records[site]
            assert result.clean_metric == pytest.approx(logit_difference(model, clean), abs=1e-5)
            assert result.corrupted_metric == pytest.approx(logit_difference(model, corrupted), abs=1e-5)
            for r, c in checked_cells(site, layer, *result.metrics.shape):
                l, where = one_patch(site, layer, r, c, model.config.n_heads)
                expected = logit_difference(model, target, [Patch(site, l, records[l], where)])
                worst = max(worst, abs(result.metrics[r, c].item() - expected))
    assert worst <= 1e-5, f"{name} {mode}: the sweep differs from plain patched passes by {worst:.3g}"


@pytest.mark.parametrize("name", sorted(tiny.FAMILY_SEQ2SEQ))
def test_encoder_decoders_are_refused_in_words(name):
    model = model_of(name)
    clean, corrupted = prompts()
    for call in (lambda: patching.patch_sweep(model, clean, corrupted, ANSWER, FOIL, "z"),
                 lambda: patching.logit_attribution(model, clean, ANSWER, FOIL),
                 lambda: patching.flow_graph(model, clean)):
        with pytest.raises(ValueError, match="decoder-only"):
            call()


def uncapped_logit_difference(model, ids, position):
    """The model's own logit difference with its final soft-cap switched off (the logits before the cap)."""
    cap, model.lm_head.softcap = model.lm_head.softcap, None
    try:
        return logit_difference(model, ids, position=position)
    finally:
        model.lm_head.softcap = cap


@pytest.mark.parametrize("name", DECODERS)
def test_logit_attribution_adds_up_before_the_cap_and_the_cap_is_its_own_stage(name):
    model = model_of(name)
    clean, _ = prompts(seed=1)
    if name in POST_LN:
        with pytest.raises(ValueError, match="Post-LN.*mixes the parts"):
            patching.logit_attribution(model, clean, ANSWER, FOIL)
        return
    for position in (-1, 6):
        with torch.inference_mode():
            parts = patching.logit_attribution(model, clean, ANSWER, FOIL, position=position)
            own = logit_difference(model, clean, position=position)
            before_cap = uncapped_logit_difference(model, clean, position)
        assert parts.total == pytest.approx(before_cap, abs=1e-5)
        assert abs(parts.parts_sum - before_cap) <= 1e-4, (name, parts.parts_sum, before_cap)
        assert parts.model_total == pytest.approx(own, abs=1e-5)
        if model.config.final_softcap is not None:
            assert parts.softcap == model.config.final_softcap and parts.capped == pytest.approx(own, abs=1e-5)
            assert abs(parts.total - own) > 1e-3       # the cap changes the difference on these weights
        else:
            assert parts.capped is None and parts.total == pytest.approx(own, abs=1e-5)
        assert parts.post_norm == model.config.sandwich_norm


@pytest.mark.parametrize("name", [n for n in DECODERS if n not in POST_LN])
def test_each_layers_head_parts_add_up_to_its_attn_out(name):
    # the per-head parts, through a sandwich post-norm frozen at its input, are what attn_out records
    model = model_of(name)
    clean, _ = prompts(seed=2)
    with torch.inference_mode():
        rec = model(clean, record={"z", "attn_out"}).records
        for l in range(model.config.n_layers):
            for position in (0, 7, N - 1):
                heads, bias, beta = patching.head_outputs(model, l, rec["z"][l][0, position])
                total = heads.sum(0) + sum(v for v in (bias, beta) if v is not None)
                torch.testing.assert_close(total, rec["attn_out"][l][0, position].float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", DECODERS)
def test_flow_graph_on_every_family_or_a_reason(name):
    # the definition itself is checked on transformers' modules in test_flow_graph.py (sequential, parallel and
    # sandwich blocks); here: every family gives a graph whose sums add up, windows hide what they hide
    model = model_of(name)
    cfg = model.config
    ids, _ = prompts(seed=3)
    if name in POST_LN:
        with pytest.raises(ValueError, match="Post-LN.*mixes the parts"):
            patching.flow_graph(model, ids)
        return
    graph = patching.flow_graph(model, ids, threshold=0.0)
    assert graph.parallel == cfg.parallel_block
    mlp = graph.mlp if graph.parallel else 0
    sums = [graph.tokens.sum(-1) + graph.attn_residual + mlp]
    if not graph.parallel:
        sums.append(graph.mlp + graph.mlp_residual)
    for total in sums:   # 1, or 0 where every part of the sum moves away from it (each proximity counts 0)
        assert (((total - 1).abs() < 1e-5) | (total == 0)).all() and (total > 0.5).float().mean() > 0.9
    far = torch.arange(N)[:, None] - torch.arange(N)[None, :]          # i − j
    for l, kind in enumerate(cfg.layer_types or ()):
        if kind == "sliding" and cfg.sliding_window is not None:       # keys out of the window carry nothing
            assert (graph.tokens[l][far >= cfg.sliding_window] == 0).all()
    assert (graph.tokens[:, far < 0] == 0).all()                       # nor do later tokens
    kept = graph.pruned(0.05)
    top = 2 * cfg.n_layers
    sources = {(e.level - 1, e.source) for e in kept.edges} | {(top, N - 1)}
    assert kept.edges and all((e.level, e.target) in sources for e in kept.edges)
