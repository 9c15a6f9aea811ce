"""The Positional encoding tab's bias view (the `position_bias` endpoint's body) on tiny models of the families:
ALiBi's slopes and bias (eq. 6.3), T5's buckets and learned bias (eq. 6.4), and full against partial rotary (eq.
6.2). What is drawn equals core.layers.alibi_slopes / relative_bucket / the model's own tables and θ_i; a model
without the term gets the formula, labelled as such; bad inputs get messages that say what would be right."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import tiny
from core.layers import alibi_slopes, relative_bucket, rope_inv_freq
from ui.services.checks import UserError
from ui.services.positions import MAX_BIAS_DISTANCE
from ui.views.positions import position_bias_view

OWN, FORMULA = "this model's own", "the formula, not this model"


def view(name: str, kind: str, stack: str = "encoder", distance: int = 40):
    """The endpoint's body on a tiny model of family `name` (figure, figure, note)."""
    model = tiny.family_pair(name)[1]
    services = SimpleNamespace(models=SimpleNamespace(get=lambda _name, _progress=None: model))
    return model, position_bias_view(services, name, kind, stack, distance)


def said(fig) -> str:
    """Whose numbers a figure says it draws: its subtitle."""
    return fig.layout.title.subtitle.text


def lines(fig) -> dict:
    return {trace.name: (np.asarray(trace.x, dtype=np.float64), np.asarray(trace.y, dtype=np.float64))
            for trace in fig.data if trace.name and "no bias" not in trace.name and "share" not in trace.name}


def test_alibi_is_the_models_own_slopes_and_bias():
    model, (slopes, bias, note) = view("bloom", "alibi", distance=30)
    own = model.attention_stack()[0].score_bias.slopes.float().numpy()
    np.testing.assert_allclose(own, alibi_slopes(model.config.n_heads).numpy())
    np.testing.assert_allclose(np.asarray(slopes.data[0].y, dtype=np.float64), own, rtol=1e-6)
    drawn = lines(bias)
    assert len(drawn) == model.config.n_heads
    for h, (x, y) in enumerate(drawn.values()):
        np.testing.assert_array_equal(x, np.arange(31))
        np.testing.assert_allclose(y, -own[h] * x, rtol=1e-6, atol=1e-6)
    assert OWN in said(slopes) and OWN in said(bias)
    assert "This model's own ALiBi" in note


@pytest.mark.parametrize("name", ["gpt_neox-parallel", "t5-relu"])
def test_alibi_on_a_model_without_it_is_the_formula_for_its_head_count(name):
    model, (slopes, bias, note) = view(name, "alibi", distance=8)
    expected = alibi_slopes(model.config.n_heads).numpy()
    np.testing.assert_allclose(np.asarray(slopes.data[0].y, dtype=np.float64), expected, rtol=1e-6)
    for h, (x, y) in enumerate(lines(bias).values()):
        np.testing.assert_allclose(y, -expected[h] * x, rtol=1e-6)
    assert FORMULA in said(slopes) and FORMULA in said(bias)
    assert note.startswith("**The formula, not this model**") and "adds no ALiBi" in note
    assert_rule_stated(note, model.config.n_heads, expected)


def assert_rule_stated(note: str, n: int, slopes: np.ndarray) -> None:
    """The caption states the rule its slopes follow: 2^(−8h/n) for a power of two, else the power of two p below
    n and every other slope of 2p's sequence; and the rule it states gives the slopes it lists."""
    p = 2 ** (n.bit_length() - 1)
    if p == n:
        assert f"2^(−8h/n), h = 1…{n}" in note and "not a power of two" not in note
        np.testing.assert_allclose(slopes, [2 ** (-8 * h / n) for h in range(1, n + 1)], rtol=1e-6)
    else:
        assert f"2^(−8h/{p}) for h = 1…{p}" in note and f"2^(−8h/{2 * p})" in note and "2^(−8h/n)" not in note
        np.testing.assert_allclose(slopes[:p], [2 ** (-8 * h / p) for h in range(1, p + 1)], rtol=1e-6)
        np.testing.assert_allclose(slopes[p:], [2 ** (-8 * h / (2 * p)) for h in range(1, 2 * (n - p), 2)],
                                   rtol=1e-6)
    assert ", ".join(f"{m:.3g}" for m in slopes) in note


@pytest.mark.parametrize("n", [1, 4, 6, 9, 12])
def test_the_alibi_caption_states_the_rule_its_slopes_follow_for_any_head_count(n):
    from ui.views.positions import alibi_rule

    slopes = alibi_slopes(n).numpy()
    note = f"slopes {alibi_rule(n)} ({', '.join(f'{m:.3g}' for m in slopes)})"
    assert_rule_stated(note, n, slopes)


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_t5_buckets_and_bias_are_the_stacks_own_table(stack):
    model, (buckets, bias, note) = view("t5-relu", "t5", stack, distance=50)
    cfg = model.config
    drawn = lines(buckets)
    x, encoder = drawn["encoder"]
    _, decoder = drawn["decoder"]
    np.testing.assert_array_equal(x, np.arange(-50, 51))
    delta = torch.arange(-50, 51)
    np.testing.assert_array_equal(encoder, relative_bucket(delta, True, cfg.relative_buckets,
                                                           cfg.relative_max_distance).numpy())
    np.testing.assert_array_equal(decoder, relative_bucket(delta, False, cfg.relative_buckets,
                                                           cfg.relative_max_distance).numpy())
    module = (model.encoder if stack == "encoder" else model.stack).score_bias
    table = module.table.weight.detach().float().numpy()                                   # [buckets, H]
    for h, (i_minus_j, y) in enumerate(lines(bias).values()):
        relative = -i_minus_j.astype(np.int64)                                              # j − i
        assert (relative <= 0).all() if stack == "decoder" else relative.min() == -50 and relative.max() == 50
        index = relative_bucket(torch.as_tensor(relative), stack == "encoder", cfg.relative_buckets,
                                cfg.relative_max_distance).numpy()
        np.testing.assert_allclose(y, table[index, h], rtol=1e-6)
    assert OWN in said(buckets) and OWN in said(bias) and stack in bias.layout.title.text
    assert "This model's own buckets" in note


def test_t5_on_another_model_is_the_formula_with_the_defaults_and_no_bias():
    _, (buckets, bias, note) = view("bloom", "t5", "decoder", distance=200)
    _, encoder = lines(buckets)["encoder"]
    np.testing.assert_array_equal(encoder, relative_bucket(torch.arange(-200, 201), True, 32, 128).numpy())
    assert said(buckets) == FORMULA and buckets.layout.yaxis.title.text == "bucket (of 32)"
    assert not bias.data and "no T5 bias table" in bias.layout.annotations[0].text
    assert note.startswith("**The formula, not this model**") and "no T5 bias table" in note


def closed_form(inv_freq: np.ndarray, d_k: int, distances: np.ndarray) -> np.ndarray:
    """q·R(Δ)k for q = k = 1/√d_k: each rotated dim gives cos(Δθ)/d_k, each unrotated dim 1/d_k."""
    rotated = 2 * np.cos(distances[:, None] * inv_freq[None]).sum(-1)
    return (rotated + d_k - 2 * len(inv_freq)) / d_k


@pytest.mark.parametrize("name,own", [("gpt_neox-sequential", "partial"), ("qwen3", "full"), ("bloom", None)])
def test_partial_and_full_rotary_use_the_models_own_frequencies(name, own):
    model, (angles, scores, note) = view(name, "rope-partial", distance=60)
    cfg, d_k = model.config, model.config.head_dim
    base = cfg.rope_theta if own else 10000.0
    r = 2 * max(1, round(0.25 * d_k / 2))
    frequencies = {"full": rope_inv_freq(d_k, base).double().numpy(),
                   "partial": rope_inv_freq(r, base).double().numpy()}
    if own:
        frequencies[own] = model.inv_freq.double().numpy()                                  # its own θ_i
    drawn_angles, drawn_scores = lines(angles), lines(scores)
    assert len(drawn_angles) == len(drawn_scores) == 2
    for kind, theta in frequencies.items():
        label, rotary = next(k for k in drawn_angles if k.startswith(kind)), 2 * len(theta)
        assert (f"{kind}: {OWN}" in said(angles)) == (own == kind) and f"{rotary} of {d_k} dims" in label
        _, per_dim = drawn_angles[label]
        np.testing.assert_allclose(per_dim[:rotary], np.concatenate([theta, theta]), rtol=1e-6)
        assert (per_dim[rotary:] == 0).all()                                               # unrotated: flat
        x, y = drawn_scores[label]
        np.testing.assert_allclose(y, closed_form(theta, d_k, x), atol=1e-6)
        assert y.min() >= 1 - 2 * rotary / d_k - 1e-6                # the unrotated dims hold the score up
    assert (said(angles) == said(scores) == FORMULA) == (own is None)
    assert note.startswith("**The formula, not this model**" if own is None else f"**This model's own {own}")
    assert f"falls to {lines(scores)[next(k for k in drawn_scores if k.startswith('full'))][1].min():.3g}" in note
    # the partial curve's range past distance 0, as drawn, is the one the caption states
    x, y = drawn_scores[next(k for k in drawn_scores if k.startswith("partial"))]
    assert f"stays between {y[x > 0].min():.3g} and {y[x > 0].max():.3g}" in note and "swings" not in note


@pytest.mark.parametrize("name", ["gemma3", "qwen3"])
def test_a_model_with_a_local_rope_base_says_which_base_is_drawn(name):
    model, (_, _, note) = view(name, "rope-partial", distance=20)
    cfg = model.config
    local = bool(cfg.rope_local_theta) and cfg.rope_local_theta != cfg.rope_theta
    assert local == (name == "gemma3")
    assert ("sliding-window layers rotate at base" in note) == local
    if local:
        assert f"global layers' angles (base {cfg.rope_theta:g})" in note and f"{cfg.rope_local_theta:g}" in note


@pytest.mark.parametrize("kind,stack,distance,message", [
    ("sinusoid", "encoder", 10, "Kind must be one of alibi, t5, rope-partial"),
    ("t5", "middle", 10, "Stack must be one of encoder, decoder"),
    ("alibi", "encoder", 0, "Max distance"),
    ("alibi", "encoder", 10 ** 9, "Max distance"),
    ("alibi", "encoder", "far", "Max distance"),
])
def test_bad_inputs_are_refused_saying_what_would_be_right(kind, stack, distance, message):
    services = SimpleNamespace(models=SimpleNamespace(get=lambda *_: pytest.fail("checked before loading")))
    with pytest.raises(UserError) as caught:
        position_bias_view(services, "bloom", kind, stack, distance)
    assert message in str(caught.value)
    if "Max distance" in message:
        assert str(MAX_BIAS_DISTANCE) in str(caught.value)
