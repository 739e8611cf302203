"""torchrun for jobs: ``python -m torchtitan_like.launch [torchrun options] -m MODULE [args]``.

run_train.sh and ttl-ablate run this instead of ``python -m torch.distributed.run``. It is
torchrun: the same options, parsed and run by torch's own ``torch.distributed.run``, its elastic
agent, rendezvous and restarts. The agent is torch's ``LocalElasticAgent`` with these
additions, and the launcher ends like a job:

- **No pointless restarts.** After a failure, the agent reads the ranks' failure records
  (distributed/lifecycle.py): when the cause is one that a restart meets again (exit codes in
  ``exit_codes.FINAL``: a config, a diverged run, a corrupt checkpoint or a full disk, bad data,
  a dump folder in use), the job is not restarted, whatever ``--max-restarts`` allows.
- **One line and the rank's own code.** The first failing rank's one-line error is printed
  last, whatever ``--local-ranks-filter`` (LOG_RANK) shows, and the launcher exits with that
  rank's exit code (signals and unexpected errors: 1), instead of torchrun's 1 after a
  ChildFailedError traceback.
- **Nothing left behind.** Stopping the workers (on a failure, a restart, or the launcher's
  own end) first sends SIGCONT to every worker's process group (a stopped worker cannot act on
  SIGTERM, so torchrun would wait out its 30 s shutdown timeout) and SIGKILL afterwards: torch
  signals only the workers still alive, so a SIGKILLed worker's DCP writer process would stay.
  (The agent frames the close method of the process context it started.)
- **Ctrl-C is one line.** The agent stops its workers with the SIGINT it got, after marking
  the job as stopping (a worker under it says nothing, nor one failing from then on:
  failure_report.py); torch's notices of the signal and of each worker it
  signals are left out, and the launcher prints one line and exits 130 (128 + SIGINT).
- **Its own words only.** torchrun's banners around a failure (``failed (exitcode: N)``,
  ``Sending process ... closing signal``) are left out: the last line says which rank failed,
  why and with which code. Like torchrun, it gives each worker ``OMP_NUM_THREADS=1`` when
  unset and a node runs several workers, without torchrun's banner saying so
  (docs/operating-a-run.md#how-a-job-ends).
- **Workers that die with it.** Workers learn the launcher's pid for their watchdog
  (``lifecycle.die_with_agent``) and meet in the agent's own rendezvous store, whose port the
  agent bound before they started (``distributed/utils.init_distributed``): no port is picked
  free and bound later, the start-up race of ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``.

The agent is swapped in for the one ``torch.distributed.launcher.api.launch_agent`` builds by
name, for the duration of the launch (tests/unit/test_launch.py checks that name is there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch.distributed.run as torchrun
from torch.distributed.elastic.agent.server.api import DEFAULT_ROLE, RunResult, WorkerGroup
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher import api as launcher_api

from torchtitan_like.distributed.lifecycle import (
    AGENT_PID_ENV,
    FAILURES_ENV,
    Failure,
    first_failure,
    mark_stopping,
    read_failures,
)
from torchtitan_like.exit_codes import FINAL, INTERRUPTED_LINE, ExitCode

TORCH_NOTICES = {
    "torch.distributed.elastic.agent.server.api": (
        "Received %s death signal, shutting down workers",),
    "torch.distributed.elastic.multiprocessing.api": (
        "Sending process %s closing signal %s",
        "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s"),
}
"""torch's logger -> the messages (their format strings) of the notices the launcher's own
line replaces: a signal's, a stopped worker's, a failed worker's (tests/unit/test_launch.py
checks torch still logs them so)."""


@dataclasses.dataclass
class Outcome:
    """What the agent learnt about the job's failures, for the launcher's last line."""

    records: Path
    failure: Failure | None = None


def _signal_groups(pgids: list[int], sig: signal.Signals) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def _unrecorded(result: RunResult, recorded: set[int]) -> list[Failure]:
    """The failures torch saw that left no record (a signal, a crash before the job's main)."""
    return [Failure(rank, f.exitcode, f"killed by {f.signal_name()}" if f.exitcode < 0
                    else f"exited with code {f.exitcode}", float(f.timestamp))
            for rank, f in result.failures.items() if rank not in recorded]


class JobAgent(LocalElasticAgent):
    """torch's local elastic agent, plus what the module docstring lists."""

    def __init__(self, *args: Any, outcome: Outcome, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._outcome = outcome

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if result.is_failed():
            spec = worker_group.spec
            attempt = spec.max_restarts - self._remaining_restarts
            records = read_failures(self._outcome.records, attempt)
            failure = first_failure(records + _unrecorded(result, {f.rank for f in records}))
            if failure is not None and failure.code in FINAL:
                self._remaining_restarts = 0
            self._outcome.failure = failure
            if failure is not None and self._remaining_restarts > 0:
                print(f"[launch] {describe(failure)}; restarting the job (restart "
                      f"{attempt + 1} of {spec.max_restarts})", file=sys.stderr, flush=True)
        return result

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> RunResult:
        try:
            return super()._invoke_run(role)
        except SignalException:  # torch stops the workers next: a failure now is the stop's
            mark_stopping(self._outcome.records)
            raise

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        pids = super()._start_workers(worker_group)
        self._pcontext.close = _continued_and_reaped(self._pcontext.close, list(pids.values()))
        return pids


def _continued_and_reaped(close: Callable[..., None], pgids: list[int]) -> Callable[..., None]:
    """torch's way of stopping the workers (on a failure, a restart, the agent's end),
    framed by SIGCONT to every worker's process group (a stopped worker cannot act on SIGTERM,
    and torch would wait 30 s for it) and SIGKILL after (torch signals only the workers still
    alive: a SIGKILLed worker's DCP writer process would stay)."""
    def stop(*args: Any, **kwargs: Any) -> None:
        _signal_groups(pgids, signal.SIGCONT)
        close(*args, **kwargs)
        _signal_groups(pgids, signal.SIGKILL)

    return stop


def describe(failure: Failure) -> str:
    """A failure in the words of a restart notice."""
    return f"rank {failure.rank} failed: {failure.line}"


def _not_a_torch_notice(record: logging.LogRecord) -> bool:
    return record.msg not in TORCH_NOTICES.get(record.name, ())


@contextlib.contextmanager
def _job_agent(outcome: Outcome) -> Iterator[None]:
    """``launch_agent`` builds ``JobAgent`` instead of torch's agent while this lasts, and
    torch's notices that the launcher's own line replaces are left out (TORCH_NOTICES)."""
    original = launcher_api.LocalElasticAgent

    def build(*args: Any, **kwargs: Any) -> JobAgent:
        return JobAgent(*args, outcome=outcome, **kwargs)

    launcher_api.LocalElasticAgent = build
    loggers = [logging.getLogger(name) for name in TORCH_NOTICES]
    for torch_logger in loggers:
        torch_logger.addFilter(_not_a_torch_notice)
    try:
        yield
    finally:
        launcher_api.LocalElasticAgent = original
        for torch_logger in loggers:
            torch_logger.removeFilter(_not_a_torch_notice)


def final_line(failure: Failure | None) -> tuple[str, int]:
    """The launcher's last line after a failed job, and its exit code."""
    if failure is None:
        return "the job failed (no rank left a record)", ExitCode.FAILED
    code = failure.code if failure.code in FINAL else ExitCode.FAILED
    hint = "; not restarted: a restart would fail the same way" if failure.code in FINAL else ""
    return f"{failure.line} (rank {failure.rank}, exit code {code}{hint})", code


TORCHRUN = "torch.distributed.run"
"""torch's own torchrun, for launches that need none of this module's additions (a benchmark's
or a measurement's workers, the tests' workers)."""


def torchrun_argv(nproc: int, *args: str, max_restarts: int | None = None,
                  launcher: str = TORCHRUN) -> list[str]:
    """The command line of a launch of ``nproc`` processes on this machine (``--standalone``
    rendezvous) from this interpreter: ``launcher`` (torch's torchrun, or this module,
    ``torchtitan_like.launch``, for a job that ends like one), ``--max-restarts`` when given,
    then ``args``: further launcher flags, then a script and its arguments or ``-m module
    ...``. Every tool, script and test launches through it (run_train.sh, which also spans
    nodes, spells the same in bash)."""
    restarts = [] if max_restarts is None else [f"--max-restarts={max_restarts}"]
    return [sys.executable, "-m", launcher, "--standalone", f"--nproc_per_node={nproc}",
            *restarts, *args]


def worker_env(**extra: str) -> dict[str, str]:
    """This process's environment for a launch whose workers run one thread each, quietly
    (warnings off, torchao's CUDA extensions not loaded), plus ``extra``."""
    return {**os.environ, "PYTHONWARNINGS": "ignore", "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1",
            "OMP_NUM_THREADS": "1", **extra}


def _one_thread_per_worker(args: Any) -> None:
    """What torchrun does with several workers on a node and OMP_NUM_THREADS unset (each
    worker one OpenMP thread), without its banner."""
    if "OMP_NUM_THREADS" not in os.environ and \
            torchrun.determine_local_world_size(args.nproc_per_node) > 1:
        os.environ["OMP_NUM_THREADS"] = "1"


def main(argv: list[str] | None = None) -> int:
    """Run torchrun's command line; return the job's exit code (exit_codes.py)."""
    args = torchrun.parse_args(sys.argv[1:] if argv is None else argv)
    _one_thread_per_worker(args)
    with tempfile.TemporaryDirectory(prefix="ttl-failures-") as records:
        os.environ[AGENT_PID_ENV] = str(os.getpid())
        os.environ[FAILURES_ENV] = records
        outcome = Outcome(Path(records))
        try:
            with _job_agent(outcome):
                torchrun.run(args)
        except ChildFailedError:
            line, code = final_line(outcome.failure)
            print(line, file=sys.stderr, flush=True)
            return code
        except SignalException as e:  # the agent stopped its workers first
            return _stopped(e.sigval)
        except KeyboardInterrupt:  # before the agent's handlers (starting, rendezvous)
            return _stopped(signal.SIGINT)
    return ExitCode.OK


def _stopped(sig: signal.Signals) -> int:
    """The launcher's one line after a signal stopped the job, and 128 + the signal."""
    line = INTERRUPTED_LINE if sig == signal.SIGINT else f"the job was stopped by {sig.name}"
    print(line, file=sys.stderr, flush=True)
    return 128 + sig


if __name__ == "__main__":
    raise SystemExit(main())
