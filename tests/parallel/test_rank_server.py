"""The rank server (tests/rank_server.py) starts ranks as torchrun would and leaves nothing.

A forked rank must start like a torchrun rank: as ``__main__``, its script's folder first on
``sys.path``, one intra-op thread, no thread and no process group inherited from the server.
A rank that dies is reported as torchrun reports it (exit code 1, the rank, its signal), the
other ranks are stopped, and no process of the launch outlives it (a child a rank started
included). A changed environment gets a new server (torch read the old one at import).
"""

import os
import signal
import time

import harness
from harness import ranks

STATE = """
import os, sys, threading
import torch
import torch.distributed as dist
state = ("STATE", __name__, sys.path[0] == os.path.dirname(os.path.abspath(__file__)),
         torch.get_num_threads(), threading.active_count(), dist.is_initialized(),
         os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ.get("TTL_PROBE"))
os.write(1, (" ".join(map(str, state)) + "\\n").encode())  # one write: the ranks share stdout
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""

DIES = """
import os, signal, subprocess, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:  # its child runs before rank 1 dies (else the kill may come first)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    os.write(1, f"CHILD {child.pid}\\n".encode())
dist.barrier()
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
dist.barrier()  # never completes: rank 1 is gone
"""


def test_a_forked_rank_starts_as_a_torchrun_rank(tmp_path, monkeypatch):
    worker = tmp_path / "state.py"
    worker.write_text(STATE)
    done = ranks(2, str(worker), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    states = sorted(line.split()[1:] for line in done.stdout.splitlines()
                    if line.startswith("STATE"))
    assert states == [["__main__", "True", "1", "1", "False", str(rank), "2", "None"]
                      for rank in range(2)]

    server = harness._RANK_SERVER.proc.pid
    monkeypatch.setenv("TTL_PROBE", "on")
    done = ranks(2, str(worker), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert harness._RANK_SERVER.proc.pid != server
    assert all(line.endswith(" on") for line in done.stdout.splitlines()
               if line.startswith("STATE"))


def test_a_dead_rank_is_reported_and_nothing_is_left(tmp_path):
    worker = tmp_path / "dies.py"
    worker.write_text(DIES)
    start = time.monotonic()
    done = ranks(2, str(worker), timeout=120)
    assert time.monotonic() - start < 60  # rank 0 stopped, not left to the barrier's timeout
    assert done.returncode == 1
    assert "rank      : 1 (local_rank: 1)" in done.stderr
    assert "exitcode  : -9" in done.stderr and "Signal 9 (SIGKILL)" in done.stderr
    children = [int(line.split()[1]) for line in done.stdout.splitlines()
                if line.startswith("CHILD")]
    assert len(children) == 1
    time.sleep(0.5)
    if _alive(children[0]):
        os.kill(children[0], signal.SIGKILL)
        raise AssertionError("rank 0's child outlived the launch")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a killed process whose parent has not collected it yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
