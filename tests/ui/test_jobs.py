"""Long work in a worker thread (ui/services/jobs.py): its updates stream to the reader, and the work stops when
the reader closes the stream or leaves it unread, as a page that went away does."""

import threading
import time

import pytest

from ui.services.jobs import stream_job


def slow_work(steps: int, seconds: float, ran: list):
    def work(report):
        for i in range(1, steps + 1):
            time.sleep(seconds)
            ran.append(i)
            report(i, steps)
        return "done"
    return work


def worker(name: str) -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == name), None)


def test_updates_stream_and_the_result_comes_last():
    ran = []
    updates = list(stream_job(slow_work(3, 0.0, ran), 3, "job-stream"))
    assert [u.done for u in updates] == [0, 1, 2, 3, 3] and updates[-1].finished and updates[-1].result == "done"


def test_closing_the_stream_stops_the_work_at_its_next_report():
    ran = []
    stream = stream_job(slow_work(1000, 0.01, ran), 1000, "job-closed")
    next(stream), next(stream)
    stream.close()
    thread = worker("job-closed")
    if thread is not None:
        thread.join(timeout=5)
        assert not thread.is_alive()
    assert len(ran) < 1000


def test_a_stream_left_unread_stops_the_work_once_abandoned():
    ran = []
    stream = stream_job(slow_work(10_000, 0.01, ran), 10_000, "job-abandoned", abandoned_s=0.3)
    next(stream), next(stream)           # read twice, then never again, and never closed
    thread = worker("job-abandoned")
    thread.join(timeout=10)
    assert not thread.is_alive(), "the worker kept computing for a reader that left"
    assert len(ran) < 10_000
    stream.close()


def test_an_error_in_the_work_reaches_the_reader():
    def broken(report):
        report(1, 2)
        raise RuntimeError("the work failed")

    with pytest.raises(RuntimeError, match="the work failed"):
        list(stream_job(broken, 2, "job-broken"))
