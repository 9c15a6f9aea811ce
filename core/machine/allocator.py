"""The C allocator, asked to give memory back: glibc malloc only, through ctypes; elsewhere nothing is done. Any
process that runs the model wants this (the app, a bench timing a corpus job); which calls the app makes, and how
its settings turn each off, is ui/memory.py's. Imports neither torch nor the rest of the core, so a process can
make these calls before any thread allocates.

glibc gives each thread that allocates while the others hold theirs an arena of its own (up to 8 per core), and
memory freed inside an arena stays mapped in the process: after a heavy job (a sweep, integrated gradients)
that ran in a few of Gradio's worker threads, the freed activations of each stay resident. The calls:

- bound_arenas(n): mallopt(M_ARENA_MAX, n), made before any other thread allocates, so that all threads share at
  most n arenas; this is what MALLOC_ARENA_MAX=n does when it is in the environment before the process starts,
  without re-executing the process to put it there.
- trim(): malloc_trim(0), which hands every arena's free pages back to the system.
- fix_mmap_threshold(kb): mallopt(M_MMAP_THRESHOLD, kb KiB). A block of at least the threshold is mapped on its
  own and unmapped when freed. glibc's own threshold moves: each time such a block is freed it rises to that
  block's size (up to 32 MiB) and the trim threshold to twice that; from then on a batch's activations come from
  the heap, which keeps its free top up to the trim threshold, and how much more stays depends on how the heap
  happens to fragment: a corpus job of head scores on SmolLM2 peaked anywhere from 1.3 to 2.5 GB from run to
  run, whatever its size. A fixed threshold also keeps the trim threshold at its 128 KiB, so the heap's free top
  goes back as soon as a batch is freed (tests/ui/test_memory.py shows both). MMAP_KB fixes it at 32 MiB,
  glibc's own ceiling: 1,000 texts then peaked 8 to 249 MB above 100 in three runs (under the moving threshold
  +43 to +1,191 MB in six runs, over 900 MB in four), and generation, a forward keeping probabilities, a
  patching sweep and head scores ran 0.94x to 1.06x the time of the moving threshold, a Lab training run 0.89x
  (bench/corpus/threshold.py). Fixed at 128 KiB the peak itself is about 1 GB lower, but every big tensor is
  mapped afresh and its pages faulted in: 1.04x to 1.44x the time; a setting for a server short of memory
  (bench/corpus/speed.py's memory part measures the memory).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import sys

log = logging.getLogger(__name__)

ARENAS = 2  # arenas every thread shares: measured against glibc's default by bench/memory.py
MMAP_KB = 32768  # glibc's own ceiling, fixed: a freed batch goes back at once (above)
M_ARENA_MAX = -8  # glibc's malloc.h
M_MMAP_THRESHOLD = -3

_unavailable_said: set[str] = set()


@functools.cache
def glibc():
    """glibc as a ctypes library when this process runs on it and it has mallopt and malloc_trim, else None."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's soname on every Linux
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def _unavailable(what: str) -> bool:
    if what not in _unavailable_said:  # once per process: trim() runs after every heavy job
        _unavailable_said.add(what)
        log.info("%s: not done, this platform's C library is not glibc with mallopt and malloc_trim (%s, %s)",
                 what, sys.platform, platform.libc_ver()[0] or "unknown libc")
    return False


def _mallopt(what: str, option: int, value: int, unit: str = "", scale: int = 1) -> bool:
    """mallopt(option, value × scale), said in the log as `what`. True when set."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what}: the value must be a whole number ≥ 1, got {value!r}")
    libc = glibc()
    if libc is None:
        return _unavailable(what)
    if libc.mallopt(option, value * scale) != 1:  # e.g. a threshold over half of glibc's heap size
        log.warning("%s: mallopt refused %d%s; glibc's own stays", what, value, unit)
        return False
    log.info("%s: %d%s", what, value, unit)
    return True


def bound_arenas(n: int = ARENAS) -> bool:
    """mallopt(M_ARENA_MAX, n): every thread shares at most n arenas. True when set."""
    return _mallopt("malloc arenas every thread shares", M_ARENA_MAX, n)


def fix_mmap_threshold(kb: int = MMAP_KB) -> bool:
    """mallopt(M_MMAP_THRESHOLD, kb KiB), fixing glibc's moving threshold. True when set."""
    return _mallopt("malloc mmap threshold", M_MMAP_THRESHOLD, kb, " KiB", 1024)


def trim() -> bool:
    """malloc_trim(0): the free pages of every arena back to the system. True when it was called (whether or not
    there was anything to hand back); False where there is no glibc."""
    libc = glibc()
    if libc is None:
        return _unavailable("malloc_trim")
    libc.malloc_trim(0)
    return True
