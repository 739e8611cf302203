"""The dump folder's lock and the run-folder rule (components/run_folder.py), in one process:
a held folder is refused naming its holder, a lock whose holder is gone is taken over (dead
pid on this host, stale heartbeat on another, an earlier attempt of the same job), and a fresh
run refuses another run's outputs unless it archives them."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from torchtitan_like.components.run_folder import (
    LOCK_FILE,
    DumpFolderInUse,
    FolderLock,
    archive,
    check_fresh_start,
    resumes,
)
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import build_job_config


def write_record(folder, host, pid, job="", attempt=0, age_s=0.0):
    """A lock file as a holder that is not this process left it (no kernel lock)."""
    path = folder / LOCK_FILE
    path.write_text(json.dumps({"host": host, "pid": pid, "started": time.time() - 100,
                                "job": job, "attempt": attempt}))
    os.utime(path, (time.time() - age_s, time.time() - age_s))


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_held_folder_is_refused_naming_the_holder(tmp_path):
    first = FolderLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(DumpFolderInUse, match=rf"pid {os.getpid()} on {socket.gethostname()}"
                                                  r", started .* last heartbeat \d+ s ago"):
            FolderLock(tmp_path).acquire()
        assert f"pid {os.getpid()}" in FolderLock(tmp_path).holder()
    finally:
        first.release()
    assert FolderLock(tmp_path).holder() is None
    second = FolderLock(tmp_path)
    second.acquire()  # released: free again
    second.release()


def test_the_kernel_lock_dies_with_its_holder(tmp_path):
    """A holder SIGKILLed: its flock is gone with it, its record stays and is taken over."""
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, json, os, socket, sys, time
fd = os.open({str(tmp_path / LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({{"host": socket.gethostname(), "pid": os.getpid(),
                          "started": time.time()}}).encode())
print("locked", flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(DumpFolderInUse, match=f"pid {holder.pid}"):
        FolderLock(tmp_path).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = FolderLock(tmp_path)
    lock.acquire()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released = an empty record


def test_records_without_a_kernel_lock(tmp_path, monkeypatch):
    """Another host's record counts while its heartbeat is fresh; a stale one, or one of an
    earlier attempt of this torchrun job, is taken over."""
    write_record(tmp_path, "other-host", 1234, age_s=5)
    with pytest.raises(DumpFolderInUse, match=r"pid 1234 on other-host.*heartbeat 5 s ago"):
        FolderLock(tmp_path, stale_after_s=60).acquire()
    write_record(tmp_path, "other-host", 1234, age_s=120)
    abandoned = FolderLock(tmp_path, stale_after_s=60)
    abandoned.acquire()  # taken over
    abandoned.release()
    write_record(tmp_path, "other-host", 1234, job="run-7", attempt=0, age_s=1)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarted = FolderLock(tmp_path, stale_after_s=60)
    restarted.acquire()  # the job's previous attempt, which its agents stopped
    restarted.release()


def test_a_dead_pid_on_this_host_holds_nothing_without_flock(tmp_path, monkeypatch):
    write_record(tmp_path, socket.gethostname(), dead_pid())
    lock = FolderLock(tmp_path)
    monkeypatch.setattr(lock, "_try_flock", lambda fd, tries=5: None)  # a file system without
    lock.acquire()
    lock.release()
    write_record(tmp_path, socket.gethostname(), os.getppid())  # alive
    with pytest.raises(DumpFolderInUse):
        lock.acquire()


def config(tmp_path, *overrides):
    return build_job_config([f"--job.dump_folder={tmp_path}", *overrides])


def test_a_fresh_run_refuses_another_runs_outputs_or_archives_them(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.1.host").write_bytes(b"x")
    (tmp_path / "checkpoint" / "step-4").mkdir(parents=True)
    (tmp_path / ".fault_injected_rank1_step3_step").write_text("x")
    with pytest.raises(ConfigError, match=r"holds another run's outputs \(metrics\.jsonl, 1 "
                       r"TensorBoard event file\(s\), 1 checkpoint\(s\)\) and this run starts "
                       r"at step 0 \(\[checkpoint\] enable = false\): set \[job\] overwrite"):
        check_fresh_start(config(tmp_path))
    outputs = check_fresh_start(config(tmp_path, "--job.overwrite=true"))
    target = archive(config(tmp_path), outputs)
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()) == [
        ".fault_injected_rank1_step3_step", "metrics.jsonl", "tb/events.out.tfevents.1.host"]
    assert (target / "checkpoint" / "step-4").is_dir()
    assert check_fresh_start(config(tmp_path)) == []  # the folder is the new run's now
    assert target.parent.name == "archive" and target.parent.parent == tmp_path


def test_a_resumed_run_or_a_restarted_attempt_continues_its_folder(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    step = tmp_path / "checkpoint" / "step-2"
    step.mkdir(parents=True)
    (step / "checkpoint.json").write_text(json.dumps({"step": 2, "states": ["model",
                                                                           "train_state"]}))
    ckpt = "--checkpoint.enable=true"
    assert resumes(config(tmp_path, ckpt)) and check_fresh_start(config(tmp_path, ckpt)) == []
    assert not resumes(config(tmp_path, ckpt, "--checkpoint.exclude_from_loading=train_state"))
    with pytest.raises(ConfigError, match="train_state is excluded from loading"):
        check_fresh_start(config(tmp_path, ckpt, "--checkpoint.exclude_from_loading=train_state"))
    (step / "checkpoint.json").write_text("{")  # unreadable: loading will say so (exit 4)
    assert resumes(config(tmp_path, ckpt))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert check_fresh_start(config(tmp_path)) == []
