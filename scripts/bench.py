"""Measure what each toggle does: tokens/s, MFU and peak memory of the real Trainer.

    python scripts/bench.py [--steps 4] [--warmup 2] [--variant NAME=OVERRIDES ...] \
        [--job.config_file train_configs/debug_model.toml] [--section.key=value ...]
    torchrun --nproc_per_node=2 scripts/bench.py ...     (the same, on 2 processes)

Every variant trains ``warmup + steps`` steps of the config (plus the common overrides, plus its
own space-separated overrides); throughput and MFU are the Trainer's own metrics averaged over
the steps after the warm-up (compilation happens there). Peak memory: on CUDA
``torch.cuda.max_memory_allocated`` over the run, the largest over ranks; on CPU, where the
allocator keeps no statistics, one more training step measured with MemTracker
(tools/memory.py), i.e. parameters, gradients, optimizer states, activations and
backward scratch at the step's peak; MemTracker is a dispatch mode, which compiled code does
not run under, so compiled variants have no CPU memory figure. Without ``--variant``: eager,
full and op-level activation checkpointing, compile, compile + float8.
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from torchtitan_like.components.memory import TOTAL
from torchtitan_like.components.metrics import peak_tflops
from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.distributed.utils import init_distributed
from torchtitan_like.logging import init_logger
from torchtitan_like.tools.memory import measure_train_step
from torchtitan_like.train import Trainer
from torchtitan_like.validate import parse_args

DEFAULT_CONFIG = "train_configs/debug_model.toml"
DEFAULT_VARIANTS = {
    "eager": "",
    "ac full": "--activation_checkpoint.mode full",
    "ac selective op": "--activation_checkpoint.mode selective",
    "compile": "--compile.enable true",
    "compile + float8": "--compile.enable true --float8.enable true",
}
GiB = 2**30


def run_variant(argv: list[str], device: torch.device, folder: Path) -> dict:
    config = parse_args([*argv, "--job.dump_folder", str(folder)], dist.get_world_size())
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer = Trainer(config, device)
    trainer.train()
    if device.type == "cuda":
        peak = float(torch.cuda.max_memory_allocated(device))
    elif config.compile.enable:
        peak = float("nan")
    else:
        peak = float(measure_train_step(trainer)[TOTAL])
    del trainer
    gc.collect()
    peak_tensor = torch.tensor(peak, device=device)
    dist.all_reduce(peak_tensor, op=dist.ReduceOp.MAX)
    if dist.get_rank() != 0:
        return {}
    metrics = (folder / "metrics.jsonl").read_text().splitlines()
    return {"records": [json.loads(line) for line in metrics],
            "memory_gib": peak_tensor.item() / GiB}


def summarise(records: list[dict], warmup: int) -> dict[str, float]:
    timed = [r for r in records if "tokens_per_second" in r and r["step"] > warmup]
    mean = lambda key: sum(r[key] for r in timed) / len(timed)  # noqa: E731
    return {
        "tokens_per_second": mean("tokens_per_second"),
        "tflops": mean("tflops"),
        "mfu": mean("mfu") if all(r["mfu"] is not None for r in timed) else float("nan"),
        "loss": timed[-1]["loss"],
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDES",
                        help='e.g. --variant "ac full=--activation_checkpoint.mode full"')
    args, overrides = parser.parse_known_args(argv)
    if not any(a.startswith("--job.config_file") for a in overrides):
        overrides = ["--job.config_file", DEFAULT_CONFIG, *overrides]
    variants = dict(v.split("=", 1) for v in args.variant) if args.variant else DEFAULT_VARIANTS
    common = [*overrides, "--training.steps", str(args.warmup + args.steps),
              "--metrics.log_freq", "1", "--metrics.enable_tensorboard", "false",
              "--validation.enable", "false"]

    init_logger()
    device = init_distributed()
    # One MFU denominator for all variants (on a CPU it is measured, so measure it once).
    base = parse_args(common, dist.get_world_size())
    peak = peak_tflops(device, base.metrics.peak_tflops,
                       DTYPES[base.training.mixed_precision_param])
    if peak:
        common += ["--metrics.peak_tflops", str(peak)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, extra) in enumerate(variants.items()):
            result = run_variant([*common, *shlex.split(extra)], device, Path(tmp) / str(i))
            if dist.get_rank() == 0:
                rows.append((name, extra, {**summarise(result["records"], args.warmup),
                                           "memory_gib": result["memory_gib"]}))
    if dist.get_rank() == 0:
        where = ("CUDA max_memory_allocated" if device.type == "cuda" else
                 "MemTracker step peak (nan: compiled, MemTracker cannot see inside)")
        print(f"\n{dist.get_world_size()} process(es) on {device.type}; mean of {args.steps} "
              f"steps after {args.warmup} warm-up; tokens/s per device; MFU of "
              f"{f'{peak:.3g} TFLOP/s' if peak else 'n/a'}; memory: {where}\n")
        print("| variant | overrides | tokens/s | TFLOP/s | MFU % | peak memory GiB | loss |")
        print("|---|---|---|---|---|---|---|")
        for name, extra, r in rows:
            print(f"| {name} | `{extra or '-'}` | {r['tokens_per_second']:,.0f} | "
                  f"{r['tflops']:.3f} | {r['mfu']:.2f} | {r['memory_gib']:.3f} | "
                  f"{r['loss']:.4f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
