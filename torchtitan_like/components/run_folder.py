"""One job per dump folder: the lock, and the run-folder rule applied under it.

**The lock.** Rank 0 of a job holds ``{dump_folder}/job.lock`` from before the trainer is built
until the job ends; a second job on the folder stops with one line naming the holder (host,
pid, start, last heartbeat), before it touched anything. The lock is a kernel ``flock`` on the
file: released by the kernel however the holder ends (SIGKILL included). The file's content
names the holder, and a daemon thread refreshes its modification time every ``HEARTBEAT_S``:
where the file system's locks do not reach other hosts (a node-local ``flock``), a record of
another host refreshed within ``STALE_AFTER_S`` still counts as held, and a staler one as
abandoned. On a file system without ``flock`` the content alone decides (a pid that is alive
on this host, a fresh heartbeat elsewhere), without protection against two jobs starting in
the same instant.

**How a holder ends.** A job that ends normally, or with a failure it understood (one line and
its exit code), empties the record: the folder is free. A job killed, or stopped by an
unexpected error, leaves its record, and the next job takes the folder over with a warning
naming it (the lock is free, but that job's outputs may be cut short). A restarted attempt of
the same torchrun job (same run id, later attempt) takes over its previous attempt's record
silently, and continues its own outputs when that attempt had applied the run-folder rule
(``rule_applied`` in the record): its archive is not made twice, and a restart of an
``overwrite`` job resumes its own checkpoints, never the archived run's.

**The run-folder rule** (components/run_outputs.py) runs before torchrun starts (preflight.py)
and again in the job, under the lock. Every write of the lock record is framed by
``storage.writing``: a full disk there is one ``storage error:`` line (exit 4).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch.distributed as dist

from torchtitan_like.components.run_outputs import archive, check_fresh_start
from torchtitan_like.components.storage import writing
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.logging import logger

LOCK_FILE = "job.lock"
HEARTBEAT_S = 10.0
"""How often the holder refreshes the lock file's modification time."""
STALE_AFTER_S = 60.0
"""A lock record of another host not refreshed for this long belongs to a job that is gone."""


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
    rule_applied: bool = False
    """The holder applied the run-folder rule (a restart of its job continues its outputs)."""

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
                           "which ended without releasing it (killed, or stopped by an "
                           "unexpected error: its outputs may be cut short)")
        return None

    def acquire(self) -> bool:
        """Hold the folder, or raise DumpFolderInUse naming the job that does. True when the
        previous holder was an earlier attempt of this job that applied the run-folder rule
        (this attempt continues its outputs)."""
        fd = self._open()
        locked = self._try_flock(fd)
        if locked is None:
            logger.warning(f"{self.path}: this file system has no flock; the lock relies on its "
                           "content (pid, host, heartbeat) alone")
        previous = _read_holder(fd)
        holder = self._held_elsewhere(fd, locked)
        if holder is not None:
            os.close(fd)  # also drops a flock that a node-local lock gave us
            raise DumpFolderInUse(f"{self.path.parent} is used by a running job: {holder} "
                                  f"(lock file {self.path}); wait for it to end, or choose "
                                  "another [job] dump_folder")
        self._fd = fd
        me = Holder.this_process()
        continues = (previous is not None and previous.is_earlier_attempt_of(me)
                     and previous.rule_applied)
        try:
            self._write_record(dataclasses.replace(me, rule_applied=continues))
        except BaseException:
            self.release(keep_record=True)
            raise
        self._start_heartbeat()
        return continues

    def _write_record(self, holder: Holder) -> None:
        with writing("the dump folder's lock record", self.path):
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, json.dumps(dataclasses.asdict(holder)).encode(), 0)
            os.fsync(self._fd)

    def rule_applied(self) -> None:
        """Record that this holder applied the run-folder rule (for a restart of its job)."""
        record = _read_holder(self._fd) or Holder.this_process()
        self._write_record(dataclasses.replace(record, rule_applied=True))

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                        name="dump-folder-lock")
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with contextlib.suppress(OSError):
                os.utime(self._fd)

    def release(self, keep_record: bool = False) -> None:
        """Give the folder up: the record is emptied (free) unless ``keep_record`` (a job
        stopped by an unexpected error: the next holder says it took it over), then the kernel
        lock dropped."""
        if self._fd is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if not keep_record:
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


def check_before_start(config: JobConfig) -> None:
    """The checks run before torchrun starts (preflight.py): the folder is not held by a
    running job, and a fresh start does not mix with another run's outputs."""
    holder = FolderLock(Path(config.job.dump_folder)).holder()
    if holder is not None:
        raise DumpFolderInUse(f"{config.job.dump_folder} is used by a running job: {holder}; "
                              "wait for it to end, or choose another [job] dump_folder")
    check_fresh_start(config)


@contextlib.contextmanager
def claimed(config: JobConfig,
            ended_cleanly: Callable[[BaseException], bool] = lambda e: False) -> Iterator[None]:
    """The job's hold on its dump folder, for the ``with`` block: rank 0 takes the lock and
    applies the run-folder rule (archiving under overwrite) unless it continues an earlier
    attempt of its job that did; every rank learns the outcome and raises the same error when
    the job may not run here. A ``with`` block that ends with an exception for which
    ``ended_cleanly`` is false leaves the lock record (module docstring)."""
    lock, error = None, None
    if dist.get_rank() == 0:
        try:
            lock = FolderLock(Path(config.job.dump_folder))
            if not lock.acquire():
                outputs = check_fresh_start(config)
                if outputs:
                    archive(config, outputs)
                lock.rule_applied()
        except Exception as e:  # every rank stops with rank 0's error
            error = e
            if lock is not None:
                lock.release()
    verdict = [error]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise verdict[0]
    keep_record = False
    try:
        yield
    except BaseException as e:
        keep_record = not ended_cleanly(e)
        raise
    finally:
        if lock is not None:
            lock.release(keep_record)
