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
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed.run as torchrun
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher import api as launcher_api

from torchtitan_like.distributed.lifecycle import (
    AGENT_PID_ENV,
    FAILURES_ENV,
    Failure,
    first_failure,
    read_failures,
)
from torchtitan_like.exit_codes import FINAL, ExitCode


@dataclasses.dataclass
class Outcome:
    """What the agent learnt about the job's failures, for the launcher's last line."""

    records: Path
    failure: Failure | None = None
    restarts_left: int = 0


def _signal_groups(pgids: list[int], sig: signal.Signals) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def _unrecorded(result: RunResult) -> Failure | None:
    """A failure that left no record (a signal, a crash before the job's main): torch's."""
    if not result.failures:
        return None
    rank, failure = min(result.failures.items(), key=lambda item: item[1].timestamp)
    line = (f"killed by {failure.signal_name()}" if failure.exitcode < 0
            else f"exited with code {failure.exitcode}")
    return Failure(rank, failure.exitcode, line, float(failure.timestamp))


class JobAgent(LocalElasticAgent):
    """torch's local elastic agent, plus what the module docstring lists."""

    def __init__(self, *args: Any, outcome: Outcome, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._outcome = outcome

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if result.is_failed():
            attempt = worker_group.spec.max_restarts - self._remaining_restarts
            failure = (first_failure(read_failures(self._outcome.records, attempt))
                       or _unrecorded(result))
            if failure is not None and failure.code in FINAL:
                self._remaining_restarts = 0
            self._outcome.failure, self._outcome.restarts_left = failure, self._remaining_restarts
            if failure is not None and self._remaining_restarts > 0:
                print(f"[launch] {describe(failure)}; restarting the job "
                      f"({self._remaining_restarts} restart(s) left)", file=sys.stderr,
                      flush=True)
        return result

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        pgids = [w.id for w in self._worker_group.workers if isinstance(w.id, int)]
        _signal_groups(pgids, signal.SIGCONT)
        super()._shutdown(death_sig, timeout)
        _signal_groups(pgids, signal.SIGKILL)


def describe(failure: Failure) -> str:
    return f"rank {failure.rank} failed: {failure.line}"


@contextlib.contextmanager
def _job_agent(outcome: Outcome) -> Iterator[None]:
    """``launch_agent`` builds ``JobAgent`` instead of torch's agent while this lasts."""
    original = launcher_api.LocalElasticAgent

    def build(*args: Any, **kwargs: Any) -> JobAgent:
        return JobAgent(*args, outcome=outcome, **kwargs)

    launcher_api.LocalElasticAgent = build
    try:
        yield
    finally:
        launcher_api.LocalElasticAgent = original


def final_line(failure: Failure | None) -> tuple[str, int]:
    """The launcher's last line after a failed job, and its exit code."""
    if failure is None:
        return "the job failed (no rank left a record)", ExitCode.FAILED
    code = failure.code if failure.code in FINAL else ExitCode.FAILED
    hint = "; not restarted: a restart would fail the same way" if failure.code in FINAL else ""
    return f"{failure.line} (rank {failure.rank}, exit code {code}{hint})", code


def main(argv: list[str] | None = None) -> int:
    args = torchrun.parse_args(sys.argv[1:] if argv is None else argv)
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
            print(f"the job was stopped by {e.sigval.name}", file=sys.stderr, flush=True)
            return 128 + e.sigval
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
