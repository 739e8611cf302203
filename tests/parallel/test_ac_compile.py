"""Activation checkpointing, torch.compile and profiling leave the FSDP=2 losses unchanged.

One launch of 2 processes trains the eager model and each toggle on the same seed and batch
(fp32, deterministic kernels). Checkpointing recomputes the same kernels on the same inputs,
so its losses equal the eager ones bitwise (class a; measured equal on the default and avx2
kernel levels). Compiled blocks run inductor's fused kernels, which may sum in another order:
FP32_PARITY_TOL (measured: bit-identical under deterministic mode) still catches any real
difference (a wrong op moves losses of ~6 by > 1e-3). Profiling only observes: bitwise.
Compilation is cached across test runs in the pytest temp root, one cache per ATen kernel
level (cold: ~20-30 s per process on 2 cores; warm: ~10 s): inductor picks its vector ISA
from ATEN_CPU_CAPABILITY but its FX graph cache does not key on it, and an avx2 run served
the default level's kernels trained on NaN losses.
"""

import json

import pytest
import torch
from harness import FP32_PARITY_TOL, assert_close, launch, losses

AC_TOL = 0.0  # class (a): the same kernels on the same inputs
COMPILE_TOL = FP32_PARITY_TOL  # class (b): fused kernels reorder fp32 sums

AC = {
    "ac_full": ["--activation_checkpoint.mode", "full"],
    "ac_selective_op": ["--activation_checkpoint.mode", "selective",
                        "--activation_checkpoint.selective_ac_option", "op"],
    "ac_selective_every2": ["--activation_checkpoint.mode", "selective",
                            "--activation_checkpoint.selective_ac_option", "2"],
}
# Compiled blocks under FSDP=2 x TP=2: tests/parallel/test_tensor_parallel.py (fsdp2_tp2_compile).
COMPILE = {
    "compile_fsdp": ["--compile.enable", "true"],
}
PROFILED = ["--profiling.enable_profiling", "true", "--profiling.profile_freq", "2",
            "--profiling.profiler_warmup", "0", "--profiling.profiler_active", "1"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("ac_compile")


@pytest.fixture(scope="module")
def runs(corpus, root, tmp_path_factory):
    level = torch.backends.cpu.get_cpu_capability().lower()
    cache_dir = tmp_path_factory.getbasetemp().parent / f"inductor_{level}"
    cache = ["--compile.cache_dir", str(cache_dir)]
    return launch(2, {
        "eager": [],
        **AC,
        **{name: [*overrides, *cache] for name, overrides in COMPILE.items()},
        "profiled": PROFILED,
    }, root, corpus)


@pytest.mark.parametrize("case", list(AC))
def test_activation_checkpointing_matches_eager(runs, case):
    assert_close(losses(runs[case]), losses(runs["eager"]), AC_TOL)


@pytest.mark.parametrize("case", list(COMPILE))
def test_compiled_blocks_match_eager(runs, case):
    assert_close(losses(runs[case]), losses(runs["eager"]), COMPILE_TOL)


def test_profiler_traces_every_n_steps_per_rank(runs, root):
    assert_close(losses(runs["profiled"]), losses(runs["eager"]), AC_TOL)
    traces = root / "profiled" / "profile_traces"
    assert sorted(p.name for p in traces.iterdir()) == ["iteration_2", "iteration_4"]
    for folder in traces.iterdir():
        for rank in (0, 1):
            trace = json.loads((folder / f"rank{rank}_trace.json").read_text())
            assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
