"""A CPU process keeps the memory it frees, as CUDA's caching allocator keeps a GPU's.

On CPU, torch allocates tensors with glibc's malloc. By default glibc gives a freed block of
more than its mmap threshold (128 KiB, rising to at most 32 MiB) back to the kernel, trims a
heap whose free top grows past twice that, and gives each thread (gloo's transfer threads too)
an arena of its own, which it trims apart. FSDP allocates every unit's gathered parameters and
reduce-scatter buffers anew at each use (tens of MiB each), so the kernel maps, zeroes and
faults them in again at every step: on the 100M flavor under FSDP 2 (2 processes,
``scripts/bench_host_memory.py``, docs/measurements.md), a median 117 K minor faults and 1.2 s
of system time a step on each rank, varying from run to run with where the heap happens to
end, against 14 K and 0.66 s (gloo's socket reads, mostly) once the process keeps what it
freed; the median step 7.9 -> 7.05 s. As with CUDA's allocator, the process then holds its
high-water mark until it exits. A GPU job allocates its tensors from CUDA's caching allocator
and is left as it is.

Settings a user gives glibc themselves (``MALLOC_*`` or ``GLIBC_TUNABLES``), or another
allocator preloaded (jemalloc, tcmalloc), are theirs: nothing is changed then.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
"""glibc's mallopt parameters (malloc.h)."""

USER_SETTINGS = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_",
                 "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where the C library is not glibc (musl, macOS)."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc.mallopt


def users_own_allocator() -> bool:
    """Whether the user set glibc's allocator or preloaded another one."""
    return any(name in os.environ for name in USER_SETTINGS) or \
        "malloc" in os.environ.get("LD_PRELOAD", "")


def keep_freed_memory() -> bool:
    """Make this process's malloc keep what it frees: one arena for every thread, blocks from
    the heap only (never mapped apart), the heap trimmed only past 2 GiB free. Call before the
    process group starts its threads. Returns whether the settings were applied."""
    if users_own_allocator():
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1))
    return all(mallopt(param, value) == 1 for param, value in settings)
