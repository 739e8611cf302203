"""Where a training step's time goes: torch.profiler over the real Trainer's steps, by category.

    torchrun --nproc_per_node=2 scripts/profile_step.py [--steps 3] [--warmup 2] \
        [--section.key=value ...]          (add --compile.enable true for the compiled step)

Defaults to the debug job of the throughput comparison (debug model: dim 256, 6 layers,
16 heads, vocab 2048; seq 512, local batch 4, bf16 parameters, fp32 reduction, FSDP over every
process). Trains ``warmup`` steps untimed (compilation happens there), then profiles ``steps``
steps of ``Trainer.train_step`` on rank 0 and prints a table: each operator's *self* CPU time
(time not spent in a child operator, so nothing is counted twice) summed into a category,
per step, and its share of the step's wall time. "outside operators" is wall time no
operator accounts for: Python, the autograd engine's bookkeeping, and waiting on the other
rank inside a collective when gloo's wait is not itself an operator. Inductor's generated C++
kernels are profiled as one event each (``cpp.enable_kernel_profile``) and fall under
"compiled fused kernels". Data loading is timed separately (``next(data)``), since the trainer
fetches before the step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

from torchtitan_like.distributed.utils import init_distributed
from torchtitan_like.logging import init_logger
from torchtitan_like.train import Trainer
from torchtitan_like.validate import parse_args

DEBUG_JOB = ["--job.config_file", "train_configs/debug_model.toml",
             "--training.seq_len", "512", "--training.local_batch_size", "4",
             "--training.mixed_precision_param", "bfloat16",
             "--training.mixed_precision_reduce", "float32"]

# First matching rule wins; patterns are substrings of the profiler's operator names.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("host syncs (.item)", ("aten::item", "_local_scalar_dense")),
    ("FSDP collectives + waits", ("c10d", "gloo", "nccl", "record_param_comms", "wait_tensor",
                                  "all_gather", "reduce_scatter", "allreduce", "all_reduce",
                                  "_allgather_base", "FSDP::")),
    ("attention (SDPA fwd+bwd)", ("scaled_dot_product", "flash_attention", "_efficient_attention")),
    ("GEMMs (mm/addmm/bmm/linear)", ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear",
                                     "aten::matmul", "mkldnn", "onednn")),
    ("loss over the vocabulary", ("log_softmax", "nll_loss", "cross_entropy")),
    ("optimizer step + grad-norm (foreach/fused)", ("_foreach", "_fused_adam", "adamw",
                                                    "Optimizer")),
    ("compiled fused kernels", ("cpp_fused", "graph_", "triton_", "kernel_cpp")),
    ("dtype casts + copies", ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone",
                              "aten::contiguous", "aten::cat", "split_with_sizes_copy",
                              "chunk_cat")),
    ("element-wise (norm, RoPE, SwiGLU, residual, embedding)", ("aten::",)),
]


def category(name: str) -> str:
    for label, patterns in CATEGORIES:
        if any(p in name for p in patterns):
            return label
    return "other (autograd nodes, Python ranges)"


def breakdown(prof: torch.profiler.profile, steps: int) -> dict[str, float]:
    """Seconds per step of each category's self CPU time, main thread and helpers alike."""
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        if event.self_cpu_time_total <= 0:
            continue
        label = category(event.key)
        totals[label] = totals.get(label, 0.0) + event.self_cpu_time_total / 1e6 / steps
    return totals


def profile(trainer: Trainer, warmup: int, steps: int) -> tuple[dict[str, float], float, float]:
    data = iter(trainer.dataloader)
    for _ in range(warmup):
        trainer.train_step([next(data)])
    fetch, walls = [], []
    torch._inductor.config.cpp.enable_kernel_profile = True  # no effect once compiled
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            start = time.perf_counter()
            batch = next(data)
            fetch.append(time.perf_counter() - start)
            start = time.perf_counter()
            trainer.train_step([batch])
            walls.append(time.perf_counter() - start)
    return breakdown(prof, steps), statistics.median(walls), statistics.median(fetch)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    args, overrides = parser.parse_known_args(argv)
    init_logger()
    device = init_distributed()
    torch._inductor.config.cpp.enable_kernel_profile = True  # before anything compiles
    config = parse_args([*DEBUG_JOB, *overrides, "--metrics.enable_tensorboard", "false",
                         "--validation.enable", "false", "--job.dump_folder",
                         "/tmp/ttl_profile_step"], dist.get_world_size())
    trainer = Trainer(config, device)
    totals, wall, fetch = profile(trainer, args.warmup, args.steps)
    if dist.get_rank() == 0:
        tokens = config.training.local_batch_size * config.training.seq_len
        print(f"\n{dist.get_world_size()} process(es), compile={config.compile.enable}; median "
              f"step {wall:.3f} s wall ({tokens / wall:,.0f} tokens/s per device); data "
              f"{fetch * 1e3:.1f} ms; self CPU time per step on rank 0, all its threads:\n")
        print("| category | s/step | % of wall |")
        print("|---|---|---|")
        for label, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
            print(f"| {label} | {seconds:.3f} | {100 * seconds / wall:.1f} |")
        accounted = sum(totals.values())
        print(f"| outside operators (wall - sum; negative: helper threads overlap) | "
              f"{wall - accounted:.3f} | {100 * (wall - accounted) / wall:.1f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
