"""Profiler schedule (traces every N steps, per rank, complete periods only) and its checks."""

import json

import pytest
import torch

from torchtitan_like.components.profiling import Profiler, validate
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Profiling


def run_steps(profiler: Profiler, first: int, last: int) -> None:
    a = torch.randn(32, 32)
    for step in range(first, last + 1):
        a @ a
        profiler.step(step)
    profiler.close()


def test_traces_every_profile_freq_steps(tmp_path):
    config = Profiling(enable_profiling=True, profile_freq=3, profiler_warmup=1,
                       profiler_active=1)
    run_steps(Profiler(config, str(tmp_path), rank=1, device=torch.device("cpu")), 1, 8)
    traces = tmp_path / "profile_traces"
    assert sorted(p.name for p in traces.iterdir()) == ["iteration_3", "iteration_6"]
    trace = json.loads((traces / "iteration_3" / "rank1_trace.json").read_text())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])


def test_resumed_run_keeps_the_step_numbers(tmp_path):
    config = Profiling(enable_profiling=True, profile_freq=4, profiler_warmup=0,
                       profiler_active=2)
    profiler = Profiler(config, str(tmp_path), rank=0, device=torch.device("cpu"), start_step=5)
    run_steps(profiler, 6, 12)
    assert sorted(p.name for p in (tmp_path / "profile_traces").iterdir()) == [
        "iteration_12", "iteration_8"]


def test_disabled_profiler_writes_nothing(tmp_path):
    run_steps(Profiler(Profiling(), str(tmp_path), 0, torch.device("cpu")), 1, 4)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("config, message", [
    (Profiling(enable_profiling=True, profile_freq=0), "profile_freq = 0"),
    (Profiling(enable_profiling=True, profiler_active=0), "profiler_active must be >= 1"),
    (Profiling(enable_profiling=True, profile_freq=3, profiler_warmup=3), "must fit in"),
    (Profiling(enable_memory_snapshot=True), "records the CUDA caching allocator"),
])
def test_bad_settings_are_refused(config, message):
    with pytest.raises(ConfigError, match=message):
        validate(config, "cpu")


def test_memory_snapshot_is_accepted_on_cuda():
    validate(Profiling(enable_memory_snapshot=True), "cuda")
