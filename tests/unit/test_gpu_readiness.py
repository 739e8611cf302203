"""GPU readiness checks that run on a CPU: the no-silent-fallback check with a fake nvidia-smi,
the pinned stager's order after the optimizer step and its /dev/shm check, the tests' own CPU
pinning, and scripts/gpu_smoke.sh's syntax and CPU refusal."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from harness import ranks
from torch.distributed.checkpoint.staging import StagingOptions

from torchtitan_like.components.checkpoint import CheckpointError
from torchtitan_like.components.checkpoint.staging import StepOrderedStager, state_bytes
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed import gpu_check

ROOT = Path(__file__).resolve().parents[2]
FAKE_SMI = """#!/bin/sh
case "$1" in
  -L) echo "GPU 0: NVIDIA H100 (UUID: GPU-0)"; echo "GPU 1: NVIDIA H100 (UUID: GPU-1)";;
  *) echo "535.54.03"; echo "535.54.03";;
esac
"""


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch) -> dict[str, str]:
    """nvidia-smi on PATH lists two GPUs with driver 535.54.03; the GPUs are not hidden."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return dict(os.environ)


def test_tests_run_with_the_gpus_hidden():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""  # tests/conftest.py
    assert 'export CUDA_VISIBLE_DEVICES=""' in (ROOT / "run_tests.sh").read_text()


def test_listed_but_unusable_gpus_stop_the_start(fake_gpus):
    assert not torch.cuda.is_available()
    with pytest.raises(ConfigError) as error:
        gpu_check.require_usable_gpus()
    message = str(error.value)
    assert "2 GPU(s)" in message and "535.54.03" in message
    if torch.version.cuda is None:
        assert "CPU-only build" in message


def test_a_cuda_wheel_too_new_for_the_driver_is_named(fake_gpus, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    message = gpu_check.unusable_gpus_reason()
    assert "CUDA 13.0" in message and "driver 535.54.03" in message and "TORCH_INDEX_URL" in message


def test_no_gpu_or_gpus_hidden_on_purpose_is_fine(fake_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_check.unusable_gpus_reason() is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert gpu_check.unusable_gpus_reason() is None


def test_run_train_preflight_refuses_in_one_line(fake_gpus, tmp_path):
    env = {**fake_gpus, "PYTHON": sys.executable, "NPROC": "1"}
    done = subprocess.run(["bash", str(ROOT / "run_train.sh")], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("preflight: nvidia-smi lists 2 GPU(s)"), lines


class SlowStream:
    """A stand-in for the CUDA training stream: the optimizer step runs after ``save`` returned
    (as queued kernels do), ``delay_s`` late; ``mark`` plays the recorded event."""

    def __init__(self, weight: torch.Tensor, delay_s: float):
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._step, args=(weight, delay_s))

    def _step(self, weight: torch.Tensor, delay_s: float) -> None:
        time.sleep(delay_s)
        weight.add_(1.0)
        self.finished.set()

    def synchronize(self) -> None:
        self.finished.wait()


def _stager(mark, free_bytes=lambda: 1 << 40) -> StepOrderedStager:
    return StepOrderedStager(torch.device("cpu"), mark=mark, free_bytes=free_bytes,
                             options=StagingOptions(False, False, True, False))


@pytest.mark.parametrize("ordered", [True, False])
def test_pinned_staging_copies_the_weights_after_the_step(ordered):
    """Ordered: the copy waits for the (slow) step and holds its result. Unordered (the old
    behaviour, no event): the copy races ahead and captures the weights from before the step,
    which shows that this test detects the bug."""
    weight = torch.zeros(1000)
    stream = SlowStream(weight, delay_s=0.5)
    stager = _stager(lambda: stream if ordered else None)
    stream.thread.start()
    copy = stager.stage({"model": {"w": weight}}).result()["model"]["w"]
    stream.thread.join()
    stager.close()
    assert torch.equal(copy, torch.full((1000,), 1.0 if ordered else 0.0))


def test_pinned_staging_refuses_a_small_dev_shm(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    state = {"model": {"w": torch.zeros(1 << 20)}, "step": 3}  # 4 MiB a rank
    assert state_bytes(state) == 4 << 20
    stager = _stager(lambda: None, free_bytes=lambda: 16 << 20)  # 32 MiB needed on the node
    with pytest.raises(CheckpointError, match=r"/dev/shm: this node needs about 0.03 GiB"):
        stager.stage(state)
    stager.close()


def test_gpu_smoke_script_parses_and_refuses_a_cpu_machine(tmp_path):
    script = ROOT / "scripts" / "gpu_smoke.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {**os.environ, "PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "no usable GPU" in lines[0], lines


def test_gpu_smoke_dry_run_reports_every_row_past_failures_and_timeouts(tmp_path):
    """The whole script's control flow without a GPU (``--dry-run``: fake checks and figures):
    a failed check and one over its cap do not stop it, every row is printed, then the
    throughput table (with a failed and a timed-out job), and the archive is written. The
    planner really runs on each job's TOML. Nothing is timed."""
    env = {**os.environ, "PYTHON": sys.executable, "SMOKE_DIR": str(tmp_path / "logs"),
           "SMOKE_ARCHIVE": str(tmp_path / "out"), "SMOKE_DRY_FAIL": "sdpa-backends f8-tensorwise",
           "SMOKE_DRY_TIMEOUT": "blockwise-warm hf",
           "SMOKE_THROUGHPUT_JOBS": "compile,hf,f8-tensorwise,ckpt-stall"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = dict(line.split()[:2] for line in done.stdout.splitlines()
                if line and not line.startswith(("|", " ")) and len(line.split()) > 2
                and line.split()[1] in ("ok", "FAIL", "TIMEOUT", "skip"))
    assert rows["sdpa-backends"] == "FAIL" and rows["blockwise-warm"] == "TIMEOUT"
    assert rows["multi-gpu"] == "skip"
    assert {name for name, status in rows.items() if status == "ok"} >= {
        "preflight", "baseline", "full-stack", "resume", "float8-rowwise", "bf16-moments",
        "moe-low-precision", "blockwise-cold", "deepseek-recipe"}
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| job | status | tokens/s | MFU (measured peak) | MFU (datasheet)")
    jobs = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in table[1:]}
    assert jobs["compile"] == "ok" and jobs["hf"] == "TIMEOUT"
    assert jobs["f8-tensorwise"].startswith("FAIL") and "stalls the loop" in jobs["ckpt-stall"]
    assert "3 check(s) failed or timed out" in done.stdout  # two rows and the throughput script
    assert {p.name for p in (tmp_path / "out").iterdir()} == {
        "summary.txt", "throughput.md", "throughput.json", "smoke_logs.tar.gz"}


def test_float8_rowwise_is_admitted_only_where_its_kernels_exist():
    from torchtitan_like.components.float8 import check_cuda_capability
    from torchtitan_like.config.job_config import Float8

    rowwise = Float8(enable=True, recipe_name="rowwise")
    check_cuda_capability(rowwise, "H100", (9, 0))
    check_cuda_capability(rowwise, "L4", (8, 9))
    with pytest.raises(ConfigError, match=r"not 12\.0"):
        check_cuda_capability(rowwise, "RTX PRO 5000", (12, 0))
    check_cuda_capability(Float8(enable=True), "RTX PRO 5000", (12, 0))  # tensorwise runs


def test_float8_rowwise_with_compile_emulates_precision_casts():
    import torch._inductor.config as inductor

    from torchtitan_like.components.float8 import Float8Converter
    from torchtitan_like.config.job_config import Float8
    from torchtitan_like.distributed.parallel_dims import ParallelDims

    # inductor's own patch(), not monkeypatch: monkeypatch would restore the config entry by
    # deleting it (it is not in the module's __dict__), hiding it from every later compile.
    with inductor.patch(emulate_precision_casts=False):
        dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, world_size=1)
        Float8Converter(Float8(enable=True, recipe_name="tensorwise"), dims, "cpu", True)
        assert inductor.emulate_precision_casts is False
        Float8Converter(Float8(enable=True, recipe_name="rowwise"), dims, "cpu", True)
        assert inductor.emulate_precision_casts is True


def test_float8_checks_local_shapes_under_tp():
    from torch import nn

    from torchtitan_like.components.float8 import select_linears

    model = nn.Module()
    model.layers = nn.ModuleList([nn.Module()])
    model.layers[0].w = nn.Linear(48, 64, bias=False, device="meta")  # 48 = 16 x 3
    assert select_linears(model, []).converted == ["layers.0.w"]
    skipped = select_linears(model, [], tp=2).skipped["layers.0.w"]
    assert "x TP 2" in skipped  # 48 / 2 = 24 rows or columns: not a multiple of 16


TIMEOUT_WORKER = """
import torch, torch.distributed as dist
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.utils import PROCESS_GROUP_TIMEOUT_S, init_distributed
init_distributed()
meshes = ParallelDims.resolve(2, dp_shard=2).build_meshes("cpu")
groups = [m.get_group(d) for m in (meshes.dense, meshes.dp, meshes.dp_cp, meshes.fsdp)
          for d in range(m.ndim)]
seconds = {g._get_backend(torch.device("cpu")).options._timeout.total_seconds() for g in groups}
assert seconds == {PROCESS_GROUP_TIMEOUT_S}, seconds
dist.destroy_process_group()
"""


def test_mesh_subgroups_follow_the_world_timeout(tmp_path):
    """DeviceMesh makes its size-1 (and other) subgroups with gloo's 30-minute default; every
    group must wait no longer than the world group (one 2-process launch)."""
    worker = tmp_path / "worker.py"
    worker.write_text(TIMEOUT_WORKER)
    done = ranks(2, str(worker), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


# ---- version gates (components/versions.py), with monkeypatched versions ----


def _mxfp8_flags() -> list[str]:
    return ["--model.name", "deepseek_v3", "--model.flavor", "debugmodel",
            "--float8.moe_grouped_mm", "mxfp8", "--float8.emulate", "true"]


def test_mxfp8_on_a_torch_too_old_for_torchao_is_one_config_error(monkeypatch):
    """torch 2.11 without the DTensor strategies torchao probes for: refused at start-up (the
    H200 run failed at the model conversion with torchao's "install the latest nightly")."""
    from torchtitan_like.components import versions
    from torchtitan_like.validate import parse_args

    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    monkeypatch.setattr(versions, "_dtensor_scaled_mm_strategies", lambda: False)
    with pytest.raises(ConfigError) as error:
        parse_args(_mxfp8_flags(), world_size=1)
    assert str(error.value) == ('[float8] moe_grouped_mm = "mxfp8" needs torch >= 2.13 (this is '
                                "torch 2.11); install a newer torch or turn it off")
    monkeypatch.setattr(versions, "_dtensor_scaled_mm_strategies", lambda: True)  # a 2.12 with them
    parse_args(_mxfp8_flags(), world_size=1)


def test_torchao_older_than_the_code_is_named(monkeypatch):
    from torchtitan_like.components import versions
    from torchtitan_like.config.job_config import JobConfig

    config = JobConfig()
    config.float8.enable, config.float8.recipe_name = True, "blockwise"
    monkeypatch.setattr(versions, "torchao_version", lambda: (0, 17))
    with pytest.raises(ConfigError, match=r"blockwise\" needs torchao >= 0\.18 \(torchao here: "
                                          r"0\.17\)"):
        versions.check_versions(config, "cuda")
    versions.check_versions(config, "cpu")  # emulated on a CPU: plain torch ops
    monkeypatch.setattr(versions, "torchao_version", lambda: None)
    config.float8.enable, config.float8.moe_grouped_mm = False, "float8_rowwise"
    with pytest.raises(ConfigError, match="not installed"):
        versions.check_versions(config, "cuda")


def test_version_parsing_and_the_pure_rule():
    from torchtitan_like.components.versions import GATES, parse_version, refusal

    assert parse_version("2.13.0+cpu") == (2, 13)
    assert parse_version("2.12.0a0+git1234") == (2, 12)
    assert parse_version("0.18.0.dev20261101") == (0, 18)
    mxfp8 = GATES[0]
    assert refusal(mxfp8, (2, 13), False, (0, 18)) is None
    assert refusal(mxfp8, (2, 12), True, (0, 18)) is None
    assert "torch >= 2.13" in refusal(mxfp8, (2, 12), False, (0, 18))


# ---- no silent minutes (components/first_step.py, distributed/compile.py) ----


def test_slow_first_step_work_is_announced_with_its_caches(caplog, tmp_path, monkeypatch):
    import logging

    from torchtitan_like.components import first_step
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.compile import set_inductor_cache

    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING"):
        monkeypatch.delenv(name, raising=False)
    config = JobConfig()
    config.compile.cache_dir = str(tmp_path / "kernels")
    set_inductor_cache(config.compile, meshes=None)  # compile off: no process groups to tag
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "kernels")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "kernels" / "triton")
    assert os.environ["TRITON_CACHE_AUTOTUNING"] == "1"

    assert first_step.first_step_work(config, "cuda") == []
    config.float8.enable, config.float8.recipe_name = True, "blockwise"
    config.float8.moe_grouped_mm = "float8_rowwise"
    config.optimizer.implementation, config.optimizer.state_dtype = "fused", "bfloat16"
    monkeypatch.setattr(first_step, "torch_version", lambda: (2, 11))
    work = first_step.first_step_work(config, "cuda", ep=2)
    assert len(work) == 3 and "45 configurations" in work[0] and "expert parallelism" in work[1]
    assert "bf16-moment AdamW step compiles" in work[2]
    assert first_step.first_step_work(config, "cpu") == [work[2]]  # emulated: nothing to tune
    with caplog.at_level(logging.INFO, logger="torchtitan_like"):
        first_step.announce_first_step(config, "cuda")
    lines = [r.message for r in caplog.records]
    assert [line.startswith("before step 1: ") for line in lines] == [True] * 3 + [False]
    assert f"Triton {tmp_path / 'kernels' / 'triton'}" in lines[-1]
