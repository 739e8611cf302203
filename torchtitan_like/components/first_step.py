"""No silent minutes: the work a job does before its first step ends, announced in the log.

Some switches make step 1 compile or autotune kernels, which takes from seconds to minutes
during which nothing else is logged. Before the first step the trainer logs one line per such
piece of work (what it is, roughly how long, whether a cache shortens a rerun) and where the
caches live (distributed/compile.py, ``set_inductor_cache``). The figures are what was seen,
not promises: an H200 (docs/gpu.md) and this project's CPUs.

- ``[compile] enable``: inductor compiles the blocks (one graph for all of them) and the loss.
- ``[float8] recipe_name = "blockwise"`` on a GPU: torchao's Triton quantization and GEMM
  kernels autotune up to 45 configurations for every kernel and shape; the debug model's step
  1 took 132 s on an H200 the first time. Triton stores the choices
  (``TRITON_CACHE_AUTOTUNING``), so a rerun with the same cache skips the benchmarking.
- ``[float8] moe_grouped_mm`` on a GPU: torchao's grouped-GEMM Triton kernels autotune likewise
  (24-36 configurations per kernel and shape); their weight-gradient kernels are keyed on the
  token count, which the experts keep fixed per step (models/moe/experts.py) except under
  expert parallelism, where each new count of received tokens autotunes again.
- ``[optimizer] implementation = "fused"`` with bf16 moments where the compiled step runs:
  one small graph (seconds; components/bf16_moments.py).
"""

from __future__ import annotations

from torchtitan_like.components import bf16_moments
from torchtitan_like.components.versions import torch_version
from torchtitan_like.config.derived import float8_enabled, optimizer_state_dtype
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.compile import kernel_cache_dirs
from torchtitan_like.logging import logger


def first_step_work(config: JobConfig, device_type: str, ep: int = 1) -> list[str]:
    """What this job compiles or autotunes before its first step ends (pure: tests pass any
    device), one sentence each."""
    work = []
    f8, cached = config.float8, "a rerun with the same cache reads it back"
    if config.compile.enable:
        parts = " and ".join(config.compile.components)
        work.append(f"torch.compile of the {parts}: inductor compiles on step 1 (tens of "
                    f"seconds to a few minutes, by model and machine); {cached}")
    if (float8_enabled(config) and f8.recipe_name == "blockwise" and device_type == "cuda"
            and not f8.emulate):
        work.append("blockwise FP8: torchao's Triton kernels autotune up to 45 configurations "
                    "per kernel and shape on step 1 (132 s for the debug model on an H200, "
                    f"first time); {cached}")
    if f8.moe_grouped_mm != "none" and device_type == "cuda" and not f8.emulate:
        again = (" and again for each new count of tokens expert parallelism delivers"
                 if ep > 1 else "")
        work.append(f"moe_grouped_mm = \"{f8.moe_grouped_mm}\": torchao's grouped-GEMM Triton "
                    f"kernels autotune 24-36 configurations per kernel and shape on step 1{again}"
                    f" (minutes the first time); {cached}")
    o = config.optimizer
    if (optimizer_state_dtype(o) == "bfloat16"
            and o.implementation in ("fused", "fused_opt_states_bf16")
            and bf16_moments.fused_path(device_type, torch_version()) == "compiled"):
        work.append("the fused bf16-moment AdamW step compiles at the first optimizer step "
                    f"(one graph, seconds); {cached}")
    return work


def announce_first_step(config: JobConfig, device_type: str, ep: int = 1) -> None:
    """Log ``first_step_work`` and the cache folders, if there is any such work."""
    work = first_step_work(config, device_type, ep)
    if not work:
        return
    inductor, triton = kernel_cache_dirs()
    for line in work:
        logger.info(f"before step 1: {line}")
    logger.info(f"kernel caches: inductor {inductor}, Triton {triton} (keep them between runs; "
                "[compile] cache_dir chooses the folder)")
