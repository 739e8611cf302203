"""The machinery the training-step benchmarks under scripts/ share: a benchmark script runs
itself under torchrun with ``--worker SPEC`` (a JSON file of cases, steps and warmup); each
worker builds every case's real Trainer, times ``train_step`` on a fresh copy of one fixed
batch between barriers, and prints ``BENCH {json}`` lines that the launching process collects."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from torchtitan_like.launch import torchrun_argv, worker_env


def launch_bench(script: str, nproc: int, cases: dict[str, list[str]], *, steps: int,
                 warmup: int) -> dict[str, Any]:
    """Run ``script --worker`` in one torchrun of ``nproc`` processes (one thread each) over
    ``cases`` (name -> trainer overrides); the merged results its rank 0 printed."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"cases": cases, "steps": steps, "warmup": warmup}, f)
    proc = subprocess.run(torchrun_argv(nproc, script, "--worker", f.name), env=worker_env(),
                          capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"benchmark launch failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    lines = [line[6:] for line in proc.stdout.splitlines() if line.startswith("BENCH ")]
    return {k: v for line in lines for k, v in json.loads(line).items()}


def worker_cases(spec_file: str) -> Iterator[tuple[str, Any, list, dict[str, Any]]]:
    """Inside torchrun (one thread per process): (name, Trainer, one step's microbatches,
    spec) of each case in turn; the process group is destroyed after the last."""
    import torch
    import torch.distributed as dist

    from torchtitan_like.distributed.utils import init_distributed
    from torchtitan_like.train import Trainer
    from torchtitan_like.validate import parse_args

    with open(spec_file) as f:
        spec = json.load(f)
    torch.set_num_threads(1)
    device = init_distributed()
    for name, overrides in spec["cases"].items():
        trainer = Trainer(parse_args(overrides, dist.get_world_size()), device)
        data = iter(trainer.dataloader)
        yield name, trainer, [next(data) for _ in range(trainer.grad_accumulation_steps)], spec
    dist.destroy_process_group()


def timed_steps(trainer: Any, batches: list, *, steps: int,
                warmup: int) -> list[tuple[float, float]]:
    """(wall seconds, this process's CPU seconds) of each timed ``train_step``, every step
    between two barriers so that all ranks time the same step.

    Each step gets its own copy of ``batches`` (made before the clock starts): a step may
    consume its batch in place, as context parallelism shards inputs and labels along the
    sequence and leaves them sharded; reused, the next step would train on a quarter."""
    import torch.distributed as dist

    times = []
    for i in range(warmup + steps):
        fresh = copy.deepcopy(batches)
        dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        trainer.train_step(fresh)
        busy = time.process_time() - cpu
        dist.barrier()
        if i >= warmup:
            times.append((time.perf_counter() - start, busy))
    return times


def report(name: str, result: Any) -> None:
    """One case's result, for ``launch_bench`` (print it on rank 0 only)."""
    print("BENCH " + json.dumps({name: result}), flush=True)
