"""The C allocator, asked to give memory back: glibc malloc only, through ctypes; elsewhere nothing is done.

glibc gives each thread that allocates while the others hold theirs an arena of its own (up to 8 per core), and
memory freed inside an arena stays mapped in the process: after a heavy job (a sweep, integrated gradients)
that ran in a few of Gradio's worker threads, the freed activations of each stay resident. The calls:

- bound_arenas(n): mallopt(M_ARENA_MAX, n), made before any other thread allocates (first thing in app.py's
  main()), so that all threads share at most n arenas; this is what MALLOC_ARENA_MAX=n does when it is in the
  environment before the process starts, without re-executing the process to put it there.
- trim(): malloc_trim(0), which hands every arena's free pages back to the system; HeavyJobs calls it when a
  long job ends.
- fix_mmap_threshold(kb): mallopt(M_MMAP_THRESHOLD, kb KiB). A block of at least the threshold is mapped on its
  own and unmapped when freed. glibc's own threshold moves: each time such a block is freed it rises to that
  block's size (up to 32 MiB) and the trim threshold to twice that; from then on a batch's activations come from
  the heap, which keeps its free top up to the trim threshold, and how much more stays depends on how the heap
  happens to fragment: a corpus job of head scores on SmolLM2 peaked anywhere from 1.3 to 2.5 GB from run to
  run, whatever its size. A fixed threshold also keeps the trim threshold at its 128 KiB, so the heap's free top
  goes back as soon as a batch is freed (tests/ui/test_memory.py shows both). The app fixes it at 32 MiB,
  glibc's own ceiling: 1,000 texts then peaked 8 to 249 MB above 100 in three runs (under the moving threshold
  +43 to +1,191 MB in six runs, over 900 MB in four), and generation, a forward keeping probabilities, a
  patching sweep and head scores ran 0.94x to 1.06x the time of the moving threshold, a Lab training run 0.89x
  (bench/corpus/threshold.py). Fixed at 128 KiB the peak itself is about 1 GB lower, but every big tensor is
  mapped afresh and its pages faulted in: 1.04x to 1.44x the time; a setting for a server short of memory
  (bench/corpus/speed.py's memory part measures the memory).

configure() makes the two mallopt calls, first thing in app.py's main(). Settings (environment, read when
called): ATTN_MALLOC_ARENAS (default 2; 0 leaves glibc's own bound), ATTN_MALLOC_TRIM (default 1; 0 never
trims) and ATTN_MALLOC_MMAP_KB (default 32768, fixed at 32 MiB; 128 fixes it at 128 KiB; 0 leaves glibc's moving
threshold), so that each can be measured with and without.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import sys

log = logging.getLogger(__name__)

ARENAS = 2  # arenas every thread shares: measured against glibc's default by bench/memory.py
MMAP_KB = 32768  # glibc's own ceiling, fixed: a freed batch goes back at once (above)
M_ARENA_MAX = -8  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
ARENAS_SETTING = "ATTN_MALLOC_ARENAS"
TRIM_SETTING = "ATTN_MALLOC_TRIM"
MMAP_SETTING = "ATTN_MALLOC_MMAP_KB"

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


def _setting(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        value = -1
    if value < 0:
        log.warning("%s must be a whole number ≥ 0, got %r: using %d", name, raw, default)
        return default
    return value


def _mallopt(what: str, option: int, value: int, setting: str, unit: str = "", scale: int = 1) -> bool:
    """mallopt(option, value × scale), said in the log as `what`; value 0 leaves glibc's own. True when set."""
    if value == 0:
        log.info("%s: glibc's own (%s=0)", what, setting)
        return False
    libc = glibc()
    if libc is None:
        return _unavailable(what)
    if libc.mallopt(option, int(value) * scale) != 1:  # e.g. a threshold over half of glibc's heap size
        log.warning("%s: mallopt refused %d%s; glibc's own stays", what, value, unit)
        return False
    log.info("%s: %d%s", what, value, unit)
    return True


def bound_arenas(n: int | None = None) -> bool:
    """mallopt(M_ARENA_MAX, n), n by default ATTN_MALLOC_ARENAS (2; 0: leave glibc's bound). True when set."""
    n = _setting(ARENAS_SETTING, ARENAS) if n is None else n
    return _mallopt("malloc arenas every thread shares", M_ARENA_MAX, n, ARENAS_SETTING)


def fix_mmap_threshold(kb: int | None = None) -> bool:
    """mallopt(M_MMAP_THRESHOLD, kb KiB), kb by default ATTN_MALLOC_MMAP_KB (32768; 0: leave glibc's moving
    threshold). True when set."""
    kb = _setting(MMAP_SETTING, MMAP_KB) if kb is None else kb
    return _mallopt("malloc mmap threshold", M_MMAP_THRESHOLD, kb, MMAP_SETTING, " KiB", 1024)


def configure() -> None:
    """Both mallopt settings, before any other thread allocates."""
    bound_arenas()
    fix_mmap_threshold()


def trim() -> bool:
    """malloc_trim(0): the free pages of every arena back to the system. True when it was called (whether or not
    there was anything to hand back); False where there is no glibc or ATTN_MALLOC_TRIM=0."""
    if _setting(TRIM_SETTING, 1) == 0:
        return False
    libc = glibc()
    if libc is None:
        return _unavailable("malloc_trim")
    libc.malloc_trim(0)
    return True
