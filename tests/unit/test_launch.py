"""The launcher's decisions (torchtitan_like/launch.py), without launching: which failure is
the cause, what the last line says, and that torch still builds its agent where the launcher
swaps in its own (tests/e2e/test_job_life.py runs it for real)."""

import inspect
import signal

from torch.distributed.launcher import api as launcher_api

from torchtitan_like.distributed.lifecycle import Failure, first_failure, read_failures
from torchtitan_like.exit_codes import FINAL, ExitCode
from torchtitan_like.launch import JobAgent, _job_agent, final_line


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
