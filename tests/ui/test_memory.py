"""core/machine/allocator.py and the app's settings over it (ui/memory.py): the allocator's arenas bounded and its free
pages handed back on glibc, nothing done (and nothing raised) elsewhere; HeavyJobs hands memory back whenever a
long job ends."""

from __future__ import annotations

import logging
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from core.machine import allocator
from tiny_app_model import build_tiny_llama
from ui import memory
from ui.services.checks import UserError
from ui.services.generation import stream_generation, stream_trace
from ui.services.kept import KeptStore
from ui.services.jobs import HeavyJobs

ROOT = Path(__file__).resolve().parents[2]
ON_GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# In a fresh process: 8 threads alive at once, each allocating, then glibc's own count of its arenas.
ARENAS_IN_A_FRESH_PROCESS = """
import ctypes, sys, threading
from core.machine import allocator
bound = sys.argv[1] != "none"
if bound:
    assert allocator.bound_arenas(int(sys.argv[1]))
libc = allocator.glibc()
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
held, barrier = [], threading.Barrier(8)
def allocate():
    barrier.wait()
    held.append(libc.malloc(4096))
    barrier.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc.malloc_stats()  # one "Arena N:" line per arena, on stderr
"""


def arenas_after_eight_threads(bound: str) -> int:
    done = subprocess.run([sys.executable, "-c", ARENAS_IN_A_FRESH_PROCESS, bound], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines())


@pytest.mark.skipif(not ON_GLIBC, reason="mallopt and malloc_trim are glibc's")
def test_on_glibc_mallopt_and_malloc_trim_are_found_and_succeed(monkeypatch):
    monkeypatch.delenv(memory.TRIM_SETTING, raising=False)
    libc = allocator.glibc()
    assert libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")
    assert libc.mallopt(allocator.M_ARENA_MAX, 64) == 1  # glibc returns 1 on success (64: no real bound here)
    assert memory.trim() is True


@pytest.mark.skipif(not ON_GLIBC, reason="mallopt and malloc_trim are glibc's")
def test_bound_arenas_before_the_threads_start_holds_them_to_the_bound():
    assert arenas_after_eight_threads("none") > 2  # glibc's own: a new arena for each thread, up to 8 per core
    assert arenas_after_eight_threads("2") <= 2


# In a fresh process, the allocator set as argv[1] says ("glibc": as it comes; "app": the app's own settings,
# configure(); a number: the mmap threshold fixed at that many KiB), one probe of glibc's statistics (argv[2]):
# - "mapped": a 1 MiB block freed, then another; how many more bytes glibc then has in blocks mapped on their own;
# - "heap": a 16 MiB block (a batch's activations) allocated and freed twice; how many more bytes the main heap
#   then holds.
ALLOCATOR_PROBE = """
import ctypes, sys
from core.machine import allocator
from ui import memory
settings, probe = sys.argv[1:3]
if settings == "app":
    memory.configure()
elif settings != "glibc":
    assert allocator.fix_mmap_threshold(int(settings))
libc = allocator.glibc()
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc.mallinfo2.restype = Mallinfo2
if probe == "mapped":
    libc.free(libc.malloc(2**20))
    before = libc.mallinfo2().hblkhd
    second = libc.malloc(2**20)
    print(libc.mallinfo2().hblkhd - before)
else:
    before = libc.mallinfo2().arena
    for _ in range(2):
        libc.free(libc.malloc(16 * 2**20))
    print(libc.mallinfo2().arena - before)
"""


def allocator_probe(settings: str, probe: str) -> int:
    done = subprocess.run([sys.executable, "-c", ALLOCATOR_PROBE, settings, probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not ON_GLIBC, reason="mallopt is glibc's")
def test_a_fixed_mmap_threshold_keeps_a_big_block_mapped_after_one_was_freed():
    assert allocator_probe("glibc", "mapped") == 0  # freeing the first raised the threshold past 1 MiB
    assert allocator_probe("128", "mapped") >= 2**20


@pytest.mark.skipif(not ON_GLIBC, reason="mallopt is glibc's")
def test_the_apps_default_threshold_hands_a_freed_batch_back_at_once():
    # glibc's own: freeing the first (mapped) block raised the threshold to 16 MiB and the trim threshold to
    # twice that, so the second block came from the heap and stays there when freed (less what the heap's free
    # top already held)
    assert allocator_probe("glibc", "heap") > 8 * 2**20
    # the app's: the threshold fixed at 32 MiB leaves the trim threshold at 128 KiB, so the heap gives it back
    assert allocator_probe("app", "heap") < 2**20


def test_the_settings_turn_each_off(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "glibc", lambda: calls.append("looked up"))
    monkeypatch.setenv(memory.ARENAS_SETTING, "0")
    monkeypatch.setenv(memory.TRIM_SETTING, "0")
    monkeypatch.setenv(memory.MMAP_SETTING, "0")
    assert memory.bound_arenas() is False and memory.trim() is False and memory.fix_mmap_threshold() is False
    memory.configure()
    assert calls == []  # not even looked up
    with pytest.raises(ValueError, match=r"mmap threshold: the value must be a whole number ≥ 1, got 0"):
        allocator.fix_mmap_threshold(0)  # 0 is the setting's word for glibc's own, not a threshold


class NoMalloptLibc:
    """A C library without mallopt or malloc_trim (musl has no malloc_trim; macOS neither)."""


@pytest.mark.parametrize("lookup", [lambda: None, NoMalloptLibc], ids=["not glibc", "no mallopt"])
def test_without_glibc_nothing_is_done_nothing_raised_and_the_log_says_so(monkeypatch, caplog, lookup):
    monkeypatch.delenv(memory.ARENAS_SETTING, raising=False)
    monkeypatch.delenv(memory.TRIM_SETTING, raising=False)
    monkeypatch.setattr(allocator, "_unavailable_said", set())
    if lookup is NoMalloptLibc:  # the real lookup (uncached), loading a library that lacks both functions
        monkeypatch.setattr(allocator.ctypes, "CDLL", lambda *a, **k: NoMalloptLibc())
        monkeypatch.setattr(allocator, "glibc", allocator.glibc.__wrapped__)
    else:
        monkeypatch.setattr(allocator, "glibc", lookup)
    with caplog.at_level(logging.INFO, logger=allocator.__name__):
        assert allocator.bound_arenas(2) is False
        assert memory.bound_arenas() is False  # the app's setting, through the same lookup
        assert memory.trim() is False
        assert memory.trim() is False
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and all("not done" in line and "not glibc" in line for line in said)  # once each


def test_heavy_jobs_release_memory_when_a_job_ends_however_it_ends():
    released = []
    jobs = HeavyJobs(release=lambda: released.append(dict(jobs.running())))
    with jobs.hold("a", "A sweep"):
        assert released == []
    assert released == [{}]  # after the job left the table
    with pytest.raises(RuntimeError, match="the work failed"):
        with jobs.hold("a", "A sweep"):
            raise RuntimeError("the work failed")
    assert released == [{}, {}] and jobs.running() == {}
    with jobs.hold("a", "A sweep"):
        with pytest.raises(UserError, match="already running A sweep"):
            with jobs.hold("a", "Integrated gradients"):
                pass
        assert len(released) == 2  # a refused job never ran: nothing to release
    assert len(released) == 3


def test_heavy_jobs_release_by_default_through_the_allocator():
    assert HeavyJobs()._release is memory.trim


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from core import load_model

    return load_model(build_tiny_llama(tmp_path_factory.mktemp("memory") / "tiny-llama", max_positions=64),
                      device="cpu")


def test_a_generation_hands_memory_back_when_it_ends_or_is_stopped(tiny_model, monkeypatch):
    model = tiny_model
    trims = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append("trim") or True)
    updates = list(stream_generation(model, "The lamp", False, 4, 0.0, None, None, 0))
    assert updates[-1].done and trims == ["trim"]
    stream = stream_generation(model, "The lamp", False, 8, 0.0, None, None, 0)
    next(stream)
    assert trims == ["trim"]  # not while it writes
    stream.close()  # the page's Stop, or the client gone
    assert trims == ["trim", "trim"]


def test_kept_attention_rows_hold_only_the_bytes_counted_against_the_budget(tiny_model):
    """Each step's rows arrive as a view of the whole cache's width (prompt + max new tokens keys); a kept row is
    a compact copy, so the trace's row_bytes is the memory it holds."""
    kept = KeptStore(budget_bytes=10**9)
    for _, trace in stream_trace(tiny_model, "tiny", "The lamp", False, 12, 0.0, None, None, 0, kept):
        pass
    rows = [r for r in trace.rows(kept) if r is not None]
    assert len(rows) == len(trace.tokens) == 12
    for step, row in enumerate(rows):
        assert row.shape[-1] == len(trace.context_ids(step)) and row.flags["C_CONTIGUOUS"]
    assert trace.row_bytes == sum(r.nbytes for r in rows)
