"""The Across texts tab's saved jobs on a shared server (SPACE_ID set, as on a Space), through gradio_client: two
Clients are two pages. A page's job (an uploaded corpus's too) is saved in a folder of its own, reopened and
resumed there alone, while another page asking for the same corpus measures it afresh; each job is deleted its
lifetime after its last write with no request arriving; past a page's cap (or all pages') a job is measured and
shown but not saved, its note saying why. A model change clears the tab's results. (On a laptop:
tests/app/test_app_corpus.py, every page sharing the runs folder.)"""

from __future__ import annotations

import os
import time

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"

from gradio_client import Client, handle_file  # noqa: E402

from test_ray_corpus import ThreadChunks, texts  # noqa: E402
from tiny_app_model import build_tiny_llama, launch_app  # noqa: E402
from ui.services.checks import UserError  # noqa: E402
from ui.services.corpus.over import Corpus, chunks_on, exported, stream_over  # noqa: E402
from ui.services.corpus.pages import CorpusRuns  # noqa: E402
from ui.services.lab.private import PRIVATE_DIR  # noqa: E402
from ui.views.corpus import across  # noqa: E402

TEXTS = ["The lighthouse keeper rowed out to the rocks at dawn.", "Every morning the baker opens the shop at six.",
         "A causal mask hides the future.", "When the storm passed, she lit the lamp again."]


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus-private")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPACE_ID", "someone/explorer")
        patch.setenv("ATTN_RUNS_DIR", str(root / "runs"))
        patch.setenv("ATTN_PRIVATE_CORPUS_MB", "5")
        llama = str(build_tiny_llama(root / "tiny-llama"))
        texts = root / "texts.txt"
        texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
        demo, url, services = launch_app([llama], llama)
        yield {"llama": llama, "url": url, "services": services, "demo": demo, "runs": root / "runs",
               "texts": str(texts)}
        demo.close()


def heads(served, client: Client, n: int = 4) -> tuple:
    return client.predict(served["llama"], "uploaded file", n, handle_file(served["texts"]), "previous_token", 0, 0,
                          api_name="/corpus_heads")


def page_folder(served, client: Client):
    return served["services"].corpus_runs.saving(client.session_hash).root


def test_a_pages_job_is_its_own_and_another_page_measures_afresh(space):
    mine, theirs = Client(space["url"], verbose=False), Client(space["url"], verbose=False)
    note, first_map, _ = heads(space, mine)
    assert "saved (for this page only, deleted 60 minutes after its last write" in note, note
    assert str(space["runs"]) not in note and PRIVATE_DIR not in note                  # no server path
    mine_root, their_root = page_folder(space, mine), page_folder(space, theirs)
    assert mine_root != their_root and mine_root.parent == space["runs"] / PRIVATE_DIR
    assert [p.name for p in space["runs"].iterdir()] == [PRIVATE_DIR]                 # nothing in the shared folder
    (job,) = mine_root.iterdir()
    assert (job / "meta.json").is_file() and len(list((job / "items").glob("*.npz"))) == 4
    again, again_map, _ = heads(space, mine)
    assert "Reopened from the saved job" in again and again_map["plot"] == first_map["plot"]
    # a job killed half-way: its items stay, and only its own page resumes from them
    (job / "meta.json").unlink()
    (job / "result.npz").unlink()
    (job / "items" / "000003.npz").unlink()
    other, other_map, _ = heads(space, theirs)
    assert "Reopened" not in other and "resumed" not in other and "saved (for this page only" in other, other
    assert other_map["plot"] == first_map["plot"]                                     # measured afresh, the same
    assert (their_root / job.name / "meta.json").is_file()
    resumed, _, _ = heads(space, mine)
    assert "resumed from 3 items saved before" in resumed, resumed


def test_a_saved_job_is_deleted_on_time_with_no_request(space, monkeypatch):
    import threading
    from types import SimpleNamespace

    from ui.services.lab import private

    # the runs' clock, moved by hand: the expiry thread's own sleep then decides nothing, and the job is due
    # exactly when the clock passes its last write plus its lifetime
    now = [time.time()]
    monkeypatch.setattr(private, "time", SimpleNamespace(time=lambda: now[0]))
    pages = space["services"].corpus_runs.pages()
    monkeypatch.setattr(pages, "ttl_s", 2.0)
    expired = threading.Condition()               # told after each expired job's folder is deleted

    def told(alias):
        with expired:
            expired.notify_all()

    monkeypatch.setattr(pages, "on_expire", [*pages.on_expire, told])
    page = Client(space["url"], verbose=False)
    note, _, _ = heads(space, page, n=3)
    assert "deleted 2 seconds after its last write" in note, note
    (job,) = page_folder(space, page).iterdir()
    last_write = now[0]
    pages.expire(now=last_write + 1.999)
    assert job.exists()                                                               # not before its time
    with expired:
        with pages._changed:                   # the clock passes the lifetime; the expiry thread looks again
            now[0] = last_write + 2.0
            pages._changed.notify_all()
        assert expired.wait_for(lambda: not job.exists(), timeout=60), "the expiry thread left the job once due"
    with pytest.raises(UserError, match="saved job is gone"):                         # Export then says why
        exported(job)
    again, _, _ = heads(space, page, n=3)
    assert "Reopened" not in again and "saved (for this page only" in again          # measured afresh


def test_past_a_cap_a_job_is_shown_but_not_saved(space, monkeypatch):
    runs = space["services"].corpus_runs
    assert runs.page_bytes == 5_000_000                                               # ATTN_PRIVATE_CORPUS_MB
    page = Client(space["url"], verbose=False)
    first, _, _ = heads(space, page, n=2)
    assert "saved (for this page only" in first
    monkeypatch.setattr(runs, "page_bytes", 1000)
    note, mean_map, _ = heads(space, page, n=3)                                       # a new job: over the cap
    assert "Not saved: this page's saved jobs take" in note and "a page's cap of 1.0 kB" in note, note
    assert "ATTN_PRIVATE_CORPUS_MB" in note and "n = **3**" in note and mean_map is not None
    assert len(list(page_folder(space, page).iterdir())) == 1
    assert "Reopened from the saved job" in heads(space, page, n=2)[0]                # what it saved still opens
    monkeypatch.setattr(runs, "total_bytes", 1000)                                    # all pages together
    fresh = Client(space["url"], verbose=False)
    note, _, _ = heads(space, fresh, n=2)
    assert "Not saved: the pages' saved jobs take" in note and "this server's cap of 1.0 kB" in note, note
    assert not page_folder(space, fresh).exists() or not any(page_folder(space, fresh).iterdir())


def test_a_model_change_clears_the_tabs_results(space):
    """The step of the event chained on the picker's successful load clears every result of the tab (its outputs,
    by their elements), its notes naming the buttons to press; the picker's change itself stops the tab's running
    jobs."""
    demo = space["demo"]
    fns = {fn._id: fn for fn in demo.fns.values()}
    (follow,) = [fn for fn in fns.values() if fn.name == "follow_model"]
    assert fns[follow.trigger_after].name == "load_card"
    assert follow.trigger_only_on_success
    ((fn, inputs, outputs),) = [step for step in follow.fn.steps if step[0].__name__ == "switch_corpus"]
    assert all(block in follow.outputs for block in outputs)
    ids = [getattr(block, "elem_id", None) for block in outputs]
    assert ids == ["corpus-note", "corpus-map", "corpus-cell-note", "corpus-strip", None, "corpus-export-files",
                   "corpus-examples-note", "corpus-examples", "corpus-qk-note", "corpus-qk"]
    note, mean_map, cell, strip, kept, files, examples_note, table, plane_note, plane = fn("other-model")
    for figure in (mean_map, strip, plane):                                          # emptied and hidden again
        assert figure == {"__type__": "update", "value": None, "visible": False}
    assert kept is None and cell == "" and table == ""
    assert f"**{across.PLANE_BUTTON}**" in plane_note
    assert files.visible is False and files.value is None                             # hidden, emptied
    assert note.startswith("Now on other-model:") and all(f"**{b}**" in note for b in across.RUN_BUTTONS)
    assert f"**{across.EXAMPLES_BUTTON}**" in examples_note
    change = fns[follow.trigger_after].targets                                       # the picker's change
    stopping = [fn for fn in fns.values() if fn.is_cancel_function and fn.targets == change]
    assert [sorted(fns[i].name for i in fn.cancels) for fn in stopping] == [
        ["corpus_ablation", "corpus_attribution", "corpus_examples", "corpus_heads", "corpus_patch", "corpus_qk",
         "corpus_shortcuts"]]


def test_a_job_in_chunks_is_saved_for_its_page_and_its_clock_started(space, tmp_path, monkeypatch):
    """The Ray front's path (the corpus in chunks): the finished job goes to the page's folder and is registered for
    deletion; past the page's cap it is shown but not saved."""
    monkeypatch.setenv("ATTN_RUNS_DIR", str(tmp_path / "runs"))
    runs = CorpusRuns(private=True, ttl_s=600.0, page_bytes=5_000_000)
    model = space["services"].models.get(space["llama"])
    corpus = Corpus(texts()[:3], "text", "three repeated spans")

    def last(saving):
        with chunks_on(ThreadChunks(model, in_flight=2, chunk_items=2)):
            return list(stream_over(model, "heads", corpus, model_name="tiny", saving=saving))[-1]

    first = last(runs.saving("page-a"))
    assert "saved (for this page only, deleted 10 minutes after its last write" in first.saved, first.saved
    assert first.folder.parent == runs.saving("page-a").root and (first.folder / "meta.json").is_file()
    assert len(runs.pages().choices("page-a")) == 1 and runs.pages().choices("page-b") == []
    assert "nothing was measured again" in last(runs.saving("page-a")).saved
    other = last(runs.saving("page-b"))                                               # another page: afresh
    assert "saved (for this page only" in other.saved and other.folder != first.folder
    runs.page_bytes = 0
    capped = last(runs.saving("page-c"))
    assert capped.saved.startswith("Not saved: this page's saved jobs take 0.0 kB") and capped.folder is None
    assert capped.result["induction"].n == first.result["induction"].n
    runs.pages().close()
