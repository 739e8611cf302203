"""MoE benchmark: the DeepSeek-V3 debug model on 2 processes with EP = 1 vs EP = 2.

    python scripts/bench_moe.py                         # debugmodel, seq 256, 4 sequences/rank
    python scripts/bench_moe.py --seq-len 512 --steps 6

Both layouts run FSDP over the 2 processes on the same global batch; EP = 2 also splits each
MoE layer's routed experts between them (tokens travel by all-to-all). Per layout: tokens/s
(global tokens of a step / the fastest of ``--steps`` steps after ``--warmup``, each between
two barriers: the minimum is the figure least disturbed on a shared machine), the peak memory of
one step on rank 0 by MemTracker category (components/memory.py: parameters, gradients,
optimizer states, activations), and the share of the step's wall time spent in the EP
all-to-alls, from the torch profiler on one more step: the CPU time of the ops named
``all_to_all`` / ``alltoall`` (token and count exchanges, forward and backward) and of the
``wait_tensor`` calls that collect the functional all-to-alls' results (self time, so nested
ops count once; other functional collectives of the step, few without EP, land there too),
divided by the step's wall time, averaged over the two ranks. Waiting for the slower rank
inside an exchange counts as all-to-all time.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from torchtitan_like.tools.bench_runner import (
    launch_bench,
    report,
    timed_steps,
    worker_cases,
)

A2A_NAMES = ("all_to_all", "alltoall", "wait_tensor")
MiB = 2**20


def cases(args: argparse.Namespace, folder: str) -> dict[str, list[str]]:
    base = ["--model.name", "deepseek_v3", "--model.flavor", args.flavor,
            "--model.tokenizer_path", "", "--training.dataset", "cpython_docs",
            "--training.seq_len", str(args.seq_len),
            "--training.local_batch_size", str(args.local_batch),
            "--training.steps", "1000", "--training.mixed_precision_param", "float32",
            "--metrics.peak_tflops", "1", "--metrics.log_freq", "1000",
            "--metrics.enable_tensorboard", "false", "--validation.enable", "false",
            "--job.dump_folder", folder]
    return {f"EP {ep}": [*base, "--parallelism.expert_parallel_degree", str(ep)]
            for ep in (1, 2)}


def a2a_share(trainer, batches) -> float:
    """Fraction of one profiled step's wall time in the EP all-to-alls (module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.train_step(batches)
    wall = time.perf_counter() - start
    a2a_us = sum(e.self_cpu_time_total for e in prof.key_averages()  # self: no nesting
                 if any(n in e.key for n in A2A_NAMES))
    return a2a_us / 1e6 / wall


def worker(spec_file: str) -> None:
    """Inside torchrun: each case's Trainer, timed steps, one MemTracker step, one profiled."""
    import torch
    import torch.distributed as dist

    from torchtitan_like.tools.memory import measure_train_step

    for name, trainer, batches, spec in worker_cases(spec_file):
        wall = min(t for t, _ in timed_steps(trainer, batches, steps=spec["steps"],
                                             warmup=spec["warmup"]))
        memory = measure_train_step(trainer)
        share = torch.tensor(a2a_share(trainer, batches))
        dist.all_reduce(share)
        trainer.metrics.close()
        if dist.get_rank() == 0:
            tokens = trainer.grad_accumulation_steps * trainer.config.training.local_batch_size \
                * trainer.config.training.seq_len * trainer.parallel_dims.dp
            report(name, {"tokens_per_s": tokens / wall, "step_s": wall,
                          "a2a_share": share.item() / dist.get_world_size(),
                          "memory": {k: v / MiB for k, v in memory.items()}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flavor", default="debugmodel")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--local-batch", type=int, default=4, help="sequences per rank")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    with tempfile.TemporaryDirectory() as folder:
        results = launch_bench(__file__, 2, cases(args, folder), steps=args.steps,
                               warmup=args.warmup)
    print(f"\ndeepseek_v3 {args.flavor}, seq_len {args.seq_len}, {args.local_batch} sequences "
          "per rank, 2 processes (1 thread each), FSDP 2\n")
    print("| layout | tokens/s | step (ms) | all-to-all share of step | peak MiB (rank 0) | "
          "parameters | gradients | optimizer | activations + temp |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        m = r["memory"]
        print(f"| {name} | {r['tokens_per_s']:.0f} | {1000 * r['step_s']:.0f} | "
              f"{100 * r['a2a_share']:.1f}% | {m.get('Total', 0):.1f} | "
              f"{m.get('Parameter', 0):.1f} | {m.get('Gradient', 0):.1f} | "
              f"{m.get('Optstate', 0):.1f} | "
              f"{m.get('Activation', 0) + m.get('Temp', 0):.1f} |")


if __name__ == "__main__":
    main()
