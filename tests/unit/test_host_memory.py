"""A CPU process keeps the memory it frees (distributed/host_memory.py), unless the user set
glibc's allocator themselves. Each case runs in a fresh interpreter: the settings are the
process's own, and pytest's must stay as they are."""

import ctypes
import os
import subprocess
import sys

import pytest

from torchtitan_like.distributed.host_memory import USER_SETTINGS, _mallopt

pytestmark = pytest.mark.skipif(_mallopt() is None or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                                reason="glibc 2.33 or later (mallopt, mallinfo2)")

FREED_AND_KEPT = """
import ctypes
from torchtitan_like.distributed.host_memory import keep_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
                "keepcost".split()]

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Info
applied = keep_freed_memory()
size = 64 * 2**20  # an FSDP unit's buffer: above glibc's largest mmap threshold
block = libc.malloc(size)
ctypes.memset(block, 1, size)
libc.free(block)
print(applied, libc.mallinfo2().fordblks >= size)  # the freed block still held by the heap
"""


def _run(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in (*USER_SETTINGS, "LD_PRELOAD")}
    return subprocess.run([sys.executable, "-c", FREED_AND_KEPT], env={**clean, **env},
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_freed_block_stays_with_the_process():
    """Without the settings glibc maps a 64 MiB block apart and unmaps it on free."""
    assert _run({}) == "True True"


def test_the_users_own_allocator_settings_are_left_alone():
    assert _run({"MALLOC_ARENA_MAX": "4"}) == "False False"
    assert _run({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}) == "False False"
