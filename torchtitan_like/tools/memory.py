"""Measure the peak tensor memory of training steps, to validate the planner.

``measure_train_step`` tracks one real step of a Trainer (every model part, gradient
accumulation or a pipeline schedule, the optimizer) with MemTracker (components/memory.py): what
a layout costs per rank; scripts/validate_plan_memory.py, scripts/bench.py and tests/parallel/
test_plan_memory.py use it. As a torchrun entry point it builds the trainer of each case of a JSON
file ({name: [overrides]}) in turn, in one process group, and writes each rank's peak, by
category, to a JSON file:

    python -m torch.distributed.run --standalone --nproc_per_node=2 \
        -m torchtitan_like.tools.memory cases.json measured.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from torchtitan_like.components.memory import by_category
from torchtitan_like.distributed.lifecycle import exit_process
from torchtitan_like.launch import torchrun_argv, worker_env
from torchtitan_like.train import Trainer


def measure_train_step(trainer: Trainer) -> dict[str, int]:
    """Peak bytes of one steady-state training step on this rank, by MemTracker category
    (Parameter, Gradient, Optstate, Activation, Temp, Buffer, Other) plus ``Total``.

    A first, untracked step creates the optimizer states (AdamW allocates them lazily), so the
    measured step is what every later step costs. Under PP it follows the schedule's every
    forward and backward and counts the stages' receive buffers; the zero-bubble schedules
    (split backward through ``autograd.grad``) are beyond MemTracker's module hooks.
    """
    data = iter(trainer.dataloader)

    def step() -> None:
        trainer.train_step([next(data) for _ in range(trainer.grad_accumulation_steps)])

    step()
    tracker = MemTracker()
    tracker.track_external(*trainer.model_parts, *trainer.optimizers.optimizers)
    if trainer.pipeline is not None:  # allocated in the first step, before the tracker
        tracker.track_external(*trainer.pipeline.receive_buffers())
    # MemTracker refuses a second forward of a root module in one tracked region (gradient
    # accumulation; every microbatch of a pipeline schedule) unless that module's statistics
    # are dropped first. Only the root's: under PP another stage on this rank may still run
    # the backward of an earlier microbatch, which looks up its own modules' entries. The
    # step's peak, all we read, is kept apart. A global hook registered before the tracker's
    # own runs before it.
    roots = {id(part) for part in trainer.model_parts}

    def reset(module: nn.Module, _args: object) -> None:
        if id(module) in roots:
            tracker.memory_tracking.pop(module, None)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(reset)
    try:
        with tracker:
            step()
    finally:
        handle.remove()
    return by_category(tracker.get_tracker_snapshot("peak"), trainer.device)


def main(argv: list[str]) -> None:
    from torchtitan_like.distributed.utils import init_distributed
    from torchtitan_like.validate import parse_args

    cases_file, out_file = argv
    with open(cases_file) as f:
        cases: dict[str, list[str]] = json.load(f)
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    device = init_distributed()
    results = {}
    for name, overrides in cases.items():
        peak = measure_train_step(Trainer(parse_args(overrides, world_size), device))
        gathered: list[dict[str, int] | None] = [None] * world_size
        dist.all_gather_object(gathered, peak)
        results[name] = gathered
    if dist.get_rank() == 0:
        with open(out_file, "w") as f:
            json.dump(results, f, indent=1)
    exit_process(0)  # a torchrun worker: no gloo exit race


def measure_cases(cases: dict[str, tuple[int, list[str]]],
                  workdir: Path) -> dict[str, list[int]]:
    """Every rank's peak bytes (index = global rank) for each case {name: (processes,
    overrides)}; one torchrun launch per process count. Ranks differ under PP (each holds its
    own stage). The workers run the package this interpreter imports (no checkout needed).
    Raises RuntimeError with the end of the launch's output on failure."""
    measured: dict[str, list[int]] = {}
    for nproc in sorted({n for n, _ in cases.values()}):
        batch = {name: [*overrides, "--job.dump_folder", str(workdir / f"case{i}")]
                 for i, (name, (n, overrides)) in enumerate(cases.items()) if n == nproc}
        cases_file, out = workdir / f"cases_{nproc}.json", workdir / f"measured_{nproc}.json"
        cases_file.write_text(json.dumps(batch))
        proc = subprocess.run(torchrun_argv(nproc, "-m", "torchtitan_like.tools.memory",
                                            str(cases_file), str(out)),
                              env=worker_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"measuring {list(batch)} on {nproc} processes failed:\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
        measured.update({name: [rank["Total"] for rank in ranks]
                         for name, ranks in json.loads(out.read_text()).items()})
    return measured


if __name__ == "__main__":
    main(sys.argv[1:])
