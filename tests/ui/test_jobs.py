"""Long work in a worker thread (ui/services/jobs.py): its updates stream to the reader, and the work stops when
the reader closes the stream or leaves it unread, as a page that went away does; streams that take their steps in
turn (Turns) are served first come, first served, and none takes its slot back ahead of one that waited."""

import threading
import time

import pytest

from ui.services.checks import UserError
from ui.services.jobs import Turns, stream_job


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


def test_work_past_its_time_cap_stops_and_the_reader_is_told_in_words():
    ran = []
    stream = stream_job(slow_work(10_000, 0.01, ran), 10_000, "job-capped", max_seconds=0.2)
    with pytest.raises(UserError, match=r"time cap of 0\.2 s per job and was stopped: ask for fewer items"):
        list(stream)
    thread = worker("job-capped")
    if thread is not None:
        thread.join(timeout=5)
        assert not thread.is_alive()
    assert 0 < len(ran) < 10_000


def tokens(name: str, count: int, log: list, turns: Turns, started: threading.Event | None = None):
    """A stream of `count` steps, each computed in a turn (as stream_generation takes them), logged as computed."""
    for i in range(count):
        with turns.turn():
            if started is not None:
                started.set()
            log.append(name)
            time.sleep(0.01)
        yield f"{name}{i}"


def test_streams_in_turns_alternate_instead_of_one_running_to_its_end():
    turns, log = Turns(1), []
    first_started = threading.Event()
    results = {}

    def consume(name, started=None):
        results[name] = list(tokens(name, 5, log, turns, started))

    a = threading.Thread(target=consume, args=("a", first_started))
    a.start()
    first_started.wait(5)
    b = threading.Thread(target=consume, args=("b",))
    b.start()
    a.join(10)
    b.join(10)
    assert results == {"a": [f"a{i}" for i in range(5)], "b": [f"b{i}" for i in range(5)]}
    # b asked while a computed its first step: from then on they alternate; a never takes two steps in a row
    # while b waits (with one slot and a lock that let the releasing thread take it back, a would run to its end)
    first_b = log.index("b")
    assert first_b <= 2, log
    between = log[first_b - 1:first_b + 7]
    assert all(x != y for x, y in zip(between, between[1:])), log


def test_turns_serve_waiters_in_the_order_they_asked_and_never_more_than_the_slots():
    turns, order, running, peak = Turns(2), [], [0], [0]
    lock, gate = threading.Lock(), threading.Event()

    def step(name):
        with turns.turn():
            with lock:
                order.append(name)
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            gate.wait(5)
            time.sleep(0.01)
            with lock:
                running[0] -= 1

    def asked() -> int:  # the threads that have asked for a turn: in a slot (named in order) or in the queue
        with lock:
            return len(order) + turns.waiting()

    threads = []
    for name in "abcdef":
        thread = threading.Thread(target=step, args=(name,))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 10  # each asks after the one before: start the next once this one has asked
        while asked() < len(threads):
            assert time.monotonic() < deadline, f"{name} never asked for a turn"
            time.sleep(0.001)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert order == list("abcdef") and peak[0] == 2



def test_a_generation_computes_each_token_in_a_turn(tmp_path):
    """stream_generation with turns takes one turn per token (and one more to find the end), never holding a
    slot while its update is read."""
    from core import load_model
    from tiny_app_model import build_tiny_llama
    from ui.services.generation import stream_generation

    model = load_model(build_tiny_llama(tmp_path / "tiny-llama", max_positions=64), device="cpu")
    turns, taken = Turns(1), []
    turn = turns.turn

    def counted():
        taken.append(1)
        return turn()

    turns.turn = counted
    updates = []
    for update in stream_generation(model, "The lamp", False, 4, 0.0, None, None, 0, turns=turns):
        with turn():  # the slot is free while the reader holds an update: this would block otherwise
            updates.append(update)
    assert [u.n_new for u in updates] == [1, 2, 3, 4, 4] and len(taken) == 5
