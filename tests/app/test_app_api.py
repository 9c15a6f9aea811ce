"""The launched app, driven through gradio_client exactly as an API user would, on tiny random models.

The server runs in this process (ui.page.build_page with app.launch_options, the same as `python app.py`),
on a free loopback port, with a tiny Llama (decoder, RoPE, GQA) and a tiny BERT (encoder, learned
positions). One test also starts `python app.py` itself as a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"  # a hub-only model must fail fast and clearly, never hang

from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app, plotly_array  # noqa: E402
from ui.services.attention import HEAD_OVERVIEW_SIZE  # noqa: E402
from ui.services.checks import REPO_ROOT  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MAX_FIGURE_BYTES = 2_000_000
TEXT = "The lighthouse keeper rowed out to the rocks at dawn. When the storm passed, she lit the lamp again."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-app-models")
    bert = build_tiny_bert(root / "tiny-bert")
    config = json.loads((bert / "config.json").read_text())  # a field no family table names: read by no one here
    (bert / "config.json").write_text(json.dumps({**config, "some_future_flag": True}))
    return {"llama": str(build_tiny_llama(root / "tiny-llama")), "bert": str(bert)}


@pytest.fixture(scope="module")
def server(tiny_models):
    # closed when the module ends: an idle app's queue loop keeps about 5 % of a core busy for the rest of the run
    demo, url, _ = launch_app([tiny_models["llama"], tiny_models["bert"]], tiny_models["llama"])
    yield demo, url
    demo.close()


@pytest.fixture(scope="module")
def client(server):
    return Client(server[1], verbose=False)


def test_every_event_is_queued_with_a_concurrency_limit(server):
    demo, _ = server
    fns = {fn.api_name: fn for fn in demo.fns.values() if fn.api_name}
    short = ("head_atlas", "ablate_heads", "logit_lens", "surprisal", "logit_attribution", "flow_graph")
    heavy = ("ablation_sweep", "attribute", "patch_sweep")
    for name in ("generate", "attention", "positional_encoding", "mask_demo", *short, *heavy):
        assert fns[name].queue, name
        limit = 8 if name == "generate" else 2  # generations stream together, their tokens computed in turn
        assert isinstance(fns[name].concurrency_limit, int) and fns[name].concurrency_limit <= limit, name
    # the short forward-pass events share one slot: two users' long captures never run at once on a small CPU
    assert (
        fns["attention"].concurrency_id == fns["mask_demo"].concurrency_id == fns["positional_encoding"].concurrency_id
    )
    assert {fns[name].concurrency_id for name in short} == {fns["attention"].concurrency_id}
    # the long jobs have their own slots, so a short call never waits behind a sweep
    assert len({fns[name].concurrency_id for name in heavy}) == 1
    assert fns["patch_sweep"].concurrency_id != fns["attention"].concurrency_id


def figure(plot: dict) -> dict:
    """The plotly figure dict that a gr.Plot output carries, checked for size on the way."""
    assert plot["type"] == "plotly"
    assert len(plot["plot"].encode()) < MAX_FIGURE_BYTES
    return json.loads(plot["plot"])


def attention(client, model, text=TEXT, layer=0, head="mean of heads", hide=False, q0=0, k0=0, window=64,
              columns=False):
    """The note, the model view, the head view and the window (and the two-column view when `columns`)."""
    out = client.predict(model, text, layer, head, hide, q0, k0, window, api_name="/attention")
    assert len(out) == 5
    return out if columns else out[:4]


def test_every_endpoint_is_named_in_the_api(client):
    names = set(client.view_api(return_format="dict", print_info=False)["named_endpoints"])
    assert {"/generate", "/attention", "/positional_encoding", "/mask_demo", "/load_text", "/load_model"} <= names
    assert {"/head_atlas", "/ablate_heads", "/ablation_sweep", "/attribute", "/logit_lens", "/surprisal"} <= names


def test_model_card_compares_parameter_counts_with_4d2_and_8d2(client, tiny_models):
    card = client.predict(tiny_models["llama"], api_name="/load_model")
    assert "2 layers, 4 heads, 2 key/value heads" in card
    assert "4d² = 4,096" in card and "8d² = 8,192" in card  # d = 32
    assert "rope" in card
    assert "Not read from config.json" not in card


def test_the_load_endpoint_names_the_config_fields_the_core_did_not_read(client, tiny_models):
    card = client.predict(tiny_models["bert"], api_name="/load_model")
    assert "Not read from config.json:** `some_future_flag`" in card


def test_attention_on_a_decoder_gives_model_view_head_view_and_window(client, tiny_models):
    note, model_view, head_view, window = attention(client, tiny_models["llama"], head="1", window=5, q0=3, k0=1)
    assert "tokens" in note
    mv = figure(model_view)
    assert mv["layout"]["meta"]["layers"] == 2 and mv["layout"]["meta"]["heads"] == 4
    hv = figure(head_view)["data"][0]
    z = plotly_array(hv["z"])
    n = len(hv["x"])
    assert z.shape == (n, n) and n > 10
    assert hv["x"][0].startswith("0 ") and hv["y"][1].startswith("1 ")
    np.testing.assert_allclose(z.sum(1), 1.0, atol=1e-5)  # each query's weights sum to 1
    assert np.all(z[np.triu_indices(n, 1)] == 0)  # causal: nothing above the diagonal
    assert "query %{y} → key %{x}" in hv["hovertemplate"]
    win = figure(window)["data"][0]
    wz = plotly_array(win["z"])
    assert wz.shape == (5, 5)
    assert win["y"][0].startswith("3 ") and win["x"][0].startswith("1 ")
    np.testing.assert_allclose(wz, z[3:8, 1:6], atol=1e-6)  # the window is the same matrix, unpooled


def test_the_two_column_view_draws_the_window_queries_weights_as_line_opacities(client, tiny_models):
    *_, head_view, _, columns = attention(client, tiny_models["llama"], layer=1, head="2", window=6, q0=2,
                                          columns=True)
    z = plotly_array(figure(head_view)["data"][0]["z"]).astype(np.float64)
    fig = figure(columns)
    assert fig["layout"]["meta"]["view"] == "two-column" and fig["layout"]["meta"]["tokens"] == 6
    step = 1 / fig["layout"]["meta"]["levels"]
    drawn = {}
    for trace in fig["data"]:
        meta = trace.get("meta") or {}
        if meta.get("role") == "lines" and meta["side"] == "query":
            ys = [y for y in trace["y"] if y is not None]
            for i, j in zip(ys[::2], ys[1::2]):
                drawn[(i, j)] = meta["opacity"]
    window = z[2:8, 2:8]  # tokens 2–7 attending among themselves
    for i in range(6):
        for j in range(6):
            if window[i, j] >= fig["layout"]["meta"]["min_weight"]:
                assert abs(drawn[(i, j)] - window[i, j]) <= step, (i, j)
            else:
                assert (i, j) not in drawn


def test_attention_on_an_encoder_is_bidirectional_and_can_hide_special_tokens(client, tiny_models):
    _, _, head_view, _ = attention(client, tiny_models["bert"])
    hv = figure(head_view)["data"][0]
    z = plotly_array(hv["z"])
    assert z[np.triu_indices(len(z), 1)].max() > 0.01  # queries see later keys too
    assert hv["x"][0] == "0 [CLS]" and hv["x"][-1].endswith("[SEP]")
    _, _, hidden, _ = attention(client, tiny_models["bert"], hide=True)
    labels = figure(hidden)["data"][0]["x"]
    assert len(labels) == len(hv["x"]) - 2 and not any("[CLS]" in t or "[SEP]" in t for t in labels)


def test_long_input_is_pooled_truncated_with_a_note_and_every_figure_stays_under_2_mb(client, tiny_models):
    text = " ".join([TEXT] * 150)  # ~3,000 tokens for the tiny tokenizer; the view's limit is 2,048
    started = time.perf_counter()
    note, model_view, head_view, window = attention(
        client, tiny_models["llama"], text=text, q0=1500, k0=1400, window=256
    )
    seconds = time.perf_counter() - started
    assert "only the first 2,048 are used" in note and "were dropped" in note
    assert "Model view: each tile averages" in note and "Head view: each cell is the mean" in note
    total = sum(len(p["plot"].encode()) for p in (model_view, head_view, window))
    hv = figure(head_view)["data"][0]
    assert plotly_array(hv["z"]).shape == (HEAD_OVERVIEW_SIZE, HEAD_OVERVIEW_SIZE)
    win = figure(window)["data"][0]
    assert plotly_array(win["z"]).shape == (256, 256) and win["y"][0].startswith("1500 ")
    tile = figure(model_view)["layout"]["meta"]["tile"]
    assert tile < 2048
    print(f"\n2,048 tokens: figures {total:,} bytes in all, answered in {seconds:.1f} s")
    # the same session moving its window over the same text keeps the all-layer pass
    note, _, _, window = attention(client, tiny_models["llama"], text=text, layer=1, q0=10, k0=0, window=32)
    assert "layer 1 recomputed" in note and "kept from the last run" in note
    assert figure(window)["data"][0]["y"][0].startswith("10 ")


def test_generate_streams_tokens_and_reports_speed(client, tiny_models):
    job = client.submit(tiny_models["llama"], "The storm", False, 12, 0.0, 0, 1.0, 0, api_name="/generate")
    outputs = list(job)  # every streamed update
    final_text, final_stats = job.result()
    assert len(outputs) >= 3, "the text should arrive in several updates, not at once"
    assert len(outputs[0][0]) <= len(final_text)
    assert "tokens/s" in final_stats and "**12** tokens" in final_stats


def test_seeded_sampling_repeats_and_chat_mode_uses_the_template(client, tiny_models):
    args = (tiny_models["llama"], "The storm", True, 10, 1.0, 20, 0.9, 1234)
    first = client.predict(*args, api_name="/generate")[0]
    second = client.predict(*args, api_name="/generate")[0]
    assert first == second


def test_positional_encoding_endpoint(client, tiny_models):
    out = client.predict(tiny_models["llama"], 64, 16, 3, 5, 1, 2, TEXT, api_name="/positional_encoding")
    heat, dots, sim, check, learned, learned_sim, angles, scores, rope_note, *notes = out
    assert notes == ["", "", ""]  # nothing refused: no note under the sinusoids, the dot products, the learned table
    pe = plotly_array(figure(heat)["data"][0]["z"])
    assert pe.shape == (64, 16)
    np.testing.assert_allclose(pe[1, 2], np.sin(1 / 10000 ** (2 / 16)), atol=1e-6)  # eq. 4.1, i = 1
    curves = figure(dots)["data"]
    np.testing.assert_allclose(plotly_array(curves[0]["y"]), plotly_array(curves[1]["y"]), atol=1e-5)  # depends on k only
    assert plotly_array(figure(sim)["data"][0]["z"]).shape == (64, 64)
    assert "is a rotation of PE(p)" in check
    error = float(check.split("R_k·PE(p)| = ")[1].split(" ")[0])
    assert error < 1e-5
    assert "no learned position table" in figure(learned)["layout"]["annotations"][0]["text"]
    assert plotly_array(figure(angles)["data"][0]["z"]).shape == (4, 64)  # head_dim 8 → 4 frequency pairs
    score_curves = [plotly_array(t["y"]) for t in figure(scores)["data"]]
    np.testing.assert_allclose(score_curves[0], score_curves[1], atol=1e-4)  # RoPE: relative distance only
    assert "depends only on the distance" in rope_note


def test_positional_encoding_shows_an_encoders_learned_positions(client, tiny_models):
    out = client.predict(tiny_models["bert"], 32, 8, 0, 1, 0, 0, TEXT, api_name="/positional_encoding")
    learned, learned_sim, angles = out[4], out[5], out[6]
    assert plotly_array(figure(learned)["data"][0]["z"]).shape == (32, 32)  # 32 positions × d = 32
    sim = plotly_array(figure(learned_sim)["data"][0]["z"])
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-5)
    assert "not RoPE" in figure(angles)["layout"]["annotations"][0]["text"]


def test_mask_demo_endpoint(client, tiny_models):
    out = client.predict(
        tiny_models["llama"],
        TEXT,
        1,
        3,
        2,
        6,
        "The river flows past the old mill and into the valley.",
        "Rain again.",
        api_name="/mask_demo",
    )
    note, *stages, causal, causal_note, padding, padding_note, entropy, entropy_note = out
    traces = [figure(stage)["data"] for stage in stages]  # causal mask on: scores, + mask, softmax; then off
    assert [len(t) for t in traces] == [1] * 6
    masked_on = plotly_array(traces[1][0]["z"]).astype(np.float64)
    probs_on, probs_off = plotly_array(traces[2][0]["z"]), plotly_array(traces[5][0]["z"])
    assert masked_on.shape == (6, 6)
    assert np.isnan(masked_on[np.triu_indices(6, 1)]).all()  # −∞ above the diagonal travels as a gap
    assert np.all(probs_on[np.triu_indices(6, 1)] == 0) and probs_off[0, 1:].sum() > 0.1
    bars = figure(causal)["data"]
    assert [b["name"] for b in bars] == ["causal mask on", "causal mask off"]
    pad_mass = {b["name"]: plotly_array(b["y"]) for b in figure(padding)["data"]}
    assert np.all(pad_mass["padding mask on"] == 0) and np.all(pad_mass["padding mask off"] > 0)
    assert "left" in padding_note
    on_change = float(padding_note.split("move by at most ")[1].split(" ")[0])
    assert on_change < 1e-4
    assert len(figure(entropy)["data"]) == 2 and "√8" in entropy_note


def test_mask_demo_on_an_encoder_explains_what_is_missing(client, tiny_models):
    out = client.predict(
        tiny_models["bert"], TEXT, 0, 0, 0, 8, "A longer sentence than the other one.", "Short.", api_name="/mask_demo"
    )
    causal_note, padding_note = out[8], out[10]  # after the note and the six stages
    assert "no language-model head" in causal_note
    assert "right" in padding_note


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (dict(text="   "), "The text is empty"),
        (dict(layer=2), "Layer must be between 0 and 1, got 2"),
        (dict(head="9"), "Head must be between 0 and 3"),
        (dict(window=1000), "Window size must be between 2 and 256, got 1000"),
        (dict(layer="1e999"), r"Layer must be a number from 0 to 1, got inf \(it must be finite\)"),
        (dict(q0="abc"), "Window query start must be a number from 0 to"),
        (dict(head=2**64), "Head must be between 0 and 3, got 1.84e"),
        (dict(q0=5000), "Window query start must be between 0 and"),
    ],
)
def test_attention_rejects_bad_input_with_a_clear_message(client, tiny_models, args, message):
    with pytest.raises(AppError, match=message):
        attention(client, tiny_models["llama"], **args)


def raw_call(url: str, api_name: str, body: str) -> str:
    """POST a hand-written JSON body (NaN and Infinity are not JSON, so gradio_client cannot send them) to
    the queue's HTTP API and return the event stream of its result."""
    import urllib.request  # noqa: PLC0415

    request = urllib.request.Request(
        f"{url.rstrip('/')}/gradio_api/call/{api_name}", body.encode(), {"Content-Type": "application/json"}
    )
    event_id = json.loads(urllib.request.urlopen(request, timeout=30).read())["event_id"]
    with urllib.request.urlopen(f"{url.rstrip('/')}/gradio_api/call/{api_name}/{event_id}", timeout=60) as r:
        return r.read().decode()


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_in_raw_json_are_answered_naming_the_field(server, tiny_models, literal):
    model = json.dumps(tiny_models["llama"])
    events = raw_call(server[1], "attention", f'{{"data": [{model}, "Hello there", {literal}, "0", false, 0, 0, 8]}}')
    assert "event: error" in events
    assert "Layer must be a number from 0 to 1, got" in events and "finite" in events


def test_a_bad_positional_setting_is_a_note_under_the_figures_it_changes(client, tiny_models):
    out = client.predict(tiny_models["llama"], 64, 15, 0, 1, 0, 0, TEXT, api_name="/positional_encoding")
    assert "Dimensions d must be even" in out[9] and "Dimensions d must be even" in out[3]
    assert "depends only on the distance" in out[8]  # RoPE reads n, not d: drawn
    out = client.predict(tiny_models["llama"], 5000, 16, 0, 1, 0, 0, TEXT, api_name="/positional_encoding")
    assert "Positions n must be between 2 and 512, got 5000" in out[9]
    out = client.predict(tiny_models["llama"], 64, "-inf", 0, 1, 0, 0, TEXT, api_name="/positional_encoding")
    assert re.search(r"Dimensions d must be a number from 2 to 512, got -?inf", out[9])
    out = client.predict(tiny_models["llama"], 4, 16, 0, 5, 0, 0, TEXT, api_name="/positional_encoding")
    assert "Offset k must be between 1 and 3, got 5" in out[3] and out[9] == out[10] == ""
    assert plotly_array(figure(out[0])["data"][0]["z"]).shape == (4, 16)  # the heatmap is still drawn
    assert "depends only on the distance" in out[8]


def test_other_endpoints_reject_bad_settings(client, tiny_models):
    with pytest.raises(AppError, match="Offset k"):
        client.predict(tiny_models["llama"], 4, 16, 0, 5, 0, 0, TEXT, api_name="/export_positions")
    padding_note = client.predict(tiny_models["llama"], TEXT, 0, 0, 0, 6, "Rain.", "Rain.", api_name="/mask_demo")[10]
    assert "same number of tokens" in padding_note   # a note beside the padding figure, the rest computed
    with pytest.raises(AppError, match="The prompt is empty"):
        client.predict(tiny_models["llama"], "", False, 5, 0.0, 0, 1.0, 0, api_name="/generate")
    with pytest.raises(AppError, match=r"Temperature must be in \[0, 2\], got 9"):
        client.predict(tiny_models["llama"], "Hi", False, 5, 9.0, 0, 1.0, 0, api_name="/generate")
    with pytest.raises(AppError, match="Top-k must be between 0 and"):
        client.predict(tiny_models["llama"], "Hi", False, 5, 1.0, -3, 1.0, 0, api_name="/generate")
    with pytest.raises(AppError, match="Seed must be between 0 and 9.22e\\+18, got 1.84e"):
        client.predict(tiny_models["llama"], "Hi", False, 5, 1.0, 0, 1.0, 2**64, api_name="/generate")
    with pytest.raises(AppError, match="Top-p must be a number from 0 to 1, got nan"):
        client.predict(tiny_models["llama"], "Hi", False, 5, 1.0, 0, "nan", 0, api_name="/generate")
    with pytest.raises(AppError, match="Max new tokens must be a number from 1 to 512, got 'many'"):
        client.predict(tiny_models["llama"], "Hi", False, "many", 1.0, 0, 1.0, 0, api_name="/generate")
    with pytest.raises(AppError, match="encoder"):
        client.predict(tiny_models["bert"], "Hi", False, 5, 0.0, 0, 1.0, 0, api_name="/generate")


def test_a_list_or_dict_where_one_choice_is_expected_names_the_field(client, tiny_models):
    with pytest.raises(AppError, match="Model: choose one value, not a list") as error:
        client.predict([tiny_models["llama"]], api_name="/load_model")
    assert "Something went wrong" not in str(error.value)
    with pytest.raises(AppError, match="Score: choose one value, not a list"):
        client.predict(tiny_models["llama"], TEXT, ["previous_token"], 0, 0, api_name="/head_atlas")
    with pytest.raises(AppError, match="Ablation: choose one value, not a dict"):
        client.predict(tiny_models["llama"], TEXT, "0.0", {"kind": "zero"}, api_name="/ablate_heads")


def test_markup_in_a_message_is_escaped(client):
    """A message that quotes the user's input shows it as text: the page renders toasts as HTML."""
    with pytest.raises(AppError) as error:
        client.predict('<img src="https://example.invalid/x.png">', api_name="/load_model")
    assert "<img" not in str(error.value) and "&lt;img" in str(error.value)


@pytest.mark.timeout(60)  # a hang guard: offline, the hub is skipped without a request
def test_a_model_that_cannot_be_fetched_gives_a_clear_message(client):
    with pytest.raises(AppError, match=r"(?s)Model 'gpt2' cannot be loaded here: .*Hub.*HF_HUB_OFFLINE") as error:
        client.predict("gpt2", api_name="/load_model")
    assert str(REPO_ROOT) not in str(error.value)  # the store's folder is named weights/, not its path
    assert "installed folder weights/gpt2: not there" in str(error.value)


def test_uploads_are_read_as_utf8_text_and_bad_files_are_refused(client, tmp_path):
    good = tmp_path / "notes.md"
    good.write_text("# Title\nÜber attention: ✓", encoding="utf-8")
    assert client.predict(handle_file(str(good)), api_name="/load_text") == "# Title\nÜber attention: ✓"
    cases = {
        "latin1.txt": ("Caf\xe9 cr\xe8me".encode("latin-1"), "not UTF-8 text"),
        "empty.txt": (b"", "is empty"),
        "blank.txt": (b" \n\t ", "only whitespace"),
        "paper.pdf": (b"%PDF-1.4", r"Invalid file type.*\.txt"),  # Gradio's own check of file_types
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(Exception, match=message):
            client.predict(handle_file(str(path)), api_name="/load_text")


def test_a_file_over_1_mb_is_refused(client, tmp_path):
    big = tmp_path / "big.txt"
    big.write_bytes(b"a " * 600_000)  # 1.2 MB
    with pytest.raises(AppError, match=r"big.txt is 1.20 MB; the limit .* is 1 MB.*ATTN_MAX_TEXT_MB"):
        client.predict(handle_file(str(big)), api_name="/load_text")
    huge = tmp_path / "huge.txt"
    huge.write_bytes(b"a " * 1_200_000)  # 2.4 MB: over Gradio's own limit (twice the cap), never stored
    with pytest.raises(Exception, match=r"(?i)(too large|exceeds|max.*size)"):
        client.predict(handle_file(str(huge)), api_name="/load_text")


def test_typed_text_over_1_mb_is_refused_by_every_text_field_naming_the_cap(client, tiny_models):
    text = "é" * 600_000  # 600,000 characters, 1.2 MB of UTF-8: the cap counts bytes
    cap = r"is 1.20 MB; the limit for typed and uploaded text is 1 MB.*ATTN_MAX_TEXT_MB=5"
    with pytest.raises(AppError, match=cap):
        attention(client, tiny_models["llama"], text=text)
    with pytest.raises(AppError, match=cap):
        client.predict(tiny_models["llama"], text, False, 5, 0.0, 0, 1.0, 0, api_name="/generate")


def test_a_1_mb_upload_feeds_the_attention_tab(client, tiny_models, tmp_path):
    path = tmp_path / "book.txt"
    sentence = (TEXT + " ").encode()
    path.write_bytes(sentence * (990_000 // len(sentence)))
    assert 900_000 < path.stat().st_size <= 1_000_000
    text = client.predict(handle_file(str(path)), api_name="/load_text")
    assert len(text) > 900_000
    note, model_view, head_view, window = attention(client, tiny_models["llama"], text=text)
    assert "only the first 2,048 are used" in note
    assert figure(head_view)["data"][0]["z"]
    # the other tabs take the same text
    out = client.predict(tiny_models["llama"], text, 0, 0, 0, 8, text, "Short.", api_name="/mask_demo")
    assert "only the first 512 are used" in out[0] and [len(figure(f)["data"]) for f in out[1:7]] == [1] * 6
    out = client.predict(tiny_models["llama"], 64, 16, 0, 1, 0, 0, text, api_name="/positional_encoding")
    assert "depends only on the distance" in out[8]
    continuation, stats = client.predict(tiny_models["llama"], text, False, 4, 0.0, 0, 1.0, 0, api_name="/generate")
    assert "**4** tokens" in stats and "only its last 2,044 are used" in stats


def test_launch_defaults_are_safe(monkeypatch):
    import app

    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_PORT", raising=False)
    args = app.parse_args([])
    assert (args.host, args.port, args.share, args.model) == ("127.0.0.1", 7860, False, "smollm2-135m-instruct")
    options = app.launch_options(args, app.app_settings(args))
    assert options["server_name"] == "127.0.0.1" and options["share"] is False
    assert options["ssr_mode"] is False and options["show_error"] is False and options["max_file_size"] == 2_000_000
    assert options["state_session_capacity"] == 500
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")  # what a Hugging Face Space sets
    assert app.parse_args([]).host == "0.0.0.0"


def test_python_app_py_binds_loopback_and_serves_the_page(tiny_models):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT")}
    env.update(GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--model", tiny_models["llama"], "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
            if "Running on local URL" in line:
                break
        log = "".join(lines)
        assert f"http://127.0.0.1:{port}" in log, log
        assert "gradio.live" not in log
        api = Client(f"http://127.0.0.1:{port}/", verbose=False).view_api(return_format="dict", print_info=False)
        assert "/attention" in api["named_endpoints"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_app_py_reports_an_unfetchable_model_and_exits(tmp_path):
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "app.py", "--model", "opus-mt-en-de", "--port", str(free_port())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "opus-mt-en-de" in done.stderr and "Traceback" not in done.stderr


# ---- the Heads tab


def atlas(client, model, text=TEXT, score="previous_token", layer=1, head=3):
    return client.predict(model, text, score, layer, head, api_name="/head_atlas")


def ranks(x: np.ndarray) -> np.ndarray:
    r = np.empty(len(x))
    r[x.argsort()] = np.arange(len(x))
    for value in np.unique(x):
        r[x == value] = r[x == value].mean()
    return r


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(ranks(a.ravel()), ranks(b.ravel()))[0, 1])


def test_head_atlas_maps_every_head_lists_the_top_ones_and_opens_the_chosen_head(client, tiny_models):
    note, score_map, top, named, head_view = atlas(client, tiny_models["llama"])
    heat = figure(score_map)["data"][0]
    z = plotly_array(heat["z"])
    assert z.shape == (4, 2)  # heads down, layers across
    assert "layer %{x}, head %{y}" in heat["hovertemplate"]
    # the table: five heads per score, in order, and the best previous-token head is the map's largest tile
    rows = top["data"]
    assert {row[0] for row in rows} == {"previous-token", "first-token (sink) mass", "local window (|i − j| ≤ 3)",
                                        "mean entropy", "duplicate-token", "induction (on the probe)"}
    best = [row for row in rows if row[0] == "previous-token"]
    assert [row[1] for row in best] == [1, 2, 3, 4, 5] and best[0][3] >= best[1][3] >= best[4][3]
    layer, head = map(int, best[0][2].split("."))
    assert z[head, layer] == pytest.approx(z.max(), abs=1e-4) == pytest.approx(best[0][3], abs=1e-4)
    entropy = [row[3] for row in rows if row[0] == "mean entropy"]
    assert entropy == sorted(entropy)  # lowest (most focused) first
    # thresholds stated, and a random model gets no names
    assert "≥ 0.5" in named and "previous-token head" in named and "none: no head passes" in named
    assert "Induction probe" in note and "first copy" in note and "second" in note
    # the chosen head is the Attention tab's head view of the same layer and head
    hv = plotly_array(figure(head_view)["data"][0]["z"])
    _, _, reference, _ = attention(client, tiny_models["llama"], layer=1, head="3")
    np.testing.assert_allclose(hv, plotly_array(figure(reference)["data"][0]["z"]), atol=1e-6)
    assert "Layer 1, head 3" in figure(head_view)["layout"]["title"]["text"]
    # the same text again: the session keeps its scores
    assert "kept from the last run" in atlas(client, tiny_models["llama"], score="induction")[0]


def test_head_atlas_induction_map_comes_from_the_probe(client, tiny_models):
    note, score_map, *_ = atlas(client, tiny_models["llama"], text="Something else entirely.", score="induction")
    fig = figure(score_map)
    z = plotly_array(fig["data"][0]["z"])
    assert z.shape == (4, 2) and 0 <= z.min() and z.max() <= 1
    assert "probe" in fig["layout"]["title"]["text"]
    first, second = (float(x.split("**")[1]) for x in note.split("first copy ")[1].split("nats")[:2])
    assert first > 0 and second > 0


def test_head_atlas_on_an_encoder_has_no_induction_and_says_why(client, tiny_models):
    note, score_map, top, named, head_view = atlas(client, tiny_models["bert"], score="local")
    assert "There is no induction score" in note and "causal" not in note.lower()
    assert "induction" not in named and not any("induction" in row[0] for row in top["data"])
    z = plotly_array(figure(head_view)["data"][0]["z"])
    assert z[np.triu_indices(len(z), 1)].max() > 0.01  # both directions
    with pytest.raises(AppError, match="induction score is not available"):
        atlas(client, tiny_models["bert"], score="induction")


def test_ablating_heads_gives_the_loss_change_per_token_and_the_changed_predictions(client, tiny_models):
    every_head = ", ".join(f"{layer}.{head}" for layer in range(2) for head in range(4))
    note, loss, changed = client.predict(tiny_models["llama"], TEXT, every_head, "zero", api_name="/ablate_heads")
    bars = figure(loss)["data"][0]
    clean, ablated = plotly_array(bars["customdata"]).T
    np.testing.assert_allclose(plotly_array(bars["y"]), ablated - clean, atol=1e-5)
    assert len(bars["x"]) == len(clean) and bars["x"][0].startswith("1 ")  # bar i predicts token i + 1
    assert "predicting %{x}" in bars["hovertemplate"]
    mean_clean, mean_ablated = (float(x) for x in note.split("loss ")[1].split(" nats")[0].split(" → "))
    assert mean_clean == pytest.approx(clean.mean(), abs=1e-3)
    assert mean_ablated == pytest.approx(ablated.mean(), abs=1e-3)
    assert np.abs(ablated - clean).max() > 1e-4  # removing every head changes the loss
    # (the random model's top predictions hardly move; test_app_service checks the changed rows themselves)
    assert changed["headers"][2:4] == ["clean prediction", "ablated prediction"]
    assert f"{len(changed['data'])} of" in note
    mean_note = client.predict(tiny_models["llama"], TEXT, every_head, "mean", api_name="/ablate_heads")[0]
    assert mean_note.startswith("Mean-ablated 8 heads") and mean_note != note


@pytest.mark.parametrize(
    ("heads", "message"),
    [
        ("", "No heads to ablate"),
        ("3.x", "'3.x' is not a head"),
        ("99.0", "Head 99.0 does not exist: this model has layers 0–1 and heads 0–3"),
        ("0.1, 1.7", "Head 1.7 does not exist"),
    ],
)
def test_ablate_heads_rejects_bad_heads_with_a_clear_message(client, tiny_models, heads, message):
    with pytest.raises(AppError, match=message):
        client.predict(tiny_models["llama"], TEXT, heads, "zero", api_name="/ablate_heads")


def test_ablation_sweep_streams_progress_then_the_map_beside_the_score(client, tiny_models):
    long_text = " ".join([TEXT] * 6)  # over 128 tokens: the sweep reads the first 128
    job = client.submit(tiny_models["llama"], long_text, "zero", "first_token", api_name="/ablation_sweep")
    updates = list(job)
    assert len(updates) >= 3 and "Sweeping: 0 of 8 heads" in updates[0][0]
    note, fig = job.result()
    increase, score = (plotly_array(trace["z"]) for trace in figure(fig)["data"])
    assert increase.shape == score.shape == (4, 2)
    assert "on 128 tokens (the text's first 128 tokens" in note
    rho = float(note.split("ρ = ")[1].split("**")[0])
    assert rho == pytest.approx(spearman(increase, score), abs=0.01)
    # the same text and ablation again: kept, only the score beside it changes
    again = client.predict(tiny_models["llama"], long_text, "zero", "local", api_name="/ablation_sweep")
    assert "kept from the last run" in again[0]
    np.testing.assert_array_equal(plotly_array(figure(again[1])["data"][0]["z"]), increase)


def test_attribute_compares_attention_with_gradients_for_one_prediction(client, tiny_models):
    note, chart, table = client.predict(tiny_models["llama"], TEXT, 5, 1, 2, 16, api_name="/attribute")
    traces = figure(chart)["data"]
    assert [t["name"] for t in traces] == ["head 1.2 attention", "mean of layer 1's heads", "attention rollout",
                                           "gradient × input", "integrated gradients"]
    for trace in traces:
        assert len(trace["x"]) == 6 and trace["x"][5].startswith("5 ")  # position 5 reads tokens 0..5
        assert np.abs(plotly_array(trace["y"])).max() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(plotly_array(traces[0]["customdata"]).sum(), 1.0, atol=1e-5)  # an attention row
    corr = np.array([row[1:] for row in table["data"]], dtype=float)
    assert corr.shape == (5, 5)
    np.testing.assert_allclose(np.diag(corr), 1.0)
    np.testing.assert_allclose(corr, corr.T)
    assert corr[0, 4] == pytest.approx(spearman(plotly_array(traces[0]["customdata"]), plotly_array(traces[4]["customdata"])),
                                       abs=0.01)
    assert "completeness error" in note and "attention weights are not explanations" in note
    last = client.predict(tiny_models["llama"], TEXT, -1, 0, 0, 4, api_name="/attribute")[0]
    n = len(figure(head_view_of(client, tiny_models["llama"]))["data"][0]["x"])
    assert f"Position {n - 1} " in last


def test_attribute_explains_a_target_against_a_foil_from_the_chosen_baseline(client, tiny_models):
    from core import load_model
    from core.analysis import heads
    from ui.services.text import as_batch, encode

    model = load_model(tiny_models["llama"], device="cpu")
    the, lit = (model.tokenizer(word, add_special_tokens=False).input_ids[0] for word in (" the", " lit"))
    note, chart, _ = client.predict(tiny_models["llama"], TEXT, 5, 1, 2, 16, " the", " lit", "mean",
                                    api_name="/attribute")
    assert "explaining **logit(' the') − logit(' lit')**" in note and "mean embedding row" in note
    ids = as_batch(encode(model, TEXT).ids)
    expected = heads.attribute(model, ids, 5, 1, 2, 16, target=the, foil=lit, baseline="mean")
    traces = figure(chart)["data"]
    assert "rather than ' lit'" in figure(chart)["layout"]["title"]["text"]
    np.testing.assert_allclose(plotly_array(traces[4]["customdata"]), expected.integrated.numpy(), atol=1e-4)
    np.testing.assert_allclose(plotly_array(traces[3]["customdata"]), expected.grad_input.numpy(), atol=1e-4)
    # the measured table: one row per step count (position 5 reads 6 tokens, so even 128 steps fit the budget)
    rows = {int(line.split("|")[1].split()[0]): line.split("|")[2:4] for line in note.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip()[:1].isdigit()}
    assert sorted(rows) == [8, 16, 32, 128]
    measured = heads.completeness_by_steps(model, ids, 5, (8, 32, 128), the, lit, "mean")
    for m in measured:
        assert float(rows[m.steps][1]) == pytest.approx(m.error, abs=2e-3)
    assert f"should equal f(text) − f(baseline) = {expected.logit_difference:.3f}" in note
    assert "need not shrink as steps grow" in note
    # empty boxes: the model's top token, no foil, as before the boxes existed
    plain = client.predict(tiny_models["llama"], TEXT, 5, 1, 2, 16, "", "", "pad", api_name="/attribute")[0]
    assert "the model's top next token" in plain and "foil" not in plain.split("  \n")[0]


@pytest.mark.parametrize(
    ("boxes", "message"),
    [
        ((" lamp", "", "pad"), r"Target token must be one token, and ' lamp' splits into 2 here: ' lam' \+ 'p'"),
        (("", " lamp again", "pad"), r"Foil token must be one token, and ' lamp again' splits into 3 here"),
        (("<b>x", "", "pad"), r"Target token must be one token, and '&lt;b&gt;x' splits into 4 here: '&lt;' \+ 'b'"),
        ((" the", " the", "pad"), "the foil must differ from the target"),
        (("", "", "ones"), "Integrated-gradients baseline"),
    ],
)
def test_attribute_says_in_words_what_is_wrong_with_a_target_foil_or_baseline(client, tiny_models, boxes, message):
    with pytest.raises(AppError, match=message) as caught:
        client.predict(tiny_models["llama"], TEXT, 5, 1, 2, 4, *boxes, api_name="/attribute")
    assert "Something went wrong" not in str(caught.value) and "<b>" not in str(caught.value)


def head_view_of(client, model):
    return attention(client, model)[2]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ((999, 0, 0, 8), "Position must be between -1 and"),
        ((-1, 2, 0, 8), "Layer must be between 0 and 1, got 2"),
        ((-1, 0, 9, 8), "Head must be between 0 and 3, got 9"),
        ((-1, 0, 0, 0), "Steps must be between 1 and 256, got 0"),
        ((-1, 0, 0, 100_000), "Steps must be between 1 and 256"),
        ((-1, 0, 0, 256), "the limit is 4,096. Use at most"),
    ],
)
def test_attribute_rejects_bad_settings_with_a_clear_message(client, tiny_models, settings, message):
    with pytest.raises(AppError, match=message):
        client.predict(tiny_models["llama"], TEXT, *settings, api_name="/attribute")


def test_logit_lens_reads_every_layer_as_a_prediction(client, tiny_models):
    note, fig = client.predict(tiny_models["llama"], TEXT, api_name="/logit_lens")
    heat, settles = figure(fig)["data"]
    z = plotly_array(heat["z"])
    n = len(heat["x"])
    assert z.shape == (2, n) and 0 <= z.min() and z.max() <= 1
    assert "top token here: %{customdata}" in heat["hovertemplate"]
    # the last layer is the output: its own top token is the final answer, so its probability is the colour
    top_prob = np.array([[float(cell.rsplit("(", 1)[1].rstrip(")")) for cell in row] for row in heat["customdata"]])
    np.testing.assert_allclose(z[-1], top_prob[-1], atol=0.006)
    assert all(0 <= y <= 1 for y in settles["y"]) and len(settles["x"]) == n
    assert "settle" in note


def test_surprisal_shades_each_token_and_reports_perplexity(client, tiny_models):
    text = "The keeper <b>lit</b> the lamp & rowed."
    stats, page = client.predict(tiny_models["llama"], text, api_name="/surprisal")
    losses = np.array([float(x.split('"')[0]) for x in page.split('data-loss="')[1:]])
    mean = float(stats.split("mean **")[1].split("**")[0])
    perplexity = float(stats.split("perplexity **")[1].split("**")[0])
    assert mean == pytest.approx(losses.mean(), abs=1e-3) and perplexity == pytest.approx(np.exp(mean), rel=1e-3)
    assert f"**{len(losses)} predicted tokens**" in stats
    assert "<b>" not in page and "&lt;" in page and "&amp;" in page  # the text is escaped, not rendered
    assert page.count("top 5 here:") == len(losses)


def test_heads_sections_on_an_encoder_without_an_lm_head_say_why(client, tiny_models):
    bert = tiny_models["bert"]
    lens_note, lens_fig = client.predict(bert, TEXT, api_name="/logit_lens")
    assert "no LM head" in lens_note or "has none" in lens_note
    assert "has none" in figure(lens_fig)["layout"]["annotations"][0]["text"]
    assert "predicts no next token" in client.predict(bert, TEXT, api_name="/surprisal")[0]
    assert "has none" in client.predict(bert, TEXT, "0.0", "zero", api_name="/ablate_heads")[0]
    assert "has none" in client.predict(bert, TEXT, -1, 0, 0, 8, api_name="/attribute")[0]
    assert "has none" in client.predict(bert, TEXT, "zero", "local", api_name="/ablation_sweep")[0]


@pytest.mark.parametrize(
    ("endpoint", "args"),
    [
        ("/head_atlas", ("previous_token", 0, 0)),
        ("/ablate_heads", ("0.0", "zero")),
        ("/ablation_sweep", ("zero", "local")),
        ("/attribute", (-1, 0, 0, 8)),
        ("/logit_lens", ()),
        ("/surprisal", ()),
    ],
)
def test_heads_endpoints_refuse_empty_text(client, tiny_models, endpoint, args):
    with pytest.raises(AppError, match="The text is empty"):
        client.predict(tiny_models["llama"], "  ", *args, api_name=endpoint)


def test_heads_tab_reads_at_most_512_tokens_and_says_so(client, tiny_models):
    text = " ".join([TEXT] * 40)
    note = atlas(client, tiny_models["llama"], text=text)[0]
    assert "only the first 512 are used" in note
    stats, _ = client.predict(tiny_models["llama"], text, api_name="/surprisal")
    assert "**511 predicted tokens**" in stats
