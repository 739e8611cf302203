"""One job per dump folder, and one run's outputs per dump folder.

**The lock.** Rank 0 of a job holds ``{dump_folder}/job.lock`` from before the trainer is built
until the job ends; a second job on the folder stops with one line naming the holder (host,
pid, start, last heartbeat), before it touched anything. The lock is a kernel ``flock`` on the
file: released by the kernel however the holder ends (SIGKILL included), so a lock left by a
dead job on the same machine is taken over without asking. The file's content names the holder,
and a daemon thread refreshes its modification time every ``HEARTBEAT_S``: where the file
system's locks do not reach other hosts (a node-local ``flock``), a record of another host
refreshed within ``STALE_AFTER_S`` still counts as held, and a staler one as abandoned. A
restarted attempt of the same torchrun job (same run id, later attempt) takes over its previous
attempt's lock, which its agents already stopped. On a file system without ``flock`` the
content alone decides (a pid that is alive on this host, a fresh heartbeat elsewhere), without
protection against two jobs starting in the same instant.

**The run-folder rule.** A run that does not resume from a checkpoint of the folder (step 0:
no ``[checkpoint] enable``, no resumable checkpoint, ``train_state`` excluded) refuses to start
in a folder holding another run's ``metrics.jsonl``, TensorBoard events, or (when it does not
manage checkpoints itself) checkpoints: mixed outputs would make TensorBoard and metrics.jsonl
disagree and a later resume load another run's state. ``[job] overwrite = true`` moves them to
``{dump_folder}/archive/<time>/`` first (nothing is deleted). A resumed run continues the folder
as before (records and events past the checkpoint are dropped, components/metrics.py). The rule
runs before torchrun starts (preflight.py) and again in the job under the lock; a restarted
attempt of a job (torchrun's ``TORCHELASTIC_RESTART_COUNT > 0``) continues its own outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist

from torchtitan_like.components.checkpoint.folder import read_info, step_folders
from torchtitan_like.components.checkpoint.validate import CheckpointError
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.logging import logger

LOCK_FILE = "job.lock"
HEARTBEAT_S = 10.0
"""How often the holder refreshes the lock file's modification time."""
STALE_AFTER_S = 60.0
"""A lock record of another host not refreshed for this long belongs to a job that is gone."""
ARCHIVE = "archive"


class DumpFolderInUse(RuntimeError):
    """Another running job holds the dump folder; the message names it."""


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds (or held) a lock: the content of the lock file."""

    host: str
    pid: int
    started: float
    job: str = ""
    """torchrun's run id (TORCHELASTIC_RUN_ID), empty outside torchrun."""
    attempt: int = 0
    """torchrun's restart count of that job."""

    @classmethod
    def this_process(cls) -> Holder:
        return cls(socket.gethostname(), os.getpid(), time.time(),
                   os.environ.get("TORCHELASTIC_RUN_ID", ""),
                   int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))

    def describe(self, heartbeat_age_s: float) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return (f"pid {self.pid} on {self.host}, started {started}, last heartbeat "
                f"{heartbeat_age_s:.0f} s ago")

    def is_earlier_attempt_of(self, other: Holder) -> bool:
        return bool(self.job) and self.job == other.job and self.attempt < other.attempt


def _read_holder(fd: int) -> Holder | None:
    data = os.pread(fd, 4096, 0)
    try:
        return Holder(**json.loads(data)) if data.strip() else None
    except (ValueError, TypeError):  # a record cut short while being written: nobody's
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class FolderLock:
    """The exclusive hold of one job (its rank 0) on a dump folder (module docstring)."""

    def __init__(self, folder: Path, heartbeat_s: float = HEARTBEAT_S,
                 stale_after_s: float = STALE_AFTER_S):
        self.path = Path(folder) / LOCK_FILE
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"[job] dump_folder = {self.path.parent}: cannot create its lock "
                              f"file ({e.strerror})") from None

    def _try_flock(self, fd: int, tries: int = 5) -> bool | None:
        """True when locked, False when another process holds it, None when the file system
        has no flock. Retried briefly: a preflight check holds it for a moment only."""
        for attempt in range(tries):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if attempt + 1 < tries:
                    time.sleep(0.1)
            except OSError as e:
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    return None
                raise
        return False

    def _held_elsewhere(self, fd: int, locked: bool | None, taking: bool = True) -> str | None:
        """The live holder's description, or None when the folder is free (or abandoned; when
        ``taking`` it, say so)."""
        previous, me = _read_holder(fd), Holder.this_process()
        age = time.time() - os.fstat(fd).st_mtime
        if locked is False:
            return previous.describe(age) if previous else "a job that is starting"
        if previous is None or previous.is_earlier_attempt_of(me):
            return None
        if previous.host == me.host:
            alive = locked is None and _pid_alive(previous.pid)  # flock: the kernel decided
        else:
            alive = age < self.stale_after_s
        if alive:
            return previous.describe(age)
        if taking:
            logger.warning(f"{self.path}: taking over the lock of {previous.describe(age)}, "
                           "which ended without releasing it")
        return None

    def acquire(self) -> None:
        """Hold the folder, or raise DumpFolderInUse naming the job that does."""
        fd = self._open()
        locked = self._try_flock(fd)
        if locked is None:
            logger.warning(f"{self.path}: this file system has no flock; the lock relies on its "
                           "content (pid, host, heartbeat) alone")
        holder = self._held_elsewhere(fd, locked)
        if holder is not None:
            os.close(fd)  # also drops a flock that a node-local lock gave us
            raise DumpFolderInUse(f"{self.path.parent} is used by a running job: {holder} "
                                  f"(lock file {self.path}); wait for it to end, or choose "
                                  "another [job] dump_folder")
        record = json.dumps(dataclasses.asdict(Holder.this_process())).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        os.fsync(fd)
        self._fd = fd
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                        name="dump-folder-lock")
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with contextlib.suppress(OSError):
                os.utime(self._fd)

    def release(self) -> None:
        """Give the folder up: the record is emptied (free), then the kernel lock dropped."""
        if self._fd is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None

    def holder(self) -> str | None:
        """Who holds the folder now (for a check before starting), without keeping it."""
        if not self.path.is_file():
            return None
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError:
            return None
        try:
            return self._held_elsewhere(fd, self._try_flock(fd, tries=1), taking=False)
        finally:
            os.close(fd)  # releases the probe's flock


# ------------------------------------------------------------------------- the run-folder rule


def resumes(config: JobConfig) -> bool:
    """Whether the job continues a run of its folder: the checkpoint it would load (load_step,
    else the newest) holds a train state that is loaded. A checkpoint that cannot be read
    counts as one: loading reports it (exit 4) before anything is written."""
    c = config.checkpoint
    if not c.enable or "train_state" in c.exclude_from_loading:
        return False
    found = step_folders(Path(config.job.dump_folder) / c.folder)
    if c.load_step >= 0:
        found = {c.load_step: found[c.load_step]} if c.load_step in found else {}
        if not found:
            return True  # the checkpoint manager names what is missing
    for path in reversed(found.values()):
        try:
            if "train_state" in read_info(path)["states"]:
                return True
        except CheckpointError:
            return True
    return False


def earlier_outputs(config: JobConfig) -> list[Path]:
    """What another run left in the dump folder that a run starting at step 0 would mix with:
    metrics.jsonl, TensorBoard event files, and checkpoints unless this run manages them."""
    dump = Path(config.job.dump_folder)
    metrics = dump / "metrics.jsonl"
    found = [metrics] if metrics.is_file() and metrics.stat().st_size > 0 else []
    tb = dump / config.metrics.save_tb_folder
    found += sorted(tb.glob("events.out.tfevents.*")) if tb.is_dir() else []
    checkpoints = dump / config.checkpoint.folder
    if not config.checkpoint.enable and checkpoints.is_dir():
        found += sorted(p for p in checkpoints.glob("step-*") if p.is_dir())
    return found


def _summary(outputs: list[Path], config: JobConfig) -> str:
    dump = Path(config.job.dump_folder)
    events = sum(p.name.startswith("events.out.tfevents.") for p in outputs)
    checkpoints = sum(p.name.startswith("step-") for p in outputs)
    parts = (["metrics.jsonl"] if dump / "metrics.jsonl" in outputs else []) + \
        ([f"{events} TensorBoard event file(s)"] if events else []) + \
        ([f"{checkpoints} checkpoint(s)"] if checkpoints else [])
    return ", ".join(parts)


def _why_step_0(config: JobConfig) -> str:
    c = config.checkpoint
    if not c.enable:
        return "[checkpoint] enable = false"
    if "train_state" in c.exclude_from_loading:
        return "train_state is excluded from loading"
    return f"no resumable checkpoint in {Path(config.job.dump_folder) / c.folder}"


def is_restart() -> bool:
    """A restarted attempt of a torchrun job: the folder's outputs are its own."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0


def check_fresh_start(config: JobConfig) -> list[Path]:
    """The outputs a fresh start would archive; ConfigError when there are some and
    ``[job] overwrite`` is off. Nothing to check for a resumed run or a restarted attempt."""
    if is_restart() or resumes(config):
        return []
    outputs = earlier_outputs(config)
    if outputs and not config.job.overwrite:
        dump = config.job.dump_folder
        raise ConfigError(
            f"[job] dump_folder = {dump} holds another run's outputs ({_summary(outputs, config)}) "
            f"and this run starts at step 0 ({_why_step_0(config)}): set [job] overwrite = true "
            f"to move them to {dump}/{ARCHIVE}/ first, or choose another dump_folder")
    return outputs


def archive(config: JobConfig, outputs: list[Path]) -> Path:
    """Move ``outputs`` (and fault-injection markers) under ``{dump}/archive/<time>/``,
    keeping their paths relative to the dump folder."""
    dump = Path(config.job.dump_folder)
    target = dump / ARCHIVE / time.strftime("%Y%m%d-%H%M%S")
    while target.exists():
        target = target.with_name(target.name + "-1")
    for path in [*outputs, *dump.glob(".fault_injected_*")]:
        try:
            relative = path.relative_to(dump)
        except ValueError:  # a TensorBoard or checkpoint folder outside the dump folder
            relative = Path("outside", path.name)
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, target / relative)
    logger.info(f"[job] overwrite: moved the earlier run's {_summary(outputs, config)} to "
                f"{target}")
    return target


def check_before_start(config: JobConfig) -> None:
    """The checks run before torchrun starts (preflight.py): the folder is not held by a
    running job, and a fresh start does not mix with another run's outputs."""
    holder = FolderLock(Path(config.job.dump_folder)).holder()
    if holder is not None:
        raise DumpFolderInUse(f"{config.job.dump_folder} is used by a running job: {holder}; "
                              "wait for it to end, or choose another [job] dump_folder")
    check_fresh_start(config)


@contextlib.contextmanager
def claimed(config: JobConfig) -> Iterator[None]:
    """The job's hold on its dump folder, for the ``with`` block: rank 0 takes the lock and
    applies the run-folder rule (archiving under overwrite); every rank learns the outcome
    and raises the same error when the job may not run here."""
    lock, error = None, None
    if dist.get_rank() == 0:
        try:
            lock = FolderLock(Path(config.job.dump_folder))
            lock.acquire()
            outputs = check_fresh_start(config)
            if outputs:
                archive(config, outputs)
        except Exception as e:  # every rank stops with rank 0's error
            error = e
            if lock is not None:
                lock.release()
    verdict = [error]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise verdict[0]
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
