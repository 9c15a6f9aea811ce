"""Activation patching, direct logit attribution and the information-flow graph: the identities that define
them, the batched sweep against single patched passes, and the IOI pair on the real SmolLM2."""
import pytest
import torch

from core import load_model
from core.analysis import patching
from core.probe import Patch
from tests import tiny

ANSWER, FOIL = 11, 23
IOI = ("When Mary and John went to the store, John gave a drink to",
       "When Mary and John went to the store, Mary gave a drink to")


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request):
    build = {"gpt2": tiny.gpt2, "llama": lambda: tiny.llama(num_key_value_heads=2)}[request.param]
    return load_model(tiny.save(build()), device="cpu")


def pair(n=9, at=(5,), seed=0):
    """A clean prompt [1, n] and a corrupted one that differs at the positions `at`."""
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, tiny.VOCAB, (1, n), generator=gen)
    corrupted = clean.clone()
    for p in at:
        corrupted[0, p] = (clean[0, p] + 7) % (tiny.VOCAB - 3) + 3
    return clean, corrupted


def last_metric(model, ids, patches=()):
    logits = model(ids, patches=patches).logits[0, -1].float()
    return (logits[ANSWER] - logits[FOIL]).item()


def test_patching_all_of_layer_0_gives_the_clean_run_and_patching_nothing_the_corrupted(model):
    clean, corrupted = pair(at=(2, 6))
    with torch.inference_mode():
        source = model(clean, record="resid_pre").records["resid_pre"][0]
        everything = model(corrupted, patches=[Patch("resid_pre", 0, source)]).logits
        nothing = model(corrupted, patches=[Patch("resid_pre", 0, source, torch.zeros(1, 9, 1, dtype=torch.bool))]).logits
        assert torch.equal(everything, model(clean).logits)
        assert torch.equal(nothing, model(corrupted).logits)


def single_patch(site: str, layer: int | None, r: int, c: int, n: int, n_heads: int) -> tuple[int, torch.Tensor]:
    """The layer and the bool mask of the one patch behind the sweep's cell (r, c), for a prompt of n tokens."""
    if site == "z" and layer is None:           # head c of layer r at every position
        where = torch.zeros(1, n, n_heads, 1, dtype=torch.bool)
        where[:, :, c] = True
        return r, where
    if site == "z":                              # head r of `layer` at position c
        where = torch.zeros(1, n, n_heads, 1, dtype=torch.bool)
        where[:, c, r] = True
        return layer, where
    where = torch.zeros(1, n, 1, dtype=torch.bool)   # position c of layer r
    where[:, c] = True
    return r, where


@pytest.mark.parametrize("site,layer", [("resid_pre", None), ("attn_out", None), ("mlp_out", None), ("z", None),
                                        ("z", 1)])
@pytest.mark.parametrize("mode", ["denoise", "noise"])
@pytest.mark.parametrize("at", [(3, 5), (0,)], ids=["differs-at-3-and-5", "differs-at-0"])
def test_batched_sweep_equals_single_patched_passes(model, site, layer, mode, at):
    # every cell against its own one-pass-per-patch run; a pair that differs at position 0 leaves the batches no
    # shared prefix to resume from
    clean, corrupted = pair(at=at)
    n = clean.shape[1]
    result = patching.patch_sweep(model, clean, corrupted, ANSWER, FOIL, site, mode=mode, layer=layer,
                                  batch_tokens=16)   # several batches, each resuming from its own start
    cfg = model.config
    source, target = (clean, corrupted) if mode == "denoise" else (corrupted, clean)
    with torch.inference_mode():
        records = model(source, record=site).records[site]
        assert result.clean_metric == pytest.approx(last_metric(model, clean), abs=1e-5)
        assert result.corrupted_metric == pytest.approx(last_metric(model, corrupted), abs=1e-5)
        rows, cols = result.scores.shape
        assert result.axes == (("head", "position") if layer is not None else
                               ("layer", "head") if site == "z" else ("layer", "position"))
        expected_shape = {("z", None): (cfg.n_layers, cfg.n_heads), ("z", 1): (cfg.n_heads, n)}.get(
            (site, layer), (cfg.n_layers, n))
        assert (rows, cols) == expected_shape
        singles = torch.empty(rows, cols)
        for r in range(rows):
            for c in range(cols):
                l, where = single_patch(site, layer, r, c, n, cfg.n_heads)
                singles[r, c] = last_metric(model, target, [Patch(site, l, records[l], where)])
    torch.testing.assert_close(result.metrics, singles, atol=1e-5, rtol=0)
    expected = (result.metrics - result.corrupted_metric) / (result.clean_metric - result.corrupted_metric)
    torch.testing.assert_close(result.scores, expected)


def test_denoising_and_noising_obey_the_identities_on_both_ends(model):
    clean, corrupted = pair(at=(4,))
    denoise = patching.patch_sweep(model, clean, corrupted, ANSWER, FOIL, "resid_pre", mode="denoise")
    noise = patching.patch_sweep(model, clean, corrupted, ANSWER, FOIL, "resid_pre", mode="noise")
    # the one differing token at layer 0 carries everything: writing it turns one run into the other
    assert denoise.scores[0, 4].item() == pytest.approx(1.0, abs=1e-5)
    assert noise.scores[0, 4].item() == pytest.approx(0.0, abs=1e-5)
    # positions before it are the same in both runs, at every layer: patching them changes nothing
    assert torch.equal(denoise.scores[:, :4], torch.zeros(model.config.n_layers, 4))
    assert torch.equal(noise.scores[:, :4], torch.ones(model.config.n_layers, 4))
    # and so are the other positions of layer 0 (the embeddings of the same tokens)
    assert torch.equal(denoise.scores[0, 5:], torch.zeros(4))
    assert denoise.computed < denoise.scores.numel()


def test_sweep_refuses_what_it_cannot_measure(model):
    clean, corrupted = pair()
    with pytest.raises(ValueError, match="same T"):
        patching.patch_sweep(model, clean, corrupted[:, :-1], ANSWER, FOIL, "resid_pre")
    with pytest.raises(ValueError, match="site must be one of"):
        patching.patch_sweep(model, clean, corrupted, ANSWER, FOIL, "pattern")
    with pytest.raises(ValueError, match="mode must be"):
        patching.patch_sweep(model, clean, corrupted, ANSWER, FOIL, "z", mode="both")
    with pytest.raises(ValueError, match="site 'z' only"):
        patching.patch_sweep(model, clean, corrupted, ANSWER, FOIL, "resid_pre", layer=0)
    with pytest.raises(ValueError, match="answer must be a token id"):
        patching.patch_sweep(model, clean, corrupted, tiny.VOCAB, FOIL, "z")
    with pytest.raises(ValueError, match="same logit difference"):
        patching.patch_sweep(model, clean, clean, ANSWER, FOIL, "z")
    bert = load_model(tiny.save(tiny.bert()), device="cpu")
    for call in (lambda: patching.patch_sweep(bert, clean, corrupted, ANSWER, FOIL, "z"),
                 lambda: patching.logit_attribution(bert, clean, ANSWER, FOIL),
                 lambda: patching.flow_graph(bert, clean)):
        with pytest.raises(ValueError, match="decoder-only"):
            call()


def test_logit_attribution_adds_up_to_the_logit_difference(model):
    clean, _ = pair(n=12)
    for position in (-1, 5):
        parts = patching.logit_attribution(model, clean, ANSWER, FOIL, position=position)
        logits = model(clean).logits[0, position].float()
        assert parts.total == pytest.approx((logits[ANSWER] - logits[FOIL]).item(), abs=1e-5)
        assert parts.parts_sum == pytest.approx(parts.total, abs=1e-4)
        cfg = model.config
        assert parts.heads.shape == (cfg.n_layers, cfg.n_heads) and parts.mlps.shape == (cfg.n_layers,)
    # swapping answer and foil flips every part
    swapped = patching.logit_attribution(model, clean, FOIL, ANSWER, position=5)
    torch.testing.assert_close(swapped.heads, -parts.heads)


@pytest.mark.real_weights
def test_smollm2_ioi_pair_flips_and_its_residual_map_moves_from_the_name_to_the_end(smollm):
    tok = smollm.tokenizer
    clean, corrupted = (torch.tensor([tok(t).input_ids]) for t in IOI)
    mary, john = tok(" Mary").input_ids[0], tok(" John").input_ids[0]
    result = patching.patch_sweep(smollm, clean, corrupted, mary, john, "resid_pre")
    assert result.clean_metric > 0 > result.corrupted_metric
    name = 9                                                      # the second " John" / " Mary"
    assert tok.convert_ids_to_tokens(clean[0, name].item()) == "ĠJohn"
    layers = smollm.config.n_layers
    assert (result.scores[:layers // 3].argmax(-1) == name).all()
    assert (result.scores[-3:].argmax(-1) == clean.shape[1] - 1).all()
    assert result.scores[0, name].item() == pytest.approx(1.0, abs=1e-4)
    parts = patching.logit_attribution(smollm, clean, mary, john)
    assert parts.parts_sum == pytest.approx(parts.total, abs=1e-4 * max(1.0, abs(parts.total)))
