"""The launcher's decisions (torchtitan_like/launch.py), without launching: which failure is
the cause, what the last line says, and that torch still builds its agent where the launcher
swaps in its own (tests/e2e/test_job_life.py runs it for real)."""

import inspect
import logging
import signal

from torch.distributed.launcher import api as launcher_api

from torchtitan_like.distributed.lifecycle import Failure, first_failure, read_failures
from torchtitan_like.exit_codes import FINAL, ExitCode
from torchtitan_like.launch import (
    JobAgent,
    _job_agent,
    _one_thread_per_worker,
    final_line,
)


def test_torch_builds_its_agent_by_the_name_the_launcher_replaces():
    assert "LocalElasticAgent(" in inspect.getsource(launcher_api.launch_agent)
    original = launcher_api.LocalElasticAgent
    with _job_agent(outcome=None):
        assert launcher_api.LocalElasticAgent is not original
    assert launcher_api.LocalElasticAgent is original
    assert issubclass(JobAgent, original)


def test_the_cause_is_an_understood_error_then_a_kill_then_an_unexpected_error():
    lost_peer = Failure(0, 1, "RuntimeError: Connection closed by peer", 10.0)
    killed = Failure(1, -signal.SIGKILL, "killed by SIGKILL", 11.0)  # recorded later by torch
    stopped = Failure(2, -signal.SIGTERM, "killed by SIGTERM", 9.0)  # the agent stopping it
    data = Failure(3, ExitCode.DATA, "data error: x.jsonl:3: not JSON", 12.0)
    assert first_failure([lost_peer, killed, stopped, data]) is data
    assert first_failure([lost_peer, killed, stopped]) is killed
    assert first_failure([lost_peer, stopped]) is lost_peer
    assert first_failure([]) is None


def test_the_last_line_is_the_rank_s_own_and_final_codes_are_not_restarted():
    line, code = final_line(Failure(1, ExitCode.CHECKPOINT, "checkpoint error: step-4 is "
                                                            "corrupt", 0.0))
    assert (line, code) == ("checkpoint error: step-4 is corrupt (rank 1, exit code 4; not "
                            "restarted: a restart would fail the same way)", 4)
    line, code = final_line(Failure(0, -9, "killed by SIGKILL", 0.0))
    assert (line, code) == ("killed by SIGKILL (rank 0, exit code 1)", 1)
    assert final_line(None)[1] == 1
    assert ExitCode.FAILED not in FINAL and ExitCode.OK not in FINAL


def test_failure_records_of_one_attempt(tmp_path, monkeypatch):
    from torchtitan_like.distributed import lifecycle

    monkeypatch.setenv(lifecycle.FAILURES_ENV, str(tmp_path))
    for rank, attempt in ((0, "0"), (1, "1")):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
        lifecycle.record_failure(ExitCode.CONFIG, f"config error: rank {rank}")
    (tmp_path / "attempt1-rank2.json").write_text('{"rank": 2, "co')  # cut short by a kill
    assert [f.line for f in read_failures(tmp_path, 1)] == ["config error: rank 1"]
    assert [f.rank for f in read_failures(tmp_path, 0)] == [0]


def test_torch_logs_the_notices_the_launcher_leaves_out():
    """The launcher filters these records by their format string (Ctrl-C is one line, a
    failure the launcher's last line)."""
    import importlib

    from torchtitan_like.launch import TORCH_NOTICES

    for module, messages in TORCH_NOTICES.items():
        source = inspect.getsource(importlib.import_module(module))
        for message in messages:
            assert f'"{message}"' in source, message


def test_ctrl_c_is_recognised_wherever_it_lands_and_a_stopping_job_fails_quietly(
        tmp_path, monkeypatch):
    """A KeyboardInterrupt raised, wrapped by a checkpoint save (DCP keeps each rank's error in
    CheckpointException.failures), or the context of a later error: exit code 130, the line
    recorded for the launcher and not logged by a worker under it; so is any failure once the
    launcher marked the job as stopping (a peer interrupted first)."""
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    from torchtitan_like import failure_report
    from torchtitan_like.distributed import lifecycle
    from torchtitan_like.exit_codes import INTERRUPTED_LINE

    def raised(error: BaseException) -> BaseException:
        try:
            raise error
        except BaseException as e:
            return e

    ctrl_c = raised(KeyboardInterrupt())
    try:
        raise RuntimeError("save failed") from CheckpointException(
            "x", {1: _wrap_exception(ctrl_c)})
    except RuntimeError as e:
        wrapped = e
    try:
        try:
            raise ctrl_c
        except KeyboardInterrupt:
            raise RuntimeError("in a finally") from None
    except RuntimeError as e:
        context = e
    assert all(map(failure_report.interrupted, (ctrl_c, wrapped, context)))
    lost_peer = RuntimeError("Connection closed by peer")
    assert not failure_report.interrupted(lost_peer)

    monkeypatch.setenv(lifecycle.FAILURES_ENV, str(tmp_path))
    monkeypatch.setenv(lifecycle.AGENT_PID_ENV, "1")
    monkeypatch.setenv("RANK", "1")
    logged = []
    monkeypatch.setattr(failure_report.logger, "error", lambda *a, **k: logged.append(a))
    assert failure_report.report_failure(wrapped) == ExitCode.INTERRUPTED == 130
    assert logged == [] and [f.line for f in read_failures(tmp_path, 0)] == [INTERRUPTED_LINE]
    assert failure_report.report_failure(lost_peer) == ExitCode.FAILED and logged  # a cause
    logged.clear()
    lifecycle.mark_stopping(tmp_path)
    assert failure_report.report_failure(lost_peer) == ExitCode.INTERRUPTED and logged == []


def test_torchruns_banners_are_left_out_and_omp_threads_set_without_one(monkeypatch, caplog):
    """The launcher's last line replaces torch's failure banners; its workers get one OpenMP
    thread each (torchrun's default for several workers), without torchrun's banner."""
    import argparse
    import os

    elastic = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    with caplog.at_level(logging.INFO, logger=elastic.name), _job_agent(outcome=None):
        elastic.error("failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s", 4, 0, 1,
                      "python")
        elastic.warning("Sending process %s closing signal %s", 1, "SIGTERM")
        elastic.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]
    monkeypatch.setenv("OMP_NUM_THREADS", "0")  # restored (or removed) afterwards
    monkeypatch.delenv("OMP_NUM_THREADS")
    _one_thread_per_worker(argparse.Namespace(nproc_per_node="1"))
    assert "OMP_NUM_THREADS" not in os.environ
    _one_thread_per_worker(argparse.Namespace(nproc_per_node="2"))
    assert os.environ["OMP_NUM_THREADS"] == "1"
