"""The Generate tab's step view, trace, download and KV panel through gradio_client, on tiny random models
(a Llama decoder, a Marian encoder-decoder, a BERT encoder), with every bad input's message."""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from tiny_app_model import build_tiny_bert, build_tiny_llama, build_tiny_marian, launch_app  # noqa: E402
from ui.services import generation  # noqa: E402
from ui.services.jobs import Turns  # noqa: E402
from ui.views import generate as generate_views  # noqa: E402

PROMPT = "The lighthouse keeper rowed out"
SETTINGS = (False, 8, 0.0, 0, 1.0, 0)  # chat off, 8 new tokens, greedy, top-k off, top-p off, seed 0


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-generation-models")
    return {"llama": str(build_tiny_llama(root / "tiny-llama")), "bert": str(build_tiny_bert(root / "tiny-bert")),
            "marian": str(build_tiny_marian(root / "tiny-marian"))}


@pytest.fixture(scope="module")
def server(tiny_models):
    demo, url, services = launch_app(list(tiny_models.values()), tiny_models["llama"])
    yield url, services
    demo.close()


@pytest.fixture(scope="module")
def url(server):
    return server[0]


@pytest.fixture
def client(url):
    return Client(url, verbose=False)  # a fresh session: its own trace


def test_endpoints_are_listed(client):
    names = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert {"/generation_trace", "/generation_step", "/kv_cache", "/export_generation", "/generate"} <= names


def test_generation_trace_gives_top10_and_the_chosen_rank(client, tiny_models):
    continuation, trace = client.predict(tiny_models["llama"], PROMPT, *SETTINGS, api_name="/generation_trace")
    assert trace["continuation"] == continuation and trace["n_tokens"] == len(trace["steps"]) > 0
    for step in trace["steps"]:
        probs = [t["p"] for t in step["top"]]
        assert len(probs) == generation.TOP_PROBS and probs == sorted(probs, reverse=True)
        assert step["rank"] == 1  # greedy picks the most likely token
        assert step["top"][0]["id"] == step["token_id"] and step["probability"] == pytest.approx(probs[0], abs=1e-6)


def test_sampling_shows_where_the_picked_token_ranked(client, tiny_models):
    _, trace = client.predict(tiny_models["llama"], PROMPT, False, 24, 2.0, 0, 1.0, 7, api_name="/generation_trace")
    ranks = [s["rank"] for s in trace["steps"]]
    assert any(r > 1 for r in ranks), "at temperature 2 some picked token should not be the most likely"
    for step in trace["steps"]:
        if step["rank"] <= generation.TOP_PROBS:
            assert step["top"][step["rank"] - 1]["id"] == step["token_id"]
        else:
            assert step["probability"] <= step["top"][-1]["p"]


def test_generation_step_reads_the_sessions_trace(client, tiny_models):
    _, trace = client.predict(tiny_models["llama"], PROMPT, *SETTINGS, api_name="/generation_trace")
    last = trace["n_tokens"] - 1
    note, probs, row, overview, shaded, numbers = client.predict(last, 1, 2, api_name="/generation_step")
    assert f"Step {last}" in note and "most likely" in note
    n_context = len(numbers["keys"])
    assert len(numbers["head_row"]) == len(numbers["mean_row"]) == n_context
    assert sum(numbers["head_row"]) == pytest.approx(1.0, abs=2e-3)
    assert sum(numbers["mean_row"]) == pytest.approx(1.0, abs=2e-3)
    figure = json.loads(row["plot"])
    assert [t["name"] for t in figure["data"]] == ["head 2", "mean of heads"]
    assert len(json.loads(overview["plot"])["data"][0]["y"]) == 2 * 4  # layers × heads of the tiny Llama
    assert shaded.count('class="tok current"') == 1 and "data-weight" in shaded
    # an earlier step sees fewer tokens: one less per step back
    numbers_0 = client.predict(0, 1, 2, api_name="/generation_step")[-1]
    assert len(numbers_0["keys"]) == n_context - last


def test_generation_step_on_marian_has_a_cross_attention_row(client, tiny_models):
    _, trace = client.predict(tiny_models["marian"], PROMPT, *SETTINGS, api_name="/generation_trace")
    assert trace["n_tokens"] > 0
    numbers = client.predict(0, 0, 1, api_name="/generation_step")[-1]
    assert len(numbers["keys"]) == 1  # the decoder start token
    assert len(numbers["cross_head_row"]) == len(numbers["source_keys"]) > 1
    assert sum(numbers["cross_head_row"]) == pytest.approx(1.0, abs=2e-3)


@pytest.mark.parametrize("args, message", [
    ((99, 0, 0), "Step must be between 0 and"),
    ((-1, 0, 0), "Step must be between 0 and"),
    ((0, 2, 0), "Layer must be between 0 and 1"),
    ((0, 0, 4), "Head must be between 0 and 3"),
])
def test_generation_step_out_of_range(client, tiny_models, args, message):
    client.predict(tiny_models["llama"], PROMPT, *SETTINGS, api_name="/generation_trace")
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name="/generation_step")


def test_generation_step_and_export_need_a_generation_first(client):
    with pytest.raises(AppError, match="Generate something first"):
        client.predict(0, 0, 0, api_name="/generation_step")
    with pytest.raises(AppError, match="Generate something first"):
        client.predict(api_name="/export_generation")


def test_bad_generation_inputs(client, tiny_models):
    with pytest.raises(AppError, match="prompt is empty"):
        client.predict(tiny_models["llama"], "  ", *SETTINGS, api_name="/generation_trace")
    with pytest.raises(AppError, match="no-such-model"):
        client.predict("no-such-model", PROMPT, *SETTINGS, api_name="/generation_trace")
    with pytest.raises(AppError, match="encoder"):
        client.predict(tiny_models["bert"], PROMPT, *SETTINGS, api_name="/generation_trace")


def test_export_downloads_the_trace_as_json(client, tiny_models):
    continuation, trace = client.predict(tiny_models["llama"], PROMPT, *SETTINGS, api_name="/generation_trace")
    path, note = client.predict(api_name="/export_generation")
    assert os.path.getsize(path) < generate_views.MAX_EXPORT_BYTES and "per head" in note
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    assert data["continuation"] == continuation and data["steps"] == trace["steps"]
    attention = data["attention"]
    assert attention["layout"] == "per head" and attention["pooled"] == "nothing"
    rows = np.array(attention["self"][0])  # [layers, heads, prompt tokens]
    assert rows.shape == (2, 4, len(data["context_tokens"]))
    np.testing.assert_allclose(rows.sum(-1), 1.0, atol=2e-3)


def test_kv_cache_sizes_and_timing(client, tiny_models):
    note, table, figure, numbers = client.predict(tiny_models["llama"], PROMPT, api_name="/kv_cache")
    assert numbers["allocated_bytes_current"] == numbers["formula_bytes_current"] > 0
    current = numbers["sizes"]["lengths"]["current"]
    assert current["model"]["float32"] == 2 * current["model"]["bfloat16"]
    assert current["no_gqa"]["float32"] == 2 * current["model"]["float32"]  # 4 query heads, 2 KV heads
    assert numbers["timing"]["with_cache_tokens_per_s"] > 0 and numbers["timing"]["without_cache_tokens_per_s"] > 0
    assert "tokens/s" in note and "n^" in note
    assert len(table["data"]) == 2 and table["headers"][0] == "length"
    assert "allocated" in table["headers"][-1]
    assert [t["name"] for t in json.loads(figure["plot"])["data"]][:2] == [
        "without cache: one pass over all n tokens", "with cache: one decode step"]


def test_kv_cache_bad_inputs(client, tiny_models):
    with pytest.raises(AppError, match="prompt is empty"):
        client.predict(tiny_models["llama"], "", api_name="/kv_cache")
    with pytest.raises(AppError, match="no-such-model"):
        client.predict("no-such-model", PROMPT, api_name="/kv_cache")
    with pytest.raises(AppError, match="encoder"):
        client.predict(tiny_models["bert"], PROMPT, api_name="/kv_cache")


def test_streamed_generation_fills_the_trace_used_by_the_step_view(client, tiny_models):
    job = client.submit(tiny_models["llama"], PROMPT, *SETTINGS, api_name="/generate")
    continuation, _ = job.result()
    numbers = client.predict(0, 0, 0, api_name="/generation_step")[-1]
    assert numbers["step"] == 0 and numbers["head_row"] is not None
    assert continuation


class LoggedTurns(Turns):
    """One slot, logging which request (its worker thread) holds each turn. The first turn is held until a second
    request waits for one, so the two requests overlap however the server schedules them."""

    def __init__(self):
        super().__init__(1)
        self.log: list[int] = []
        self.held = threading.local()

    @contextmanager
    def turn(self):
        with super().turn():
            if not self.log:
                deadline = time.monotonic() + 30
                while self.waiting() == 0 and time.monotonic() < deadline:
                    time.sleep(0.005)
            self.log.append(threading.get_ident())
            self.held.now = True
            try:
                yield
            finally:
                self.held.now = False


def test_generation_trace_takes_its_tokens_in_turn_like_the_page(server, tiny_models, monkeypatch):
    """Two API traces at once, with one slot: every token is computed inside a turn of the shared Turns, and the
    second request's first token comes right after the first request's first token, not after its whole run."""
    url, services = server
    turns = LoggedTurns()
    monkeypatch.setattr(services, "turns", turns)
    model = services.models.get(tiny_models["llama"])
    original, outside = model.stream, []

    def stream(*args, **kwargs):  # the model's own stream; notes a step computed outside a turn
        for step in original(*args, **kwargs):
            if not getattr(turns.held, "now", False):
                outside.append(int(step.token))
            yield step

    monkeypatch.setattr(model, "stream", stream)
    settings = (False, 12, 0.0, 0, 1.0, 0)
    jobs = [Client(url, verbose=False).submit(tiny_models["llama"], PROMPT, *settings, api_name="/generation_trace")
            for _ in range(2)]
    (text_a, trace_a), (text_b, trace_b) = (job.result(timeout=120) for job in jobs)
    assert text_a == text_b and trace_a["n_tokens"] == trace_b["n_tokens"] > 0  # greedy: the same continuation
    assert not outside, f"{len(outside)} tokens were computed outside the generation turns"
    requests = list(dict.fromkeys(turns.log))
    assert len(requests) == 2, turns.log
    # one turn per token and one more that finds the end
    assert sorted(turns.log.count(r) for r in requests) == [trace_a["n_tokens"] + 1] * 2
    assert turns.log[1] == requests[1], "the second trace waited for the whole first one"
