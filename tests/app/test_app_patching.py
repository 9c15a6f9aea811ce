"""The Patching tab's endpoints through gradio_client, on tiny random models: the sweep's numbers are the core's,
and its words follow the direction (what comes back when denoising, what stays when noising); logit attribution
adds up, with or without a corrupted prompt; the flow graph's data is the core's kept token edges, each with its
heads strongest first, kept server-wide while the session holds a small ticket; and every pair the tab cannot
measure is answered in the note (different token counts side by side, prompts over the limit with both counts,
equal prompts, an answer of several tokens, an encoder)."""

from __future__ import annotations

import csv
import json
import os
import pickle
import re

import pytest
import torch

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from core.analysis import patching  # noqa: E402
from tiny_app_model import build_tiny_bert, build_tiny_llama, launch_app, plotly_array  # noqa: E402
from ui import links  # noqa: E402
from ui.services.checks import UserError  # noqa: E402
from ui.services.patching import refusals_in_words  # noqa: E402

CLEAN, CORRUPTED = "the bread is warm and the lamp", "the bread is warm and the shop"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("patching-models")
    llama, bert = str(build_tiny_llama(root / "tiny-llama")), str(build_tiny_bert(root / "tiny-bert"))
    demo, url, services = launch_app([llama, bert], llama)
    yield dict(llama=llama, bert=bert, model=services.models.get(llama), client=Client(url, verbose=False), url=url,
               demo=demo, services=services)
    demo.close()


def ids_of(model, text):
    return torch.tensor([model.tokenizer(text).input_ids])


def csv_rows(path):
    with open(path, encoding="utf-8") as f:
        return list(csv.reader(line for line in f if not line.startswith("#")))


def test_the_sweep_endpoint_shows_the_cores_numbers(served):
    model, client = served["model"], served["client"]
    clean, corrupted = ids_of(model, CLEAN), ids_of(model, CORRUPTED)
    assert clean.shape == corrupted.shape, "the test's pair must have one token count"
    with torch.inference_mode():
        answer = int(model(clean).logits[0, -1].argmax())
        ranked = model(corrupted).logits[0, -1].topk(2).indices.tolist()
    foil = ranked[1] if ranked[0] == answer else ranked[0]
    expected = patching.patch_sweep(model, clean, corrupted, answer, foil, "resid_pre")
    note, figure, path = client.predict(served["llama"], CLEAN, CORRUPTED, "", "", "resid_pre", "denoise", 0,
                                        api_name="/patch_sweep")
    assert f"**{expected.clean_metric:+.3f}** on the clean prompt" in note
    assert f"**{expected.corrupted_metric:+.3f}** on the corrupted one" in note
    heatmap = next(t for t in json.loads(figure["plot"])["data"] if t["type"] == "heatmap")
    torch.testing.assert_close(torch.tensor(plotly_array(heatmap["z"]), dtype=torch.float32), expected.scores)
    rows = csv_rows(path)
    assert rows[0][0] == "layer \\ position" and len(rows) == 1 + model.config.n_layers
    assert float(rows[1][-1]) == pytest.approx(expected.scores[0, -1].item(), abs=1e-5)
    # one layer's heads × positions, noising
    note, figure, path = client.predict(served["llama"], CLEAN, CORRUPTED, "", "", "z_by_position", "noise", 1,
                                        api_name="/patch_sweep")
    assert "of layer 1" in note
    assert len(csv_rows(path)) == 1 + model.config.n_heads


def test_a_pair_the_tab_cannot_measure_is_answered_in_the_note(served):
    client = served["client"]
    note, figure, path = client.predict(served["llama"], CLEAN, "the bread", "", "", "z", "denoise", 0,
                                        api_name="/patch_sweep")
    assert "same number of tokens" in note and "| position | clean | corrupted |" in note
    assert path is None
    assert re.search(r"\| 3 \| war \|\s+\|", note), note      # the clean token beside an empty cell
    note, _, _ = client.predict(served["llama"], CLEAN, CORRUPTED, " lighthouse keeper", "", "z", "denoise", 0,
                                api_name="/patch_sweep")
    assert "Answer must be one token" in note and "splits into" in note
    note, _, _ = client.predict(served["bert"], CLEAN, CORRUPTED, "", "", "z", "denoise", 0, api_name="/patch_sweep")
    assert "encoder" in note and "predicts no next token" in note
    note, _, _ = client.predict(served["llama"], "<img src=x onerror=alert(1)>", CORRUPTED, "", "", "z", "denoise", 0,
                                api_name="/patch_sweep")
    assert "<" not in note and "&lt;" in note   # the markup is listed token by token, as text


@pytest.mark.parametrize("args,words", [
    (("bogus", "denoise", 0), "What to patch: .*not in the list of choices"),
    (("z", "both", 0), "Direction: .*not in the list of choices"),
    (("z_by_position", "denoise", 99), "Layer"),
    (("z", ["denoise"], 0), "choose one value"),
])
def test_bad_settings_get_a_message_naming_the_field(served, args, words):
    with pytest.raises(AppError, match=words):
        served["client"].predict(served["llama"], CLEAN, CORRUPTED, "", "", *args, api_name="/patch_sweep")


def test_logit_attribution_endpoint_adds_up(served):
    note, figure, path = served["client"].predict(served["llama"], CLEAN, CORRUPTED, "", "",
                                                  api_name="/logit_attribution")
    found = re.search(r"sum \*\*([+-][\d.]+)\*\*, the model's own difference \*\*([+-][\d.]+)\*\*", note)
    assert found and found.group(1) == found.group(2), note
    rows = csv_rows(path)
    parts = {name: float(value) for name, value in rows[1:]}
    total = parts.pop("total")
    assert sum(parts.values()) == pytest.approx(total, abs=1e-4)


def edges_of(rows):
    """The distinct kept edges of a flow graph's CSV (one row per edge × head)."""
    return {(r[0], int(r[1]), int(r[3]), int(r[5]), int(r[7])) for r in rows[1:]}


def test_flow_graph_endpoint_keeps_edges_above_the_threshold(served):
    client = served["client"]
    note, figure, path = client.predict(served["llama"], CLEAN, 0.02, api_name="/flow_graph")
    rows = csv_rows(path)
    assert rows[0][:3] == ["kind", "layer", "head"] and rows[0][8:] == ["importance", "head part"]
    assert rows[1:] and all(float(r[8]) >= 0.02 for r in rows[1:])
    assert f"**{len(edges_of(rows))} edges**" in note
    _, _, higher = client.predict(served["llama"], CLEAN, 0.2, api_name="/flow_graph")
    assert len(edges_of(csv_rows(higher))) <= len(edges_of(rows))
    with pytest.raises(AppError, match="Threshold"):
        client.predict(served["llama"], CLEAN, 3.0, api_name="/flow_graph")


def test_flow_graph_attention_edges_are_the_cores_token_edges_with_their_heads_strongest_first(served):
    model, client = served["model"], served["client"]
    expected = patching.flow_graph(model, ids_of(model, CLEAN), -1, 0.02)
    note, figure, path = client.predict(served["llama"], CLEAN, 0.02, api_name="/flow_graph")
    rows = csv_rows(path)
    attention = [e for e in expected.edges if e.kind == "attention"]
    assert attention, "the test wants attention edges at this threshold"
    # one row per edge × head: an attention edge has a row per head with a part > 0, strongest first; the others
    # one row with the head empty
    want = []
    for e in expected.edges:
        parts = e.heads if e.kind == "attention" else [("", "")]
        want += [(e.kind, e.layer, str(h), e.source, e.target, e.level) for h, _ in parts]
    assert [(r[0], int(r[1]), r[2], int(r[3]), int(r[5]), int(r[7])) for r in rows[1:]] == want
    by_edge = {}
    for r in rows[1:]:
        if r[0] == "attention":
            by_edge.setdefault((int(r[1]), int(r[3]), int(r[5])), []).append((float(r[8]), float(r[9])))
    for (layer, source, target), parts in by_edge.items():
        shares = [part for _, part in parts]
        assert shares == sorted(shares, reverse=True) and min(shares) > 0
        # the edge's importance is its heads summed: the token edge of the core
        assert parts[0][0] == pytest.approx(expected.tokens[layer, target, source].item(), abs=1e-6)
        assert sum(shares) == pytest.approx(parts[0][0], rel=1e-4)
    assert "heads summed, then thresholded" in note and "output bias is in the sum but is not a part" in note
    # the hover lists the heads strongest first; a click reads the strongest head's "layer.head"
    trace = next(t for t in json.loads(figure["plot"])["data"] if t.get("name") == "attention edge")
    assert len(trace["customdata"]) == len(attention)
    for custom, e in zip(trace["customdata"], attention):
        assert custom[0] == f"{e.layer}.{e.heads[0][0]}"
        listed = [f"L{e.layer} H{h} {part:.2f}" for h, part in e.heads[:8]]
        assert custom[4].startswith(", ".join(listed))
        assert custom[6] == f"edge {e.layer}.{e.target}.{e.source}"     # what a click on it asks why of
    assert "heads: %{customdata[4]}" in trace["hovertemplate"]


def test_why_an_edge_is_kept_is_the_cores_edge_attribution_with_a_link_to_each_head(served):
    """edge_attribution: each of the edge's strongest heads' query-side and key-side parts as bars, the core's
    (qk.edge_attribution on the same graph), each side adding up to the head's relative score; the note names the
    edge and links each head to the Inside tab at that query; an edge the graph does not keep is named in words."""
    from core.analysis import qk

    model, client = served["model"], served["client"]
    graph = patching.flow_graph(model, ids_of(model, CLEAN), -1, 0.02)
    edge = max((e for e in graph.edges if e.kind == "attention"), key=lambda e: e.importance)
    note, figure = client.predict(served["llama"], CLEAN, 0.02, edge.layer, edge.target, edge.source,
                                  api_name="/edge_attribution")
    expected = qk.edge_attribution(model, ids_of(model, CLEAN), graph, edge.layer, edge.target, edge.source)
    bars = [t for t in json.loads(figure["plot"])["data"] if t["type"] == "bar"]
    shown = expected.heads[:3]
    assert len(bars) == 2 * len(shown)
    for i, reason in enumerate(shown):
        for bar, parts in zip(bars[2 * i: 2 * i + 2], (reason.query_parts, reason.key_parts)):
            assert list(bar["y"]) == [label for label, _ in parts]
            values = plotly_array(bar["x"])
            assert values == pytest.approx([v for _, v in parts], abs=1e-6)
            assert values.sum() == pytest.approx(reason.score, abs=1e-4)       # each side adds up to the score
        assert f"**L{edge.layer} H{reason.head}**" in note
        assert f"tab=inside&layer={edge.layer}&head={reason.head}&token={edge.target}" in note
        assert (f"the relative score is {reason.unrotated:+.3f}, so the distance adds "   # the tiny Llama: RoPE
                f"{reason.score - reason.unrotated:+.3f}") in note
    assert f"(position {edge.target})" in note and "relative score" in note
    kept = {(e.layer, e.target, e.source) for e in graph.edges if e.kind == "attention"}
    missing = next((0, t, s) for t in range(1, 9) for s in range(t) if (0, t, s) not in kept)
    with pytest.raises(AppError, match="keeps no attention edge"):
        client.predict(served["llama"], CLEAN, 0.02, *missing, api_name="/edge_attribution")
    with pytest.raises(AppError, match="Edge source"):
        client.predict(served["llama"], CLEAN, 0.02, 0, 2, 5, api_name="/edge_attribution")


def flow_states(served) -> list:
    """Every gr.State value the flow graph's client session holds on the server."""
    session = served["demo"].state_holder[served["client"].session_hash]
    return [value for value in session.state_data.values() if value is not None]


def test_flow_graph_state_is_a_small_ticket_and_a_dropped_graph_is_recomputed(served):
    """The [L, H, T, T] parts live in the server-wide KeptStore, counted by their bytes; the session's State
    pickles to a few hundred bytes, and a graph the store dropped is computed again."""
    model, services = served["model"], served["services"]
    client = Client(served["url"], verbose=False)
    served = {**served, "client": client}
    words = "the bread is warm and the lamp is lit by the keeper at dusk"
    text = words
    while len(model.tokenizer(text + " " + words).input_ids) <= 64:
        text += " " + words
    n = len(model.tokenizer(text).input_ids)
    assert 48 <= n <= 64, n
    cfg = model.config
    graph_bytes = 4 * cfg.n_layers * cfg.n_heads * n * n   # float32 [L, H, T, T]: more than 64 KB
    assert graph_bytes > 64_000
    before = services.kept.nbytes
    note, _, first = client.predict(served["llama"], text, 0.02, api_name="/flow_graph")
    assert "Computed in" in note
    assert services.kept.nbytes - before >= graph_bytes
    states = flow_states(served)
    assert states and all(len(pickle.dumps(value)) <= 64_000 for value in states), \
        [len(pickle.dumps(value)) for value in states]
    note, _, _ = client.predict(served["llama"], text, 0.05, api_name="/flow_graph")
    assert "Re-pruned from the kept graph, no pass" in note
    services.kept.put("someone else", ("a large capture",), None, services.kept.budget_bytes)   # drops the rest
    note, _, again = client.predict(served["llama"], text, 0.02, api_name="/flow_graph")
    assert "Computed in" in note
    assert csv_rows(again) == csv_rows(first)
    assert all(len(pickle.dumps(value)) <= 64_000 for value in flow_states(served))


def test_noise_mode_says_what_a_cell_means_and_keeps_its_scores(served):
    model, client = served["model"], served["client"]
    clean, corrupted = ids_of(model, CLEAN), ids_of(model, CORRUPTED)
    words = {}
    for mode in ("denoise", "noise"):
        note, figure, path = client.predict(served["llama"], CLEAN, CORRUPTED, "", "", "resid_pre", mode, 0,
                                            api_name="/patch_sweep")
        data = json.loads(figure["plot"])
        heatmap = next(t for t in data["data"] if t["type"] == "heatmap")
        bar = heatmap["colorbar"]
        words[mode] = dict(note=note, scale=bar["title"]["text"], ticks=" ".join(bar["ticktext"]),
                           hover=heatmap["hovertemplate"], title=data["layout"]["title"]["text"])
        answer = int(model(clean).logits[0, -1].argmax())
        with torch.inference_mode():
            ranked = model(corrupted).logits[0, -1].topk(2).indices.tolist()
        foil = ranked[1] if ranked[0] == answer else ranked[0]
        expected = patching.patch_sweep(model, clean, corrupted, answer, foil, "resid_pre", mode)
        torch.testing.assert_close(torch.tensor(plotly_array(heatmap["z"]), dtype=torch.float32), expected.scores)
        assert float(csv_rows(path)[1][-1]) == pytest.approx(expected.scores[0, -1].item(), abs=1e-5)
    denoise, noise = words["denoise"], words["noise"]
    assert denoise["scale"] == "restored" and "<br>restored %{z" in denoise["hover"]
    assert "1 clean answer back" in denoise["ticks"] and "0 no change" in denoise["ticks"]
    assert "brings back the clean prompt's answer" in denoise["note"] and "comes back" in denoise["title"]
    assert noise["scale"] == "kept" and "<br>kept %{z" in noise["hover"]
    assert "1 no change" in noise["ticks"] and "0 needed" in noise["ticks"]
    assert "changes nothing (the clean answer stays)" in noise["note"] and "activation is needed" in noise["note"]
    assert "stays" in noise["title"]
    assert not any("restor" in text or "back" in text for text in noise.values()), noise


def long_pair(model, shared_tokens: int = 70):
    """An IOI pair whose shared opening alone is over 64 tokens: cut to 64, the two prompts would be equal."""
    opening = "When Mary and John went to the store on a warm day"
    while len(model.tokenizer(opening).input_ids) < shared_tokens:
        opening += ", and the bread was warm"
    return opening + ", John gave a drink to", opening + ", Mary gave a drink to"


def test_prompts_over_the_limit_are_refused_naming_the_limit_and_both_counts(served):
    model, client = served["model"], served["client"]
    clean, corrupted = long_pair(model)
    n_clean, n_corrupted = (len(model.tokenizer(t).input_ids) for t in (clean, corrupted))
    note, _, path = client.predict(served["llama"], clean, corrupted, "", "", "resid_pre", "denoise", 0,
                                   api_name="/patch_sweep")
    assert path is None
    assert (f"Patching reads prompts of at most 64 tokens, and the clean prompt has {n_clean} tokens and the "
            f"corrupted one {n_corrupted}") in note
    note, _, path = client.predict(served["llama"], clean, corrupted, "", "", api_name="/logit_attribution")
    assert path is None and "Logit attribution reads prompts of at most 64 tokens" in note
    assert f"has {n_clean} tokens and the corrupted one {n_corrupted}" in note
    note, _, path = client.predict(served["llama"], clean, 0.04, api_name="/flow_graph")
    assert path is None and f"at most 64 tokens, and the clean prompt has {n_clean} tokens" in note
    # a short clean prompt beside a long corrupted one: still refused, with both counts
    note, _, _ = client.predict(served["llama"], CLEAN, corrupted, "", "", "z", "denoise", 0, api_name="/patch_sweep")
    assert f"the corrupted one {n_corrupted}" in note


def test_the_cores_refusals_reach_the_note_in_words(served):
    client, model = served["client"], served["model"]
    note, _, path = client.predict(served["llama"], CLEAN, CLEAN, "", "", "resid_pre", "denoise", 0,
                                   api_name="/patch_sweep")
    assert path is None and "The clean and corrupted prompts are the same 9 tokens" in note
    # what the core itself refuses comes back as a UserError, its words a sentence
    with torch.inference_mode():
        answer, foil = model(ids_of(model, CLEAN)).logits[0, -1].topk(2).indices.tolist()
    with pytest.raises(UserError, match=r"^The clean and corrupted runs give the same logit difference .*\.$"):
        with refusals_in_words():
            patching.patch_sweep(model, ids_of(model, CLEAN), ids_of(model, CLEAN), answer, foil, "resid_pre")
    with pytest.raises(UserError, match=r"^Answer must be a token id in 0\.\."):
        with refusals_in_words():
            patching.logit_attribution(model, ids_of(model, CLEAN), 10**6, foil)


def test_logit_attribution_needs_no_corrupted_prompt(served):
    model = served["model"]
    note, figure, path = served["client"].predict(served["llama"], CLEAN, "", "", "", api_name="/logit_attribution")
    assert "there is no corrupted prompt, so the foil is the clean run's second most likely token" in note
    with torch.inference_mode():
        answer, foil = model(ids_of(model, CLEAN)).logits[0, -1].topk(2).indices.tolist()
    expected = patching.logit_attribution(model, ids_of(model, CLEAN), answer, foil)
    rows = csv_rows(path)
    assert rows[0][1] == f"logit({model.tokenizer.decode([answer])!r}) - logit({model.tokenizer.decode([foil])!r})"
    assert float(dict(rows[1:])["total"]) == pytest.approx(expected.total, abs=1e-5)


def test_a_link_carries_both_prompts_when_short():
    url, note = links.make("http://h/", "m", "patching", 2, None, CLEAN, CORRUPTED)
    assert "tab=patching" in url and "layer=2" in url and "corrupted=the+bread" in url and not note
    state = links.parse({"tab": "patching", "text": CLEAN, "corrupted": CORRUPTED}, ["m"], lambda _: (2, 4), "m")
    assert (state.tab, state.text, state.corrupted, state.messages) == ("patching", CLEAN, CORRUPTED, [])
    _, note = links.make("http://h/", "m", "patching", 0, None, CLEAN, "x" * 700)
    assert "corrupted prompt is longer" in note
