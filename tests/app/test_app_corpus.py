"""The Across texts tab's endpoints through gradio_client, on a tiny random Llama: the mean map's cells, their
intervals and the chosen cell's items are the core's Over for the same corpus (built in, or uploaded), every figure
says what n is and what the interval is, a job streams the summary of the items finished so far (what a stopped
page keeps), and every bad upload gets a message naming what is wrong and where, as text, never markup. The tiny
tokenizer has no single-token names, so its pairs come from an uploaded file (and IOI pairs are refused in words)."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from core.analysis import over as overs  # noqa: E402
from core.corpus import stats, texts as corpora  # noqa: E402
from core.analysis import shortcuts  # noqa: E402
from tiny_app_model import build_tiny_llama, launch_app, plotly_array  # noqa: E402
from ui.services.corpus.over import INDUCTION_LENGTH  # noqa: E402
from ui.services.corpus.qk import PLANE_DEFINITION  # noqa: E402
from ui.views.corpus import across  # noqa: E402

TEXTS = ["The lighthouse keeper rowed out to the rocks at dawn.", "Every morning the baker opens the shop at six.",
         "A causal mask hides the future.", "When the storm passed, she lit the lamp again.",
         "Attention lets every token look at every other token."]
PAIRS = [  # nine tokens in each prompt, the answer and foil one token each for the tiny tokenizer
    dict(clean="the bread is warm and the lamp", corrupted="the bread is warm and the shop", answer=" the",
         foil=" bread"),
    dict(clean="a bread is warm and the lamp", corrupted="a bread is warm and the shop", answer=" bread",
         foil=" the"),
    dict(clean="the bread is warm and a lamp", corrupted="the bread is warm and a shop", answer=" the", foil=" bread"),
    dict(clean="the bread is warm to the lamp", corrupted="the bread is warm to the shop", answer=" and",
         foil=" bread"),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus-models")
    llama = str(build_tiny_llama(root / "tiny-llama"))
    patch = pytest.MonkeyPatch()
    patch.setenv("ATTN_RUNS_DIR", str(root / "runs"))    # saved corpus jobs go here, not into the working tree
    demo, url, services = launch_app([llama], llama)
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in PAIRS), encoding="utf-8")
    texts = root / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    yield dict(llama=llama, model=services.models.get(llama), client=Client(url, verbose=False), root=root,
               pairs=str(pairs), texts=str(texts), services=services)
    demo.close()
    patch.undo()


def shown(figure) -> dict:
    """The mean map's z and customdata, or the strip's dots, from a figure the API returned."""
    return json.loads(figure["plot"])


def check_map_and_strip(note, mean_figure, strip_figure, over, cell, noun):
    heatmap = shown(mean_figure)["data"][0]
    torch.testing.assert_close(torch.tensor(plotly_array(heatmap["z"]), dtype=torch.float32), over.mean.float())
    custom = torch.tensor(plotly_array(heatmap["customdata"]), dtype=torch.float32)
    torch.testing.assert_close(custom[..., 0], over.low.float(), equal_nan=True)
    torch.testing.assert_close(custom[..., 1], over.high.float(), equal_nan=True)
    assert f"n = {over.n}" in heatmap["hovertemplate"] and "interval" in heatmap["hovertemplate"]
    line = (f"95 % CI of the mean over n = {over.n} {noun}s, {over.interval}" if over.n >= 5 else
            f"n = {over.n} {noun}s: too few for an interval (it needs at least 5)")
    assert over.interval in ("Student's t", "percentile bootstrap") or over.n < 5
    for figure in (mean_figure, strip_figure):   # every figure says what n is and what the interval is
        assert any(a["text"] == line for a in shown(figure)["layout"]["annotations"]), shown(figure)["layout"]
    dots = shown(strip_figure)["data"][0]
    r, c = cell
    torch.testing.assert_close(torch.tensor(plotly_array(dots["y"]), dtype=torch.float32),
                               over.per_item[:, r, c].float())
    assert list(plotly_array(dots["x"]).astype(int)) == list(over.items)
    assert f"n = **{over.n}**" in note and line in note


def test_head_scores_over_induction_texts_are_the_cores(served):
    model = served["model"]
    note, mean_figure, strip_figure = served["client"].predict(served["llama"], "induction texts", 6, None,
                                                               "induction", 1, 2, api_name="/corpus_heads")
    texts = corpora.induction_texts(model.tokenizer, 6, INDUCTION_LENGTH, bos=model.config.bos_token_id)
    over = overs.head_scores_over(model, texts)["induction"]
    assert over.n == 6
    check_map_and_strip(note, mean_figure, strip_figure, over, (1, 2), "text")


def test_a_finished_job_is_saved_and_reopened_without_measuring(served):
    args = (served["llama"], "uploaded file", 3, handle_file(served["pairs"]), "z", "noise", 0, 1, 1)
    first, first_map, _ = served["client"].predict(*args, api_name="/corpus_patch")
    assert "saved (in the runs folder" in first
    again, again_map, _ = served["client"].predict(*args, api_name="/corpus_patch")
    assert "Reopened from the saved job" in again and "nothing was measured again" in again
    assert shown(again_map)["data"][0]["z"] == shown(first_map)["data"][0]["z"]
    assert any((served["root"] / "runs").iterdir())


def test_head_scores_over_an_uploaded_file_are_the_cores(served):
    model = served["model"]
    note, mean_figure, strip_figure = served["client"].predict(
        served["llama"], "uploaded file", 4, handle_file(served["texts"]), "previous_token", 0, 3,
        api_name="/corpus_heads")
    over = overs.head_scores_over(model, corpora.encode_texts(model.tokenizer, TEXTS[:4]))["previous_token"]
    check_map_and_strip(note, mean_figure, strip_figure, over, (0, 3), "text")
    assert "the first 4 of 5 texts of texts.txt" in note


def test_attribution_and_patching_over_uploaded_pairs_are_the_cores(served):
    model, client = served["model"], served["client"]
    pairs = corpora.read_pairs(served["pairs"], model.tokenizer)
    note, mean_figure, strip_figure = client.predict(served["llama"], "uploaded file", 10,
                                                     handle_file(served["pairs"]), 1, 1,
                                                     api_name="/corpus_attribution")
    heads, _ = overs.logit_attribution_over(model, pairs)
    check_map_and_strip(note, mean_figure, strip_figure, heads, (1, 1), "pair")
    note, mean_figure, strip_figure = client.predict(served["llama"], "uploaded file", 10,
                                                     handle_file(served["pairs"]), "resid_pre", "noise", 0, 1, 6,
                                                     api_name="/corpus_patch")
    over = overs.patch_over(model, pairs, "resid_pre", "noise")
    check_map_and_strip(note, mean_figure, strip_figure, over, (1, 6), "pair")


def test_pairs_that_all_leave_nothing_to_measure_say_so_and_state_no_nan(served, tmp_path):
    """A pair whose two prompts are the same has no clean − corrupted difference to normalise by: the core leaves it
    out, and with every pair left out the note says nothing was measured, not "mean +nan"."""
    same = tmp_path / "same.jsonl"
    same.write_text("\n".join(json.dumps(dict(PAIRS[i], corrupted=PAIRS[i]["clean"])) for i in range(2)) + "\n")
    note, _, _ = served["client"].predict(served["llama"], "uploaded file", 10, handle_file(str(same)), "z",
                                          "denoise", 0, 0, 0, api_name="/corpus_patch")
    assert "n = **0**" in note and "no mean, nothing was measured (n = 0)" in note, note
    assert "+nan" not in note.lower() and "mean **nan" not in note.lower(), note


BAD_UPLOADS = [  # (file name, bytes, endpoint, words the message must hold)
    ("notes.md", b"a text\n", "heads", "Invalid file type"),   # Gradio's own check of the suffix, in words
    ("latin.txt", "caf\u00e9\n".encode("latin-1"), "heads", "latin.txt, line 1: not UTF-8"),
    ("texts.jsonl", b'{"text": "fine"}\n{"body": "no text"}\n', "heads", "texts.jsonl, line 2: no 'text' field"),
    ("texts.jsonl", b'{"text": "fine"}\n{"text": "  "}\n', "heads", "texts.jsonl, line 2: 'text' is empty"),
    ("texts.csv", b'body\n"fine"\n', "heads", "texts.csv, line 1: the header has no text column"),
    ("pairs.jsonl", json.dumps(dict(PAIRS[0], answer=" lighthouse keeper")).encode(), "patch",
     "pairs.jsonl, line 1: 'answer' ' lighthouse keeper' is"),
    ("pairs.csv", b"clean,corrupted,answer,foil\nthe bread is warm,the bread,\" the\",\" bread\"\n", "attribution",
     "pairs.csv, line 2: the clean prompt is"),
    ("pairs.txt", b"the bread\n", "attribution", "pairs.txt: pairs need the named fields"),
    ("many.txt", b"a line\n" * 1001, "heads", "many.txt, line 1001: more than 1,000 items"),
    ("long.txt", b"a" + b" a" * 600 + b"\n", "heads", "long.txt, line 1: the text is 601 tokens; the limit is 512"),
    ("markup.jsonl", json.dumps(dict(PAIRS[0], foil="<b>x</b>")).encode(), "attribution",
     "markup.jsonl, line 1: 'foil' '&lt;b&gt;x&lt;/b&gt;' is"),   # quoted as text, never markup
    ("number.jsonl", b'{"text": 3}\n', "heads", "number.jsonl, line 1: 'text' is a int"),
]


def call(served, analysis, corpus, upload):
    args = {"heads": ("induction", 0, 0), "attribution": (0, 0), "patch": ("z", "denoise", 0, 0, 0)}[analysis]
    return served["client"].predict(served["llama"], corpus, 5, upload, *args, api_name=f"/corpus_{analysis}")


@pytest.mark.parametrize("name, data, analysis, words", BAD_UPLOADS, ids=[b[0] for b in BAD_UPLOADS])
def test_every_bad_upload_is_named_in_words(served, tmp_path, name, data, analysis, words):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(AppError) as caught:
        call(served, analysis, "uploaded file", handle_file(str(path)))
    text = str(caught.value)
    assert words in text, text
    assert "<b>" not in text and "Traceback" not in text


def test_a_file_over_the_upload_cap_is_refused_in_words(served, tmp_path):
    path = tmp_path / "huge.txt"
    path.write_bytes(b"a line\n" * 400_000)   # 2.8 MB: over the app's upload cap, twice the 1 MB text cap
    with pytest.raises((AppError, ValueError), match="exceeds the maximum file size"):
        call(served, "heads", "uploaded file", handle_file(str(path)))


def test_the_shortcuts_job_maps_each_methods_rho_and_tables_every_measure(served):
    """corpus_shortcuts over uploaded pairs: the map is the core's ρ per method (rows) and site (columns), named
    in its ticks and hover; the strip a cell's pairs; the note every measure with its interval, the exact row,
    the warning. A cell of another map's shape shows the first."""
    model, client = served["model"], served["client"]
    pairs = corpora.read_pairs(served["pairs"], model.tokenizer)[:3]
    note, mean_figure, strip_figure = client.predict(served["llama"], "uploaded file", 3,
                                                     handle_file(served["pairs"]), "denoise", 2, 9,
                                                     api_name="/corpus_shortcuts")
    result = shortcuts.shortcuts_over(model, pairs)
    heatmap = shown(mean_figure)["data"][0]
    z = torch.tensor(plotly_array(heatmap["z"]).astype(float), dtype=torch.float32)
    torch.testing.assert_close(z, result["rho"].mean.float(), equal_nan=True)
    assert z[3, 1].isnan() and not z[:3].isnan().any()            # the flow graph has no residual-stream part
    layout = shown(mean_figure)["layout"]
    assert layout["yaxis"]["ticktext"] == ["AtP", "AtP*", "EAP-IG", "flow graph"]
    assert layout["xaxis"]["ticktext"] == ["each head", "residual stream"]
    assert heatmap["text"][1][0] == "AtP*, each head" and "%{text}" in heatmap["hovertemplate"]
    dots = shown(strip_figure)["data"][0]       # cell (2, 9) is no cell of a 4 × 2 map: the first is shown
    torch.testing.assert_close(torch.tensor(plotly_array(dots["y"]).astype(float), dtype=torch.float32),
                               result["rho"].per_item[:, 0, 0].float())
    assert "AtP, each head: each pair's ρ" in shown(strip_figure)["layout"]["title"]["text"]
    for words in ("| each head | exact patching (", "| residual stream | EAP-IG |", "strong cells missed",
                  "cost (forward passes)", "rank the wrong heads", f"n = **{result['rho'].n}**"):
        assert words in note, words
    assert "| residual stream | flow graph |" not in note
    # three pairs are too few for an interval: each cell shows its mean alone, and the note says why
    assert result["overlap"].low[0, 0].isnan() and result["rho"].n == 3
    rho, overlap = float(result["rho"].mean[0, 0]), float(result["overlap"].mean[0, 0])
    assert f"| each head | AtP | {rho:.2f} | {overlap:.2f} |" in note
    assert "No intervals: n = 3 pairs are too few (an interval needs at least 5)" in note


@pytest.mark.parametrize("analysis, corpus, words", [
    ("attribution", "IOI pairs", "too few single-token words for IOI prompts"),
    ("patch", "induction texts", "Induction texts are single texts, not prompt pairs"),
    ("heads", "uploaded file", "no file was uploaded"),
])
def test_a_corpus_the_model_cannot_take_is_refused_in_words(served, analysis, corpus, words):
    with pytest.raises(AppError, match=words):
        call(served, analysis, corpus, None)


def test_a_cell_out_of_range_names_its_field(served):
    with pytest.raises(AppError, match="Cell head must be between 0 and 3"):
        served["client"].predict(served["llama"], "induction texts", 3, None, "induction", 0, 9,
                                 api_name="/corpus_heads")


def test_a_job_streams_the_summary_of_the_items_finished_so_far(served):
    """What the page shows while a job runs, and keeps after Stop: the core's summary of the finished items, its
    note saying how many of how many."""
    model = served["model"]
    pairs = corpora.read_pairs(served["pairs"], model.tokenizer)[:3]   # a corpus not saved by the tests before
    updates = across.attribution_view(served["services"], served["llama"], "uploaded file", 3, served["pairs"], 0, 1)
    first_note = next(updates)[0]
    assert first_note.startswith("Attributing over")
    note, mean_figure, strip_figure, kept = next(updates)   # the first partial summary, sent at once
    updates.close()                                   # the page stops the job here
    assert "finished so far: the summary is of those" in note
    done = int(note.split("**Running: ")[1].split(" of ")[0])
    assert 1 <= done <= len(pairs) and f"of {len(pairs)} pairs" in note
    heads, _ = overs.logit_attribution_over(model, pairs[:done])
    z = torch.tensor(mean_figure.data[0].z, dtype=torch.float32)   # the view's own figure, before the page
    torch.testing.assert_close(z, heads.mean.float())
    assert kept.over.n == done      # and kept for a click on another cell, as shown
    stopped = across.mark_stopped(note)
    assert stopped.startswith("**Stopped.**") and note in stopped


def test_another_cell_is_drawn_from_the_kept_result_without_measuring_again(served):
    services, model = served["services"], served["model"]
    outputs = list(across.heads_view(services, served["llama"], "induction texts", 5, None, "previous_token", 0, 0))
    shown = outputs[-1][-1]
    texts = corpora.induction_texts(model.tokenizer, 5, INDUCTION_LENGTH, bos=model.config.bos_token_id)
    over = overs.head_scores_over(model, texts)["previous_token"]
    words, mean_figure, strip_figure, kept = across.cell_view(services, 1, 3, shown)
    assert kept is shown and f"mean **{float(over.mean[1, 3]):+.4f}**" in words
    torch.testing.assert_close(torch.tensor(strip_figure.data[0].y), over.per_item[:, 1, 3].float())
    assert mean_figure.layout.shapes[0].x0 == 2.5 and mean_figure.layout.shapes[0].y0 == 0.5   # the cell outlined
    with pytest.raises(Exception, match="Run an analysis first"):
        across.cell_view(services, 1, 3, None)


def test_top_examples_are_the_cores_places_each_linking_its_text_at_that_head(served):
    from core.corpus import heads as head_places

    model = served["model"]
    note, table = served["client"].predict(served["llama"], "uploaded file", 5, handle_file(served["texts"]), 1, 2, 4,
                                           api_name="/corpus_examples")
    found = head_places.top_examples(model, corpora.encode_texts(model.tokenizer, TEXTS), 1, 2, 4, per_decile=2)
    rows = table.split("<tr>")[2:]       # the header, then one row per place
    assert len(rows) == len(found.top) + sum(len(d) for d in found.deciles)
    for row, example in zip(rows, found.top):
        cells = row.split("<td>")
        assert int(cells[2].split("<")[0]) == example.text and float(cells[3].split("<")[0]) == pytest.approx(
            example.weight, abs=5e-4)
        assert cells[4].startswith(f"{example.query}: ") and cells[5].startswith(f"{example.key}: ")
        assert "tab=attention&amp;layer=1&amp;head=2&amp;text=" in row or "tab=attention&layer=1&head=2&text=" in row
    assert f"{found.places:,} query–key places" in note


def test_an_examples_link_opens_the_very_tokens_listed_and_random_tokens_get_none(served):
    """A link's text, encoded as the Attention tab encodes any text, is the item's token ids, so the positions
    listed are the tab's; the induction texts' random tokens read back as other tokens, so they get words, not a
    link."""
    from urllib.parse import parse_qs

    from ui.services.text import encode

    model = served["model"]
    _, table = served["client"].predict(served["llama"], "uploaded file", 5, handle_file(served["texts"]), 1, 2, 4,
                                        api_name="/corpus_examples")
    items = corpora.encode_texts(model.tokenizer, TEXTS)
    rows = table.split("<tr>")[2:]       # the header, then one row per place: rank, text, weight, …, link
    assert rows and all('href="?' in row for row in rows), "an uploaded text's places each link to it"
    for row in rows:
        index = int(row.split("<td>")[2].split("<")[0])
        query = re.search(r'href="\?([^"]+)"', row).group(1)
        text = parse_qs(query.replace("&amp;", "&"))["text"][0]
        assert encode(model, text).ids == items[index].tolist()
    _, random_table = served["client"].predict(served["llama"], "induction texts", 3, None, 1, 2, 4,
                                               api_name="/corpus_examples")
    assert "href=" not in random_table and "no link: as text, these tokens read back as other tokens" in random_table


def test_top_examples_escape_an_uploaded_text(served, tmp_path):
    path = tmp_path / "markup.txt"
    path.write_text("<script>alert(1)</script> the bread is warm\n<b>bold</b> and the lamp\n", encoding="utf-8")
    _, table = served["client"].predict(served["llama"], "uploaded file", 5, handle_file(str(path)), 0, 1, 5,
                                        api_name="/corpus_examples")
    assert "<script>" not in table and "<b>" not in table and "&lt;" in table



def test_an_encoder_scores_its_heads_and_is_refused_attribution_in_words(served):
    from tiny_app_model import build_tiny_bert
    from ui.services import Services
    from ui.services.checks import UserError
    from ui.services.models import ModelStore
    from ui.settings import AppSettings

    bert = str(build_tiny_bert(served["root"] / "tiny-bert"))
    services = Services.create(AppSettings.from_env(), ModelStore(extra_names=[bert]))
    *_, (note, _, _, kept) = across.heads_view(services, bert, "uploaded file", 3, served["texts"], "local", 0, 0)
    assert kept.over.n == 3 and "The local score" in note
    *_, (why, _, _, nothing) = across.heads_view(services, bert, "uploaded file", 3, served["texts"], "induction", 0, 0)
    assert nothing is None and "only on decoders" in why
    with pytest.raises(UserError, match="this model is an encoder"):
        list(across.attribution_view(services, bert, "uploaded file", 3, served["pairs"], 0, 0))


def test_a_finished_job_exports_its_cells_and_items(served):
    import csv

    services, model = served["services"], served["model"]
    *_, (note, _, _, shown) = across.heads_view(services, served["llama"], "induction texts", 5, None, "first_token",
                                                1, 0)   # five texts: the fewest that get an interval
    # the first-token map says its share of sink heads (Sink^ε), counted from the mean it draws and its interval
    mean, low = shown.over.mean, shown.over.low
    above, sure = int((mean > 0.3).sum()), int((low > 0.3).sum())
    assert f"{above} of {mean.numel()} heads" in note and f"{sure} pass it with their whole 95 % interval" in note
    files, kept = across.export_view(services, shown)
    assert kept is shown
    by_name = {os.path.basename(path): path for path in files}
    cells = next(path for name, path in by_name.items() if name.endswith("_first_token.csv"))
    with open(cells, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    over = overs.head_scores_over(model, corpora.induction_texts(model.tokenizer, 5, INDUCTION_LENGTH,
                                                                     bos=model.config.bos_token_id))["first_token"]
    row = next(r for r in rows if (r["layer"], r["head"]) == ("1", "0"))
    assert float(row["mean"]) == pytest.approx(float(over.mean[1, 0]), abs=1e-6) and row["n"] == "5"
    assert float(row["low"]) == pytest.approx(float(over.low[1, 0]), abs=1e-6)   # the same seeded bootstrap
    assert any(name.endswith(".npz") for name in by_name)
    with pytest.raises(Exception, match="no saved job to export"):
        across.export_view(services, across.Shown(over, None, "text", "", "", False, "m", "v"))


# ---- one head's query/key plane, and each head's ablation ----

def test_the_qk_plane_service_is_the_cores_with_each_points_token(served):
    from core.corpus import heads as head_places
    from ui.services.corpus.over import Corpus
    from ui.services.corpus.qk import PLANE_POINTS, run_plane
    from ui.services.text import token_texts

    model = served["model"]
    texts = corpora.encode_texts(model.tokenizer, TEXTS)
    shown = run_plane(model, Corpus(texts, "text", "five texts"), 1, 2)
    plane = head_places.qk_over(model, texts, 1, 2, max_points=PLANE_POINTS)
    torch.testing.assert_close(shown.plane.points, plane.points)
    assert torch.equal(shown.plane.is_key, plane.is_key) and torch.equal(shown.plane.token, plane.token)
    assert shown.labels == token_texts(model, plane.token)     # each point's own token, in the points' order
    assert shown.rope and not shown.qk_norm      # the tiny Llama: RoPE, no QK-norm


def test_the_qk_plane_endpoint_draws_the_cores_points_with_its_line(served):
    from core.corpus import heads as head_places

    model = served["model"]
    note, figure = served["client"].predict(served["llama"], "uploaded file", 4, handle_file(served["texts"]), 1, 3,
                                            api_name="/corpus_qk")
    texts = corpora.encode_texts(model.tokenizer, TEXTS[:4])
    plane = head_places.qk_over(model, texts, 1, 3)
    queries, keys = shown(figure)["data"]
    n = len(plane.queries)
    for trace, points in ((queries, plane.points[:n]), (keys, plane.points[n:])):
        xy = torch.tensor(plotly_array(trace["x"]), dtype=torch.float32), torch.tensor(plotly_array(trace["y"]))
        torch.testing.assert_close(xy[0], points[:, 0])
        torch.testing.assert_close(xy[1].float(), points[:, 1])
    assert [queries["marker"]["symbol"], keys["marker"]["symbol"]] == ["circle", "triangle-up"]
    custom = plotly_array(keys["customdata"]).astype(int)
    assert custom[:, 0].tolist() == plane.text[n:].tolist() and custom[:, 1].tolist() == plane.position[n:].tolist()
    assert "%{text}" in keys["hovertemplate"] and "text %{customdata[0]}" in keys["hovertemplate"]
    line = shown(figure)["layout"]["annotations"][0]["text"]
    assert line.startswith(f"4 texts: {n:,} of {plane.tokens:,} tokens") and PLANE_DEFINITION in line
    assert "after RoPE" in line and PLANE_DEFINITION in note
    assert "the first 4 of 5 texts of texts.txt" in note


def test_the_inside_tabs_plane_of_a_text_is_the_corpus_plane_of_that_text_alone(served):
    """One plane, one definition: the Inside tab's qk_geometry and the Across texts tab's plane over a corpus of
    that one text draw the same points, and both name the definition."""
    one = served["root"] / "one.txt"
    one.write_text(TEXTS[0] + "\n", encoding="utf-8")
    client = served["client"]
    corpus_note, corpus_figure = client.predict(served["llama"], "uploaded file", 1, handle_file(str(one)), 1, 3,
                                                api_name="/corpus_qk")
    inside_note, inside_figure = client.predict(served["llama"], TEXTS[0], 1, 3, api_name="/qk_geometry")
    corpus_traces, inside = shown(corpus_figure)["data"], shown(inside_figure)["data"]
    assert [t["name"] for t in inside] == [t["name"] for t in corpus_traces] == ["queries", "keys"]
    for theirs, ours in zip(corpus_traces, inside):
        for axis in ("x", "y"):
            np.testing.assert_allclose(plotly_array(ours[axis]), plotly_array(theirs[axis]), atol=1e-5, rtol=0)
    assert PLANE_DEFINITION in inside_note and PLANE_DEFINITION in corpus_note
    assert shown(inside_figure)["layout"]["title"]["subtitle"]["text"].replace("<br>", " ") == PLANE_DEFINITION


def test_the_qk_plane_refuses_a_head_out_of_range_in_words(served):
    with pytest.raises(AppError, match="Head must be between 0 and 3, got 7"):
        served["client"].predict(served["llama"], "induction texts", 3, None, 0, 7, api_name="/corpus_qk")


def test_the_ablation_service_streams_the_cores_summary_capped_at_its_texts(served):
    from ui.services.corpus.over import Corpus, stream_over
    from ui.services.corpus.pages import Saving

    model = served["model"]
    texts = corpora.induction_texts(model.tokenizer, 10, 8, seed=3)
    updates = list(stream_over(model, "ablation", Corpus(texts, "text", "ten texts"), model_name="tiny",
                               saving=Saving(None), ablation="mean"))
    final = updates[-1].result
    over = overs.ablation_over(model, texts, "mean")
    torch.testing.assert_close(final.per_item, over.per_item)
    torch.testing.assert_close(final.mean, over.mean)
    assert final.n == overs.ABLATION_TEXTS == 8 and "swept the first 8 of 10 texts" in final.note
    assert updates[-1].total == 8 and "Not saved" in updates[-1].saved
    for update in updates[:-1]:   # each partial summary: the core's summarise of the texts finished by then
        if update.result is not None:
            done = update.result.n
            torch.testing.assert_close(update.result.mean, stats.summarise(over.per_item[:done], bounds=stats.UNBOUNDED).mean)


class Ticking:
    """A clock for the corpus services' time cap that moves one second each time it is read."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


def test_a_job_past_its_time_cap_stops_with_its_finished_items_and_says_so(served, monkeypatch):
    import dataclasses

    from ui.services.corpus import over as over_service

    services, model = served["services"], served["model"]
    monkeypatch.setattr(over_service, "time", Ticking())   # the cap's clock only: every stop() check is 1 s
    monkeypatch.setattr(services, "settings", dataclasses.replace(services.settings, corpus_max_seconds=4.5))
    *_, (note, _, _, shown) = across.ablation_view(services, served["llama"], "induction texts", 8, None, "zero",
                                                   0, 0)
    texts = corpora.induction_texts(model.tokenizer, 8, INDUCTION_LENGTH, bos=model.config.bos_token_id)
    full = overs.ablation_over(model, texts)
    done = shown.over.n
    assert 0 < done < 8, "the cap stopped the job part-way"
    torch.testing.assert_close(shown.over.per_item, full.per_item[:done])   # the items finished, as measured
    assert f"stopped after {done} of 8 texts" in shown.over.note
    assert "**Stopped at the time cap** of 4.5 s per job: the figures show the items finished by then." in note
    assert "Done in" not in note and f"mean over n = **{done}**" in note


def test_the_ablation_endpoint_maps_the_cores_mean_and_states_its_cap(served):
    model = served["model"]
    note, mean_figure, strip_figure = served["client"].predict(served["llama"], "induction texts", 9, None, "zero",
                                                               1, 0, api_name="/corpus_ablation")
    texts = corpora.induction_texts(model.tokenizer, 9, INDUCTION_LENGTH, bos=model.config.bos_token_id)
    over = overs.ablation_over(model, texts)
    check_map_and_strip(note, mean_figure, strip_figure, over, (1, 0), "text")
    assert "at most the first 8 texts are swept" in note and "swept the first 8 of 9 texts" in note
    assert "limit=None" not in note      # the core's hint for API callers: the page has no such setting


@pytest.mark.parametrize("corpus, n, ablation, words", [
    ("uploaded file", 3, "zero", "no file was uploaded"),
    ("induction texts", 0, "zero", "Items (n) must be between 1 and 200, got 0"),
    ("induction texts", 3, "half", "'half' (type: &lt;class 'str'&gt;) is not in the list of choices"),  # Gradio's
])
def test_the_ablation_refuses_bad_input_in_words(served, corpus, n, ablation, words):
    with pytest.raises(AppError) as caught:
        served["client"].predict(served["llama"], corpus, n, None, ablation, 0, 0, api_name="/corpus_ablation")
    assert words in str(caught.value), str(caught.value)


def test_an_encoder_decoder_or_a_model_without_an_lm_head_is_refused_both_in_words(served):
    from types import SimpleNamespace

    from ui.services.checks import UserError
    from ui.services.corpus.ablation import check_ablation_model
    from ui.services.corpus.qk import check_plane

    seq2seq = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=True), lm_head=object())
    for check in (check_ablation_model, lambda model: check_plane(model, 0, 0)):
        with pytest.raises(UserError, match="this is an encoder-decoder"):
            check(seq2seq)
    headless = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=False, causal=False), lm_head=None)
    with pytest.raises(UserError, match="Ablation reads each position's token prediction through the LM head"):
        check_ablation_model(headless)


def test_the_sink_share_counts_the_heads_above_epsilon_on_the_mean_and_on_the_interval():
    import torch

    from core.corpus.stats import SHARE, summarise

    # 5 texts × [1 layer, 4 heads]: head 0 always far above ε, head 1 above on average only, heads 2-3 below
    per_item = torch.tensor([[[0.9, 0.9, 0.1, 0.2]], [[0.8, 0.05, 0.1, 0.2]], [[0.85, 0.4, 0.1, 0.2]],
                             [[0.95, 0.05, 0.1, 0.2]], [[0.9, 0.4, 0.1, 0.2]]])
    over = summarise(per_item, bounds=SHARE)
    words = across.sink_share_words(over, "text")
    assert "2 of 4 heads (50.0 %)" in words and "1 pass it with their whole 95 % interval" in words
    assert "over these 5 texts" in words and "ε = 0.3" in words
    few = summarise(per_item[:4], bounds=SHARE)
    assert "interval" not in across.sink_share_words(few, "text")   # four texts: too few for an interval
