"""PrivateRuns.held: a page's saved jobs are never deleted while a job of that page runs, however long since the
last write; when its last job ends, their clocks start again from then (the rule pages.py states)."""
import threading
import time

from ui.services.lab.private import PrivateRuns


def test_a_held_sessions_runs_do_not_expire_until_its_last_job_ends(tmp_path):
    runs = PrivateRuns(tmp_path, ttl_s=10.0)
    try:
        mine = runs.folder("page", "job")
        mine.mkdir(parents=True)
        theirs = runs.folder("other", "job")
        theirs.mkdir(parents=True)
        runs.add("page", "job", mine)
        runs.add("other", "job", theirs)
        with runs.held("page"):
            with runs.held("page"):                            # two jobs of one page at once
                late = time.time() + 60
                assert runs.expire(now=late) == [f"job (this page's run, {theirs.parent.name[:6]}…"
                                                 f"{theirs.parent.name[-4:]})"]
                assert mine.exists() and not theirs.exists()   # only the page with no job under way loses its run
            assert runs.expire(now=late) == [] and mine.exists()   # one job of the page still runs
        ended = time.time()
        assert runs.expire(now=ended + 9) == [] and mine.exists()  # the clock restarted when the last job ended
        assert len(runs.expire(now=ended + 10.5)) == 1 and not mine.exists()
    finally:
        runs.close()


def test_the_expiry_thread_waits_for_a_held_page_then_deletes_on_time(tmp_path):
    runs = PrivateRuns(tmp_path, ttl_s=0.2)
    try:
        folder = runs.folder("page", "job")
        folder.mkdir(parents=True)
        with runs.held("page"):
            runs.add("page", "job", folder)                     # starts the expiry thread
            time.sleep(0.6)                                     # three lifetimes: a slow item, say
            assert folder.exists()
        released = time.monotonic()
        while folder.exists() and time.monotonic() - released < 30:
            time.sleep(0.02)
        assert not folder.exists(), "the run outlived its lifetime after its page's job ended"
        assert [t for t in threading.enumerate() if t.name == "private-runs-expiry"]
    finally:
        runs.close()
