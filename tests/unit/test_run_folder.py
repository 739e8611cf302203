"""The dump folder's lock and the run-folder rule (components/run_folder.py), in one process:
a held folder is refused naming its holder, a lock whose holder is gone is taken over (dead
pid on this host, stale heartbeat on another, an earlier attempt of the same job), and a fresh
run refuses another run's outputs unless it archives them."""

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from torchtitan_like.components.checkpoint.validate import validate_checkpoint
from torchtitan_like.components.run_folder import LOCK_FILE, DumpFolderInUse, FolderLock
from torchtitan_like.components.run_outputs import archive, check_fresh_start, resumes
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


def test_a_resumed_run_continues_its_folder(tmp_path):
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


def checkpoint(folder, step, states=("model", "optimizer", "train_state")):
    path = folder / "checkpoint" / f"step-{step}"
    path.mkdir(parents=True)
    (path / "checkpoint.json").write_text(json.dumps({"step": step, "states": list(states)}))
    return path


def files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_overwrite_is_a_fresh_run_that_archives_the_other_run_whole(tmp_path):
    """With a resumable checkpoint there: no resume; metrics, config copy, TensorBoard events,
    every checkpoint folder entry and the markers move to one archive folder; a seed stays."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (tmp_path / "config.toml").write_text("[job]\n")
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.1.host").write_bytes(b"x")
    checkpoint(tmp_path, 0, ["model"])  # a seed: where the fresh run starts
    for step in (2, 4):
        checkpoint(tmp_path, step)
    (tmp_path / "checkpoint" / "step-6.partial").mkdir()
    (tmp_path / "checkpoint" / "step-4-hf").mkdir()
    (tmp_path / ".fault_injected_rank1_step3_step").write_text("x")
    before = files(tmp_path)
    ckpt = ["--checkpoint.enable=true", "--job.overwrite=true"]
    assert not resumes(config(tmp_path, *ckpt))
    target = archive(config(tmp_path, *ckpt), check_fresh_start(config(tmp_path, *ckpt)))
    assert sorted(p.name for p in (target / "checkpoint").iterdir()) == [
        "step-2", "step-4", "step-4-hf", "step-6.partial"]
    assert files(target) == [f for f in before if not f.startswith("checkpoint/step-0/")]
    assert files(tmp_path) == sorted(["checkpoint/step-0/checkpoint.json",
                                      *(f"archive/{target.name}/{f}" for f in files(target))])
    assert check_fresh_start(config(tmp_path, "--checkpoint.enable=true")) == []
    with pytest.raises(ConfigError, match=r"load_step = 2 resumes a run, but \[job\] overwrite"):
        validate_checkpoint(config(tmp_path, *ckpt, "--checkpoint.load_step=2"), 1)


def test_an_archive_is_complete_or_refused(tmp_path, monkeypatch):
    """An output that cannot be moved refuses the job before anything moves; a move that
    fails halfway is undone."""
    from torchtitan_like.components import run_outputs

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    checkpoint(tmp_path, 2)
    ckpt = config(tmp_path, "--checkpoint.enable=true", "--job.overwrite=true")
    before = files(tmp_path)
    monkeypatch.setattr(run_outputs.os, "access",
                        lambda path, mode: not str(path).endswith("checkpoint"))
    with pytest.raises(ConfigError, match=r"cannot archive .*checkpoint is not writable; move "
                                          r"them away yourself"):
        archive(ckpt, check_fresh_start(ckpt))
    assert files(tmp_path) == before
    monkeypatch.undo()
    renamed = []

    def rename(source, destination):
        if renamed and "/archive/" not in str(source):  # the second move; undoing works
            raise OSError(errno.EIO, "I/O error", str(source))
        renamed.append(source)
        os.replace(source, destination)

    monkeypatch.setattr(run_outputs.os, "rename", rename)
    with pytest.raises(ConfigError, match=r"archiving into .* failed \(an I/O error of the "
                                          r"device .*\); nothing was moved"):
        archive(ckpt, check_fresh_start(ckpt))
    assert files(tmp_path) == before and not (tmp_path / "archive").exists()


def test_a_restart_continues_the_outputs_its_job_claimed(tmp_path, monkeypatch):
    """The record says the previous attempt applied the run-folder rule: a restart of its job
    continues (no second archive, no fresh start); another job applies the rule."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-7")
    first = FolderLock(tmp_path)
    assert not first.acquire()
    first.rule_applied()
    first.release(keep_record=True)  # the attempt died of an unexpected error
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarted = FolderLock(tmp_path)
    assert restarted.acquire()  # continues its job's outputs
    assert json.loads((tmp_path / LOCK_FILE).read_text())["rule_applied"]
    restarted.release(keep_record=True)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-8")
    other = FolderLock(tmp_path)
    assert not other.acquire()
    other.release()


def test_a_job_that_died_leaves_its_record_for_the_warning(tmp_path, caplog):
    """Ended by an unexpected error: the record stays and the next job says it takes over;
    after a clean end (or a failure the job understood) the folder is simply free."""
    lock = FolderLock(tmp_path)
    lock.acquire()
    lock.release(keep_record=True)
    with caplog.at_level("WARNING", logger="torchtitan_like"):
        FolderLock(tmp_path).acquire()
    assert f"taking over the lock of pid {os.getpid()}" in caplog.text
    assert "which ended without releasing it (killed, or stopped by an unexpected error" \
        in caplog.text
