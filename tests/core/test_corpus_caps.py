"""A shared server's limits on corpus jobs, held where the work happens: the bytes a job saves are checked before
each file it writes (a first job cannot pass the cap: it keeps what fit, and is measured and shown whole); the time cap is asked between
a batch's layers, so one batch that holds the whole corpus still stops; a saved file with a damaged dtype name is
unreadable, as damaged bytes are, and measured again; an upload's lone surrogate or deeply nested line is named
by its line. Clocks here are fakes that tick on each reading: no test sleeps."""
import json

import numpy as np
import pytest
import torch

from core import load_model
from core.analysis import over as overs
from core.corpus import jobs, saved
from core.corpus import texts as corpora
from tests import tiny
from tests.tiny import Ticking
from ui.services.jobs import TimeCap

N = 6


@pytest.fixture(scope="module")
def llama():
    return load_model(tiny.save(tiny.llama(num_key_value_heads=2)), device="cpu")


def random_texts(n, length=9, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, tiny.VOCAB - 1, (length,), generator=gen) for _ in range(n)]


def item_sizes(root) -> list[int]:
    return [p.stat().st_size for p in root.rglob("items/*.npz")]


# ---- the bytes a job saves ----

def test_a_first_job_cannot_pass_the_cap_keeps_what_fit_and_is_measured_whole(llama, tmp_path):
    texts = random_texts(N)
    whole = saved.run_over(overs.ANALYSES["head_scores"], llama, texts, tmp_path / "whole", "tiny", batch_tokens=9)
    item = max(item_sizes(tmp_path / "whole"))
    job_json = (whole.folder / saved.JOB).stat().st_size
    cap = job_json + 2 * item + item // 2 + 64          # room for two items, not three, and not the result
    root = tmp_path / "capped"
    run = saved.run_over(overs.ANALYSES["head_scores"], llama, texts, root, "tiny", max_bytes=cap, batch_tokens=9)
    assert saved.disk_usage(root) <= cap                 # held as the items were written, not only at the start
    assert len(item_sizes(root)) == 2 and not run.finished and not (run.folder / saved.META).exists()
    assert "over this server's cap" in run.full and "kB" in run.full, run.full
    assert run.measured == N and "stopped" not in run.result["previous_token"].note   # past the cap: shown, not kept
    for kind, over in run.result.items():
        torch.testing.assert_close(over.per_item, whole.result[kind].per_item, equal_nan=True)
    again = saved.run_over(overs.ANALYSES["head_scores"], llama, texts, root, "tiny", max_bytes=cap, batch_tokens=9)
    assert again.reused == 2 and again.full and saved.disk_usage(root) <= cap   # a resumed job holds it too
    done = saved.run_over(overs.ANALYSES["head_scores"], llama, texts, root, "tiny", batch_tokens=9)
    assert done.finished and done.reused == 2 and not done.full
    for kind, over in done.result.items():
        torch.testing.assert_close(over.per_item, whole.result[kind].per_item, equal_nan=True)


def test_a_room_check_is_asked_before_every_file_and_the_result_too(llama, tmp_path):
    asked = []

    def room(size: int) -> None:
        asked.append(size)
        if len(asked) == N + 2:                          # every item fits; the result does not
            raise saved.NoRoom("the result would not fit")

    texts = random_texts(N)
    run = saved.run_over(overs.ANALYSES["head_scores"], llama, texts, tmp_path, "tiny", room=room, batch_tokens=9)
    assert asked[0] == 0 and len(asked) == 1 + N + 1     # the start, each item, the result
    assert len(item_sizes(tmp_path)) == N and not run.finished and run.full == "the result would not fit"
    assert not (run.folder / saved.RESULT).exists() and run.result["previous_token"].n == N   # shown whole


# ---- the time cap within one batch ----

def test_the_time_cap_stops_a_job_inside_its_one_batch(llama):
    texts = random_texts(40)                             # one batch of 4,096 tokens holds them all
    assert len(jobs.length_batches([len(t) for t in texts], jobs.BATCH_TOKENS)) == 1
    cap = TimeCap(2.5, clock=Ticking())                  # started at 0; asked at 1 (the batch), 2 and 3 (layers)
    result = overs.head_scores_over(llama, texts, stop=cap)
    assert cap.hit and result["previous_token"].n == 0
    assert "stopped after 0 of 40 texts" in result["previous_token"].note
    assert "**Stopped at the time cap** of 2.5 s per job" in cap.words()
    uncapped = TimeCap(100.0, clock=Ticking())
    assert overs.head_scores_over(llama, texts, stop=uncapped)["previous_token"].n == 40
    assert not uncapped.hit and uncapped.words() == ""


def test_a_job_that_ends_past_the_cap_says_so():
    clock = Ticking()
    cap = TimeCap(3.0, clock=clock)
    assert not cap() and not cap()                       # asked at 1 s and 2 s: within the cap
    clock.now = 40.0                                     # one long step, and the job ended without asking again
    words = cap.words()                                  # read at 41 s
    assert not cap.hit and "**Past the time cap** of 3 s per job" in words and "ended at 41 s" in words
    assert TimeCap(None, clock=Ticking()).words() == ""


# ---- damaged files ----

def test_a_damaged_dtype_name_is_unreadable_and_measured_again(llama, tmp_path):
    texts = random_texts(N)
    first = saved.run_over(overs.ANALYSES["head_scores"], llama, texts, tmp_path, "tiny", batch_tokens=9)
    meta = json.loads((first.folder / saved.META).read_text())
    for part in meta["parts"].values():
        part["dtype"] = "Tensor"                         # a torch attribute, not a dtype
    (first.folder / saved.META).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="not a torch dtype name"):
        saved.open_job(first.folder)
    item = first.folder / "items" / "000002.npz"
    arrays = saved.read_npz(item)
    arrays["dtypes"] = [entry.split("=")[0] + "=nonesuch" for entry in arrays["dtypes"].tolist()]
    saved.write_atomic(item, lambda file: np.savez(file, **arrays))
    assert sorted(saved.read_items(first.folder, N)) == [0, 1, 3, 4, 5]
    again = saved.run_over(overs.ANALYSES["head_scores"], llama, texts, tmp_path, "tiny", batch_tokens=9)
    assert again.finished and again.reused == 5 and again.measured == 1
    for kind, over in again.result.items():
        torch.testing.assert_close(over.per_item, first.result[kind].per_item, equal_nan=True)
    assert saved.open_job(again.folder).result["previous_token"].n == N   # readable again


# ---- an upload's lines ----

def test_a_lone_surrogate_a_deep_line_and_a_huge_number_are_named_by_their_line(tmp_path):
    upload = tmp_path / "corpus.jsonl"
    upload.write_text('{"text": "fine"}\n{"text": "\\ud800 lone"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"corpus.jsonl, line 2: 'text' holds a lone surrogate \(\\ud800 at "
                                         r"character 1\)"):
        corpora.read_texts(upload)
    upload.write_text('{"text": "fine"}\n\n' + "[" * 50_000 + "]" * 50_000 + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="corpus.jsonl, line 3: JSON nested too deeply"):
        corpora.read_texts(upload)
    upload.write_text('{"text": "fine"}\n{"text": "hello there", "x": ' + "9" * 5_000 + "}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="corpus.jsonl, line 2: a number too long to read"):   # not Python's words
        corpora.read_texts(upload)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"clean": "a b", "corrupted": "a c", "answer": "\ud800", "foil": " b"}) + "\n",
                     encoding="utf-8")
    with pytest.raises(ValueError, match="pairs.jsonl, line 1: 'answer' holds a lone surrogate"):
        corpora.read_pairs(pairs, object())
