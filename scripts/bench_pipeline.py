"""Pipeline bubble benchmark: step time of every schedule at PP=2 beside the theory.

    python scripts/bench_pipeline.py                      # debugmodel, seq 256, 8 sequences
    python scripts/bench_pipeline.py --microbatches 4,8 --steps 8 --schedules 1F1B,ZBVZeroBubble

For each m, one process (no PP) trains the same step as m accumulated microbatches: T1, the
same work in the same pieces (the faster of a run before and one after the PP runs). Two
processes run each schedule on the local batch cut into m microbatches. Each process gets one
thread, so the ideal PP=2 step takes T1 / 2 and ``efficiency = T1 / (2 x T_pp)`` would equal
1 - bubble with free communication. Printed beside it: the 1F1B bubble (p - 1) / (m + p - 1);
the schedule's own (interleaved: (p - 1) / (v m + p - 1) with v = 2 stages per rank;
zero-bubble schedules: ~0 when forward, input-gradient and weight-gradient passes cost alike);
and the measured idle fraction, 1 - CPU time / wall time of the step averaged over the two
ranks (a rank waiting for its neighbour's activations or gradients burns no CPU). Step times
are the fastest of ``--steps`` steps after ``--warmup``, each between two barriers: the minimum
is the figure least disturbed by other processes on a shared machine.
"""

from __future__ import annotations

import argparse
import tempfile

from torchtitan_like.tools.bench_runner import (
    launch_bench,
    report,
    timed_steps,
    worker_cases,
)

SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
             "ZBVZeroBubble", "DualPipeV"]


def bubble(schedule: str, p: int, m: int) -> float:
    """The schedule's theoretical idle fraction (see distributed/pipeline.py)."""
    if schedule in ("GPipe", "1F1B"):
        return (p - 1) / (m + p - 1)
    if schedule in ("Interleaved1F1B", "LoopedBFS"):
        return (p - 1) / (2 * m + p - 1)
    return 0.0


def cases(args: argparse.Namespace, folder: str) -> tuple[list, dict[str, list[str]]]:
    """(rows to run at PP=2, as (schedule, m, overrides)), and the one-process baselines."""
    from torchtitan_like.config.errors import ConfigError
    from torchtitan_like.validate import parse_args

    base = ["--model.flavor", args.flavor, "--training.seq_len", str(args.seq_len),
            "--training.local_batch_size", str(args.local_batch), "--training.steps", "1000",
            "--training.mixed_precision_param", "float32", "--metrics.peak_tflops", "1",
            "--metrics.log_freq", "1000", "--job.dump_folder", folder]
    rows, ms = [], list(map(int, args.microbatches.split(",")))
    baselines = {f"baseline/{m}": [*base, "--training.global_batch_size", str(args.local_batch),
                                   "--training.local_batch_size", str(args.local_batch // m)]
                 for m in ms}
    for schedule in args.schedules.split(","):
        for m in ms:
            overrides = [*base, "--parallelism.pipeline_parallel_degree=2",
                         f"--parallelism.pipeline_parallel_schedule={schedule}",
                         "--parallelism.pipeline_parallel_microbatch_size="
                         f"{args.local_batch // m}"]
            try:
                parse_args(overrides, 2)
            except ConfigError as e:
                print(f"skip {schedule} m={m}: {e}")
                continue
            rows.append((schedule, m, overrides))
    return rows, baselines


def worker(spec_file: str) -> None:
    """Inside torchrun: build each case's Trainer and time its train_step on a fixed batch."""
    import torch
    import torch.distributed as dist

    for name, trainer, batches, spec in worker_cases(spec_file):
        steps = timed_steps(trainer, batches, steps=spec["steps"], warmup=spec["warmup"])
        trainer.metrics.close()
        wall, busy = min(steps)
        idle = torch.tensor(1 - busy / wall)
        dist.all_reduce(idle)
        if dist.get_rank() == 0:
            report(name, [wall, idle.item() / dist.get_world_size()])


def launch(nproc: int, named: dict[str, list[str]], args: argparse.Namespace
           ) -> dict[str, list[float]]:
    """[fastest step seconds, idle fraction] of each case, in one torchrun of ``nproc``."""
    return launch_bench(__file__, nproc, named, steps=args.steps, warmup=args.warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flavor", default="debugmodel")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--local-batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--microbatches", default="2,4,8", help="values of m, comma-separated")
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)

    with tempfile.TemporaryDirectory() as folder:
        rows, baseline = cases(args, folder)
        before = launch(1, baseline, args)
        timed = launch(2, {f"{s}/{m}": o for s, m, o in rows}, args)
        after = launch(1, baseline, args)  # the faster of two runs around the PP runs
        timed.update({k: min(before[k], after[k]) for k in baseline})
    print(f"\n{args.flavor}, seq_len {args.seq_len}, {args.local_batch} sequences per step, "
          "1 thread per process, PP=2\n")
    print("| schedule | stages/rank | m | 1F1B bubble (p-1)/(m+p-1) | schedule's bubble "
          "(theory) | step (ms) | 1 process (ms) | idle (measured) | efficiency T1/(2T) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for schedule, m, _ in rows:
        (t, idle), (t1, _) = timed[f"{schedule}/{m}"], timed[f"baseline/{m}"]
        v = 1 if schedule in ("GPipe", "1F1B") else 2
        print(f"| {schedule} | {v} | {m} | {bubble('1F1B', 2, m):.2f} | "
              f"{bubble(schedule, 2, m):.2f} | {1000 * t:.0f} | {1000 * t1:.0f} | {idle:.2f} | "
              f"{t1 / (2 * t):.2f} |")


if __name__ == "__main__":
    main()
