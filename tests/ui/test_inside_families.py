"""The Inside tab's service and views (ui/services/inside.py, ui/views/inside.py) on a tiny model of every family
with named attention terms (tests/tiny.py): every layer's walk and a score's anatomy return without error, the
words name the terms this family's layer has (its scale, QK-norm, partial or per-layer RoPE, soft-cap, score bias,
window, parallel or sandwich block), and the figures hold the layer's own bias, mask and weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny
from ui.services import inside as service
from ui.services.text import Encoded
from ui.views import inside as views

NAMES = [*tiny.FAMILY_DECODERS, *tiny.FAMILY_SEQ2SEQ]
N = 13   # every term is live on a text this long (tests/tiny.py)


class Letters:
    """A stand-in tokenizer for the tiny models: each id reads as one letter."""

    def decode(self, ids):
        return "".join(chr(97 + int(i) % 26) for i in ids)


@pytest.fixture(scope="module", params=NAMES)
def family(request):
    """(name, our model with a tokenizer to read tokens by, the encoded text)."""
    _, model = tiny.family_pair(request.param)
    model.tokenizer = Letters()
    ids = torch.randint(3, tiny.VOCAB - 1, (N,), generator=torch.Generator().manual_seed(0)).tolist()
    yield request.param, model, Encoded(ids, [f"{i} {chr(97 + t % 26)}" for i, t in enumerate(ids)], [False] * N)
    model.tokenizer = None


def traces(fig, kind: str) -> list:
    return [t for t in fig.data if t.type == kind]


def values(trace) -> np.ndarray:
    return np.asarray(trace.z, dtype=float)


def expected_words(cfg, stages) -> list[str]:
    """What the walk must say for this layer, from the config and the layer's type."""
    words = []
    if cfg.qk_norm:
        words.append("QK-norm")
    if stages.rope_angles is not None and 2 * stages.rope_angles.shape[-1] < cfg.head_dim:
        words.append(f"first {2 * stages.rope_angles.shape[-1]} of {cfg.head_dim} dims")
    if cfg.rope_local_theta and stages.layer_type == "sliding":
        words.append(f"own base {cfg.rope_local_theta:g}")
    if cfg.attn_softcap is not None:
        words.append(f"soft-cap c·tanh(S/c), c = {cfg.attn_softcap:g}")
    if cfg.score_bias == "alibi":
        words.append("ALiBi")
    if cfg.score_bias == "relative":
        words.append("relative-position bias")
    if stages.window is not None:
        words.append(f"keys {cfg.sliding_window} or more positions back")
    if cfg.parallel_block:
        words.append("parallel block")
    if cfg.sandwich_norm:
        words.append("sandwich norms")
    if cfg.norm_offset:
        words.append("(1 + γ)")
    if cfg.attn_scale is not None and cfg.attn_scale != 1:
        words.append(f"{cfg.attn_scale:.4g}, the family's own")
    if cfg.attn_scale == 1:
        words.append("without 1/√d_k")
    return words


def test_the_walk_names_and_draws_each_layers_terms(family):
    name, model, enc = family
    cfg = service.stack_config(model)
    seen_window = False
    for layer in range(cfg.n_layers):
        stages, token, terms, parts = views.walk_stages(model, enc, layer, 1, -1, 1.0, 0, 1.0)
        assert token == N - 1 and len(parts) == views.STAGE_COUNT
        words = terms + " ".join(note for note, _ in parts)
        for expected in expected_words(cfg, stages):
            assert expected in words, f"{name} layer {layer}: no {expected!r} in the walk's words"
        note, fig = parts[4]                                   # stage 5: the scores term by term
        maps = traces(fig, "heatmap")
        np.testing.assert_allclose(values(maps[-1]), stages.probs.numpy(), atol=1e-6)
        masked = values(maps[-2])
        assert np.array_equal(np.isnan(masked), ~stages.mask.numpy())   # the window's cells are masked too
        if stages.bias is not None:
            bias = next(m for m in maps if "bias" in m.name)
            np.testing.assert_allclose(values(bias), stages.bias.numpy(), atol=1e-6)
        if stages.capped is not None:
            capped = next(m for m in maps if m.name.startswith("soft-cap"))
            np.testing.assert_allclose(values(capped), stages.capped.numpy(), atol=1e-6)
        seen_window |= stages.window is not None and "window of" in note
        arrays = service.stage_arrays(stages)
        assert ("bias" in arrays) == (cfg.score_bias != "none")
        assert ("capped" in arrays) == (cfg.attn_softcap is not None)
    assert seen_window == (cfg.sliding_window is not None and "sliding" in cfg.layer_types)


def test_the_anatomy_splits_the_score_before_the_cap_and_shows_the_bias_as_its_own_part(family):
    name, model, enc = family
    cfg = service.stack_config(model)
    layer = cfg.n_layers - 1
    for query, key in ((12, 3), (6, 6)):
        result, note, fig, line = views.anatomy_parts(model, enc, layer, 1, query, key)
        assert f"is **{result.score:+.3f}**" in note and f"add up to **{result.matrix.sum().item():+.3f}**" in note
        waterfall = traces(fig, "waterfall")
        assert bool(waterfall) == (cfg.attn_softcap is not None or cfg.score_bias != "none")
        if cfg.attn_softcap is not None:
            assert "before the cap" in note and "is a tanh, so no part maps through it linearly" in note
            assert f"**{result.capped:+.3f}**" in note
        if cfg.score_bias != "none":
            assert f"{result.bias_label} adds **{result.bias_term:+.3f}**" in note
        if waterfall:
            assert waterfall[0].y[-1] == pytest.approx(result.scored)
            assert waterfall[0].measure[-1] == "total"
        if cfg.qk_norm:
            assert "the QK-norm included" in note
    stages = service.walk(model, enc, layer, 1)
    series = service.content_and_position(model, enc, stages, N - 1)
    if stages.bias is not None and stages.rope_angles is None:
        np.testing.assert_allclose(series["the bias (position)"], stages.bias[N - 1].numpy(), atol=1e-6)
        np.testing.assert_allclose(series["the score (q·k·scale + bias)"], stages.scored[N - 1].numpy(), atol=1e-6)
    m = service.measures(stages, N - 1)
    assert np.isfinite(m.entropy) and np.isfinite(m.entropy_unscaled)
    nxt = service.next_token(model, stages, N - 1, 1.0, 0, 1.0)
    assert (nxt is None) == (stages.logits is None)
    geometry = service.geometry(model, enc, layer, 1)
    assert geometry.queries.shape == (N, 2)


def test_the_split_by_heads_and_against_the_mean_key_adds_up_by_side_or_is_refused_in_words(family):
    """Split by heads, each side's bars (the largest parts and the rest) add up to the score; against the query's
    mean key, the parts add up to score(i, j) − Σ_k a_ik·score(i, k), and the note gives the plain score beside it.
    A family the split is not exact for says why in words."""
    from ui.services.checks import UserError

    name, model, enc = family
    layer = service.stack_config(model).n_layers - 1
    try:
        result, note, fig, _ = views.anatomy_parts(model, enc, layer, 1, 12, 3, "heads", True)
    except UserError as error:
        assert str(error) and "Traceback" not in str(error), name
        return
    plain = views.anatomy_parts(model, enc, layer, 1, 12, 3)[0]
    weights = result.weights
    assert result.pair_score == pytest.approx(plain.score, abs=1e-4)
    assert result.matrix.sum().item() == pytest.approx(result.score, abs=1e-4)
    assert f"**{result.score:+.3f}**" in note and f"{result.pair_score:+.3f}" in note
    assert "mean over its keys" in note and abs(float(weights.sum()) - 1) < 1e-5
    bars = traces(fig, "bar")
    assert len(bars) == 2
    for bar in bars:   # each side: at most 8 parts named, then the rest; they add up to the relative score
        labels = list(bar.y)
        assert len(labels) <= service.SIDE_TOP + 1 and (len(labels) <= service.SIDE_TOP or labels[-1] == "rest")
        assert sum(bar.x) == pytest.approx(result.score, abs=1e-4)
    assert any(label.startswith(f"L{layer - 1} H") for bar in bars for label in bar.y) or layer == 0
    with pytest.raises(UserError, match="Split the score by"):
        views.anatomy_parts(model, enc, layer, 1, 12, 3, "tokens")
