"""The public probe's findings, answered on a shared server (SPACE_ID set) through the launched app: NaN and ±inf in
any number field of any endpoint are refused in words that name the field, never "Something went wrong" nor a
traceback in the log; the induction Lab's "Train one like it" stops at ATTN_LAB_MAX_SECONDS as every Lab run
does; qk_attribution holds a text to the typed text's cap and says how many tokens it read; the streaming
perplexity stops at the heavy jobs' time cap; the shortcuts map refuses a cell that is no index; and an upload
naming a server path is answered in words without reading it."""

from __future__ import annotations

import json
import logging
import os
import time

import httpx
import pytest
import torch

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from core.analysis import sinks  # noqa: E402
from test_app_api import raw_call  # noqa: E402
from test_app_lab import LAB_ENV  # noqa: E402
from test_app_state_sizes import CLEAN, TEXT, calls, corpus_pairs  # noqa: E402
from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402
from ui.services import Services  # noqa: E402
from ui.services.models import ModelStore  # noqa: E402
from ui.settings import AppSettings  # noqa: E402
from ui.views.sinks import streaming_view  # noqa: E402

LAB_SECONDS = 2.0   # ATTN_LAB_MAX_SECONDS here
TEXT_BYTES = 20_000  # ATTN_MAX_TEXT_MB=0.02
# endpoints that read what an earlier call of the same session left (a generation, a Lab run): called alone, each
# refuses for want of it before any number is read, which is an answer in words too
NOT_FROM_A_FRESH_SESSION = {"load_text", "export_generation", "stop_training", "lab_runs", "export_lab"}
# numbers that the call's other choices leave unread: the layer of the "one layer's heads" site, under another site
NOT_READ = {("patch_sweep", 7), ("corpus_patch", 6)}


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe-answers")
    env = {**LAB_ENV, "SPACE_ID": "someone/explorer", "ATTN_RUNS_DIR": str(root / "runs"),
           "ATTN_WEIGHTS_DIR": str(root / "weights"), "ATTN_LAB_MAX_SECONDS": str(LAB_SECONDS),
           "ATTN_MAX_TEXT_MB": str(TEXT_BYTES / 1e6)}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        llama = str(build_tiny_llama(root / "tiny-llama"))
        demo, url, services = launch_app([llama], llama)
        yield dict(url=url, services=services, llama=llama, root=root)
        demo.close()


def uploaded(url: str, path: str) -> dict:
    """A file uploaded as the page uploads it, as the FileData a raw call names."""
    with open(path, "rb") as f:
        answer = httpx.post(f"{url.rstrip('/')}/gradio_api/upload", files={"files": (os.path.basename(path), f)})
    answer.raise_for_status()
    return {"path": answer.json()[0], "orig_name": os.path.basename(path), "meta": {"_type": "gradio.FileData"}}


def error_of(events: str) -> str | None:
    """The error message of a raw call's event stream (None: it completed)."""
    if "event: error" not in events:
        return None
    data = events.split("event: error", 1)[1].split("data:", 1)[1].strip().splitlines()[0]
    return json.loads(data)["error"]


def completed_with(events: str) -> str:
    """The outputs of a raw call that completed, as the JSON text of its last event."""
    return events.rsplit("data:", 1)[1].strip() if "event: complete" in events else ""


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_in_any_number_field_are_answered_in_words(space, tmp_path, caplog, literal):
    """Every endpoint, each of its number arguments in turn sent as the literal (the others as a call that
    succeeds sends them): the call is refused in words naming a field, or it completes, and the log holds no
    unexpected error."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    files = {}
    unanswered = {}
    caplog.set_level(logging.ERROR)
    for name, args in calls(space["llama"], str(text)):
        if name in NOT_FROM_A_FRESH_SESSION:
            continue
        args = [files.setdefault(a["path"], uploaded(space["url"], a["path"])) if isinstance(a, dict) and "path" in a
                else a for a in args]    # a file to upload; another dict is a JSON argument (the approximation's budget)
        for i, value in enumerate(args):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            sent = [*args[:i], "LITERAL", *args[i + 1:]]
            body = json.dumps({"data": sent}).replace('"LITERAL"', literal)
            events = raw_call(space["url"], name, body)
            error = error_of(events)
            if error is None:       # a refusal shown as a note beside what could be drawn, or a number not read
                if " must be" not in completed_with(events) and (name, i) not in NOT_READ:
                    unanswered[f"{name} argument {i}"] = "completed without a word on the number"
            elif not error or "Something went wrong" in error:
                unanswered[f"{name} argument {i}"] = error
    assert not unanswered, unanswered
    assert not [r for r in caplog.records if "unexpected error" in r.getMessage()]


def test_the_induction_labs_run_stops_at_the_labs_time_cap(space):
    client = Client(space["url"], verbose=False)
    started = time.monotonic()
    note, _, _, pick = client.predict(0, 3000, api_name="/lab_induction_train")
    took = time.monotonic() - started
    (record,) = [r for r in space["services"].lab.runs(client.session_hash) if r.id == pick]
    assert record.lab.time_budget == LAB_SECONDS and record.status == "time budget"
    assert len(record.run.history) < 3000 and note.startswith(f"**{pick}**")
    assert took < 120, f"the run took {took:.0f} s under a {LAB_SECONDS:g} s cap"


def test_qk_attribution_holds_the_text_cap_and_says_what_it_read(space):
    client = Client(space["url"], verbose=False)
    long = "the keeper lit the lamp " * (TEXT_BYTES // 24 + 1)       # over the cap: refused, nothing read
    with pytest.raises(AppError, match=r"The text in 'Text' is 0\.02 MB; the limit for typed and uploaded text is "
                                       r"0\.02 MB"):
        client.predict(space["llama"], long, 1, 0, -1, 2, "heads", False, api_name="/qk_attribution")
    shorter = "the keeper lit the lamp " * 40                        # within the cap, past the 32 tokens read
    found = client.predict(space["llama"], shorter, 1, 0, -1, 2, "heads", False, api_name="/qk_attribution")
    n = len(space["services"].models.get(space["llama"]).tokenizer(shorter)["input_ids"])
    assert len(found["tokens"]) == 32 < n
    assert found["read"].startswith(f"The text has {n:,} tokens; only the first 32 are used"), found["read"]
    whole = client.predict(space["llama"], CLEAN, 1, 0, -1, 2, "heads", False, api_name="/qk_attribution")
    assert whole["read"] == f"All {len(whole['tokens'])} tokens read."


def test_the_streaming_perplexity_stops_at_the_heavy_jobs_time_cap(space):
    services = Services.create(AppSettings(corpus_max_seconds=1e-9), space["services"].models)
    outputs = list(streaming_view(services, space["llama"], TEXT, 4, 1, "cache"))
    note = outputs[-1][0]
    assert "time cap of 1e-09 s per job and was stopped" in note and "a shorter text" in note, note
    # the same reading under the default cap reads to its end
    plenty = Services.create(AppSettings(), space["services"].models)
    assert "**Perplexity" in list(streaming_view(plenty, space["llama"], TEXT, 4, 1, "cache"))[-1][0]


def test_streaming_perplexity_takes_one_text_as_t_or_1_by_t(space):
    model = space["services"].models.get(space["llama"])
    ids = torch.tensor(model.tokenizer(TEXT)["input_ids"][:24])
    for positions in ("cache", "text"):
        flat = sinks.streaming_perplexity(model, ids, 6, 2, positions)
        batched = sinks.streaming_perplexity(model, ids[None], 6, 2, positions)
        torch.testing.assert_close(batched.loss, flat.loss)
        assert batched.perplexity == flat.perplexity
    with pytest.raises(ValueError, match="ids must be one text, \\[T\\] or \\[1, T\\]; got shape \\[2, 24\\]"):
        sinks.streaming_perplexity(model, torch.stack([ids, ids]), 6, 2)


@pytest.mark.parametrize("row, col, words", [
    ("nan", 0, "Cell method must be a number from 0 to 3, got nan"),
    (0, "inf", "Cell site must be a number from 0 to 1, got inf"),
    (2.5, 0, "Cell method must be a whole number from 0 to 3, got 2.5"),
    (0, -1, "Cell site must be between 0 and 1, got -1"),
])
def test_the_shortcuts_map_refuses_a_cell_that_is_no_index(space, tmp_path, row, col, words):
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    client = Client(space["url"], verbose=False)
    with pytest.raises(AppError, match=words):
        client.predict(space["llama"], "uploaded file", 2, handle_file(corpus_pairs(str(text))), "denoise", row, col,
                       api_name="/corpus_shortcuts")


def test_an_upload_naming_a_server_path_is_answered_in_words(space):
    secret = space["root"] / "secret.txt"
    secret.write_text("a server's own file", encoding="utf-8")
    model = json.dumps(space["llama"])
    for path in (str(secret), "/etc/passwd", "/nonexistent/corpus.txt"):
        named = json.dumps({"path": path, "meta": {"_type": "gradio.FileData"}})
        for name, body in (("load_text", f'{{"data": [{named}]}}'),
                           ("corpus_heads", f'{{"data": [{model}, "uploaded file", 5, {named}, "previous_token", '
                                            '0, 0]}')):
            error = error_of(raw_call(space["url"], name, body))
            assert error is not None and "uploaded through the page's file field" in error, (name, path, error)
            assert path not in error and "server's own file" not in error
