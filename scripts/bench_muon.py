"""Muon's step-time overhead over AdamW: the llama3 100M flavor on 1 and 2 processes.

    python scripts/bench_muon.py                   # 100M, seq 256, 1 sequence per rank
    python scripts/bench_muon.py --flavor debugmodel --steps 5

Per process count and optimizer (AdamW; Muon with torch's bf16 Newton-Schulz; Muon with the
fp32 iteration), the real Trainer (fp32 weights, FSDP over the processes) times ``--steps``
training steps after ``--warmup`` (each between two barriers; the fastest is the figure least
disturbed on a shared machine), then ``--steps`` optimizer steps alone on the last step's
gradients. Printed: the training step, the optimizer step, Muon's extra time over AdamW's
optimizer step, and the matrices each rank orthogonalized per step (about 1/N of the model's
on each of N ranks: components/optim/newton_schulz.py). On gloo the owners' gathers are
DTensor's all-gather fallback (no all-to-all on CPU), counted in the optimizer step.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from torchtitan_like.tools.bench_runner import launch_bench, report, timed_steps, worker_cases

OPTIMIZERS = {
    "AdamW": [],
    "Muon (bf16 NS)": ["--optimizer.name", "Muon"],
    "Muon (fp32 NS)": ["--optimizer.name", "Muon", "--muon.ns_dtype", "float32"],
}


def cases(args: argparse.Namespace, folder: str) -> dict[str, list[str]]:
    base = ["--model.name", "llama3", "--model.flavor", args.flavor,
            "--model.tokenizer_path", "", "--training.dataset", "cpython_docs",
            "--training.seq_len", str(args.seq_len), "--training.local_batch_size", "1",
            "--training.steps", "1000", "--training.mixed_precision_param", "float32",
            "--metrics.peak_tflops", "1", "--metrics.log_freq", "1000",
            "--metrics.enable_tensorboard", "false", "--validation.enable", "false",
            "--job.dump_folder", folder]
    return {name: [*base, *flags] for name, flags in OPTIMIZERS.items()}


def optimizer_steps(trainer, steps: int) -> float:
    """The fastest of ``steps`` optimizer steps alone, each between two barriers."""
    import torch.distributed as dist

    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        trainer.optimizers.step()
        dist.barrier()
        times.append(time.perf_counter() - start)
    return min(times)


def worker(spec_file: str) -> None:
    import torch.distributed as dist

    for name, trainer, batches, spec in worker_cases(spec_file):
        steps = spec["steps"]
        step = min(t for t, _ in timed_steps(trainer, batches, steps=steps,
                                            warmup=spec["warmup"]))
        before = [getattr(o, "orthogonalized", 0) for o in trainer.optimizers.optimizers]
        optimizer = optimizer_steps(trainer, steps)
        after = [getattr(o, "orthogonalized", 0) for o in trainer.optimizers.optimizers]
        trainer.metrics.close()
        counts = [None] * dist.get_world_size()
        dist.all_gather_object(counts, (sum(after) - sum(before)) / steps)
        if dist.get_rank() == 0:
            report(name, {"step_s": step, "optimizer_s": optimizer, "matrices": counts})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flavor", default="100M")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    print(f"llama3 {args.flavor}, seq_len {args.seq_len}, 1 sequence per rank, fp32, FSDP over "
          f"the processes (1 thread each); command: python scripts/bench_muon.py --flavor "
          f"{args.flavor} --seq-len {args.seq_len} --steps {args.steps} --warmup {args.warmup}")
    print("\n| processes | optimizer | training step (s) | optimizer step (s) | "
          "over AdamW's optimizer step (s) | matrices iterated per rank and step |")
    print("|---|---|---|---|---|---|")
    for nproc in args.nproc:
        with tempfile.TemporaryDirectory() as folder:
            results = launch_bench(__file__, nproc, cases(args, folder), steps=args.steps,
                                   warmup=args.warmup)
        adamw = results["AdamW"]["optimizer_s"]
        for name, r in results.items():
            counts = "-" if not any(r["matrices"]) else \
                " / ".join(f"{c:g}" for c in r["matrices"])
            print(f"| {nproc} | {name} | {r['step_s']:.2f} | {r['optimizer_s']:.3f} | "
                  f"{r['optimizer_s'] - adamw:+.3f} | {counts} |")


if __name__ == "__main__":
    main()
