"""How every torchrun test worker ends: destroy the process groups, flush, and leave without
Python's interpreter finalisation.

Why: after a gloo collective completes, the backend's worker thread can still hold the last
reference to that collective's tensors for a moment after the main thread has moved on. If the
main thread meanwhile reaches interpreter finalisation, releasing those tensors needs the GIL,
CPython 3.11 ends a thread that asks for the GIL during finalisation with ``pthread_exit``, and
the forced unwind through a C++ ``noexcept`` destructor aborts the process ("terminate called
without an active exception", SIGABRT) after every result was already written. CI saw it once
in cp_ring_worker.py, and it came back 1 in 15 runs on a loaded 2-core machine. Nothing is left
to do at that point, so ``os._exit`` skips finalisation and the race with it.
"""

import os
import sys

import torch.distributed as dist


def finish_worker() -> None:
    """Destroy every process group, flush the output streams and exit with status 0."""
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
