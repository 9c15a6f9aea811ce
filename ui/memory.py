"""The app's allocator settings over core/machine/allocator.py (glibc's arenas bounded, its mmap threshold fixed, its
free pages handed back; the why and the measurements are there). configure() makes the two mallopt calls first
thing in app.py's main(), before any other thread allocates; HeavyJobs calls trim() when a long job ends.

Settings (environment, read when called): ATTN_MALLOC_ARENAS (default core.machine.allocator.ARENAS, 2; 0 leaves glibc's
own bound), ATTN_MALLOC_TRIM (default 1; 0 never trims) and ATTN_MALLOC_MMAP_KB (default core.machine.allocator.MMAP_KB,
fixed at 32 MiB; 128 fixes it at 128 KiB; 0 leaves glibc's moving threshold), so that each can be measured with
and without.
"""

from __future__ import annotations

import logging
import os

from core.machine import allocator

log = logging.getLogger(__name__)

ARENAS_SETTING = "ATTN_MALLOC_ARENAS"
TRIM_SETTING = "ATTN_MALLOC_TRIM"
MMAP_SETTING = "ATTN_MALLOC_MMAP_KB"


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


def bound_arenas() -> bool:
    """core.machine.allocator.bound_arenas at ATTN_MALLOC_ARENAS (0: leave glibc's bound). True when set."""
    n = _setting(ARENAS_SETTING, allocator.ARENAS)
    if n == 0:
        log.info("malloc arenas every thread shares: glibc's own (%s=0)", ARENAS_SETTING)
        return False
    return allocator.bound_arenas(n)


def fix_mmap_threshold() -> bool:
    """core.machine.allocator.fix_mmap_threshold at ATTN_MALLOC_MMAP_KB (0: leave glibc's moving threshold). True when
    set."""
    kb = _setting(MMAP_SETTING, allocator.MMAP_KB)
    if kb == 0:
        log.info("malloc mmap threshold: glibc's own (%s=0)", MMAP_SETTING)
        return False
    return allocator.fix_mmap_threshold(kb)


def configure() -> None:
    """Both mallopt settings, before any other thread allocates."""
    bound_arenas()
    fix_mmap_threshold()


def trim() -> bool:
    """core.machine.allocator.trim unless ATTN_MALLOC_TRIM=0. True when malloc_trim was called."""
    if _setting(TRIM_SETTING, 1) == 0:
        return False
    return allocator.trim()
