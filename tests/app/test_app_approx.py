"""The `approximation` and `attention_cost` endpoints through gradio_client on the tiny Llama: the run's JSON holds
core.analysis.approx.approximation's numbers (null where a head is not approximated), bad input is answered in words,
and the cost holds the published run as the bench wrote it (or says it has not been published) beside a live timing
at short lengths on the model's attention shape."""
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

from core.analysis.approx import approximation  # noqa: E402
from core.approx import Approx  # noqa: E402
from tests.ui.test_approx_service import published  # noqa: E402
from ui.services.approx import cost as approx_cost  # noqa: E402

TEXT = "The lighthouse keeper rowed out to the rocks at dawn. When the storm passed, she lit the lamp again."


@pytest.fixture(scope="module")
def served(tiny_llama_api_app):
    url, services, llama = tiny_llama_api_app  # the API modules' shared app (tests/conftest.py)
    return dict(client=Client(url, verbose=False), services=services, llama=llama)


def grid(values) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in values], dtype=np.float64)


def test_the_approximation_endpoint_returns_the_cores_numbers(served):
    answer = served["client"].predict(served["llama"], TEXT, "topk", {"k": 4}, "1", api_name="/approximation")
    model = served["services"].models.get(served["llama"])
    ids = torch.tensor(model.tokenizer(TEXT)["input_ids"])
    expected = approximation(model, ids, Approx("topk", [1], k=4))
    assert answer["tokens"] == len(ids) and answer["layers"] == [1] and answer["method"] == "topk"
    assert answer["budget"] == {"k": 4} and answer["description"] == "top-k (k = 4)"
    np.testing.assert_allclose(grid(answer["tv"]), expected.tv.numpy(), rtol=1e-6)   # NaN (null) where NaN
    np.testing.assert_allclose(grid(answer["z_error"]), expected.z_error.numpy(), rtol=1e-6)
    assert answer["tv"][0] == [None] * model.config.n_heads
    assert answer["measure"] == "perplexity"
    assert answer["exact"] == pytest.approx(expected.exact) and answer["approximate"] == pytest.approx(expected.approximate)
    assert answer["change"] == pytest.approx(expected.change)
    assert answer["bytes_per_token"] == {"exact": expected.cache_bytes_exact, "approximate": expected.cache_bytes_approx}
    assert "with exact attention →" in answer["words"]


def test_the_budget_comes_as_an_object_or_its_json_and_defaults_without_one(served):
    client, llama = served["client"], served["llama"]
    as_text = client.predict(llama, TEXT, "bigbird", '{"block": 4, "random_blocks": 0}', "all",
                             api_name="/approximation")
    assert as_text["budget"] == {"block": 4, "global_blocks": 1, "random_blocks": 0, "seed": 0}
    assert as_text["layers"] == "all" and all(v is not None for row in as_text["z_error"] for v in row)
    default = client.predict(llama, TEXT, "performer", api_name="/approximation")
    assert default["budget"] == {"features": 64, "seed": 0} and default["layers"] == "all"
    listed = client.predict(llama, TEXT, "performer", None, [1], api_name="/approximation")
    assert listed["layers"] == [1] and listed["z_error"][0] == [None] * len(listed["z_error"][0])


@pytest.mark.parametrize("args, words", [
    (("topk", {"k": 0}, "all"), "Budget k (keys each query keeps) must be between 1 and 1024, got 0"),
    (("topk", {"window": 3}, "all"), "top-k takes the budget k; not window"),
    (("nothing", None, "all"), "Method must be one of topk, bigbird"),
    (("topk", None, "7"), "Layer must be between 0 and 1, got 7"),
    (("linformer", None, "all"), "a causal model would read its future"),
])
def test_bad_input_is_answered_in_words(served, args, words):
    with pytest.raises(AppError) as refused:
        served["client"].predict(served["llama"], TEXT, *args, api_name="/approximation")
    assert words in str(refused.value)


def test_an_empty_text_and_an_unknown_model_are_answered_in_words(served):
    with pytest.raises(AppError, match="The text is empty"):
        served["client"].predict(served["llama"], "  ", "topk", api_name="/approximation")
    with pytest.raises(AppError, match="Choose a model first"):
        served["client"].predict("", TEXT, api_name="/attention_cost")


def test_attention_cost_gives_the_published_run_and_a_live_timing(served, tmp_path, monkeypatch):
    path = tmp_path / "approx_cost.json"
    path.write_text(json.dumps(published()), encoding="utf-8")
    monkeypatch.setattr(approx_cost, "COST_MEASURED", path)     # the app runs in this process
    answer = served["client"].predict(served["llama"], api_name="/attention_cost")
    table = answer["published"]
    assert list(table["methods"]) == ["eager", "sdpa", "topk", "bigbird", "performer", "sdpa_bi", "linformer"]
    assert table["methods"]["sdpa"]["median_seconds"] == pytest.approx([1e-3, 4e-3, 16e-3])
    assert table["crossover"][0]["method"] == "bigbird" and table["device"] == "cpu"
    assert "What a GPU would change is not measured here" in answer["published_words"]
    live = answer["live"]
    cfg = served["services"].models.get(served["llama"]).config
    assert live["label"] == "live, this machine, short lengths only" and live["lengths"] == [256, 512]
    assert live["shape"] == {"heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads, "d_head": cfg.head_dim,
                             "dtype": "float32"}
    assert list(live["methods"]) == ["eager", "sdpa", "topk", "bigbird", "performer"]   # a decoder: no Linformer
    assert live["budgets"]["topk"] == {"k": 16}                   # the published run's budgets
    assert live["methods"]["sdpa"]["ratio_to_sdpa"] == [1.0, 1.0]
    assert all(len(s) == live["repeats"] and min(s) > 0 for m in live["methods"].values() for s in m["seconds"])
    monkeypatch.setattr(approx_cost, "COST_MEASURED", tmp_path / "absent.json")
    absent = served["client"].predict(served["llama"], api_name="/attention_cost")
    assert absent["published"] is None and "has not been published yet" in absent["published_words"]
    assert list(absent["live"]["methods"]) == list(live["methods"])
