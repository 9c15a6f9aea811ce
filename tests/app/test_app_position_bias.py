"""The `position_bias` endpoint through gradio_client, on a tiny random Llama (full RoPE, no score bias): ALiBi and
T5's buckets come from the formula and say so, RoPE's full rotary is the model's own θ_i, and bad settings are named."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from core.layers import alibi_slopes, relative_bucket  # noqa: E402
from tiny_app_model import plotly_array  # noqa: E402

FORMULA = "the formula, not this model"


@pytest.fixture(scope="module")
def served(tiny_llama_api_app):
    url, services, llama = tiny_llama_api_app  # the API modules' shared app (tests/conftest.py)
    return dict(llama=llama, services=services, client=Client(url, verbose=False))


def figure(plot: dict) -> dict:
    assert plot["type"] == "plotly"
    return json.loads(plot["plot"])


def test_alibi_on_a_rope_model_is_the_formula_for_its_heads(served):
    slopes, bias, note = served["client"].predict(served["llama"], "alibi", "encoder", 20, api_name="/position_bias")
    slopes, bias = figure(slopes), figure(bias)
    np.testing.assert_allclose(plotly_array(slopes["data"][0]["y"]), alibi_slopes(4).numpy(), rtol=1e-6)
    head0 = plotly_array(bias["data"][0]["y"])
    np.testing.assert_allclose(head0, -alibi_slopes(4)[0].item() * np.arange(21), rtol=1e-6)
    assert FORMULA in slopes["layout"]["title"]["subtitle"]["text"] and note.startswith("**The formula, not this model**")


def test_t5_buckets_are_the_formula_with_t5s_defaults(served):
    buckets, bias, note = served["client"].predict(served["llama"], "t5", "decoder", 150, api_name="/position_bias")
    buckets = figure(buckets)
    traces = {t["name"]: plotly_array(t["y"]) for t in buckets["data"]}
    delta = torch.arange(-150, 151)
    np.testing.assert_array_equal(traces["encoder"], relative_bucket(delta, True, 32, 128).numpy())
    np.testing.assert_array_equal(traces["decoder"], relative_bucket(delta, False, 32, 128).numpy())
    assert buckets["layout"]["title"]["subtitle"]["text"] == FORMULA and "no T5 bias table" in note


def test_full_rotary_is_the_models_own_frequencies(served):
    angles, scores, note = served["client"].predict(served["llama"], "rope-partial", "encoder", 30,
                                                    api_name="/position_bias")
    own = served["services"].models.get(served["llama"]).inv_freq.double().numpy()   # [d_k/2]
    full = next(t for t in figure(angles)["data"] if t["name"].startswith("full"))
    assert figure(angles)["layout"]["title"]["subtitle"]["text"] == "full: this model's own; partial: the formula"
    np.testing.assert_allclose(plotly_array(full["y"]), np.concatenate([own, own]), rtol=1e-6)
    np.testing.assert_array_equal(plotly_array(figure(scores)["data"][0]["x"]), np.arange(31))
    assert note.startswith("**This model's own full rotary**")


@pytest.mark.parametrize("kind,stack,distance,message", [
    ("nope", "encoder", 10, r"Kind: Value: nope is not in the list of choices: \['alibi', 't5', 'rope-partial'\]"),
    ("t5", "both", 10, r"T5 stack: Value: both is not in the list of choices: \['encoder', 'decoder'\]"),
    ("alibi", "encoder", 0, "Max distance must be between 1 and 2048, got 0"),
    ("alibi", "encoder", 10 ** 7, "Max distance must be between 1 and 2048"),
])
def test_bad_settings_are_named(served, kind, stack, distance, message):
    with pytest.raises(AppError, match=message):
        served["client"].predict(served["llama"], kind, stack, distance, api_name="/position_bias")
