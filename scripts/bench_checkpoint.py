"""How long does a checkpoint save block the training loop? sync vs async vs async_with_pinned_mem.

    python scripts/bench_checkpoint.py                 # 2 processes (FSDP=2), ~190 MB checkpoint
    python scripts/bench_checkpoint.py --nproc 1 --dim 768

Trains a Llama 3 of ``--dim`` x ``--layers`` (default 15.7M parameters: 189 MB of fp32 weights
and Adam states) with the real trainer, saving every ``--interval`` steps, once per async_mode,
plus once without checkpoints. "blocked" is the time the loop waited for a save: its share in
``save()`` (taking the state dict; the blocking copy for async), the wait for the background copy
before the next optimizer step (async_with_pinned_mem), and any wait for the previous save.
"complete" is the time until the save was written and published. The last save of a run is
synchronous in every mode and is left out. The loop time shows what background writes cost the
training steps on this machine (they share its cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from torchtitan_like.launch import torchrun_argv

MODES = ("none", "disabled", "async", "async_with_pinned_mem")


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from torchtitan_like.distributed.utils import init_distributed
    from torchtitan_like.logging import init_logger
    from torchtitan_like.models.llama3 import llama3_flavors
    from torchtitan_like.models.registry import get_model_spec, register_model
    from torchtitan_like.train import Trainer
    from torchtitan_like.validate import parse_args

    init_logger()
    llama3 = get_model_spec("llama3")
    shape = dataclasses.replace(llama3_flavors["debugmodel"], dim=args.dim, n_layers=args.layers,
                                n_heads=args.dim // 64)
    register_model(dataclasses.replace(llama3, name="llama3_bench", flavors={"bench": shape}))
    device = init_distributed()
    results = {}
    for mode in MODES:
        folder = Path(args.out) / mode
        overrides = [
            "--model.name", "llama3_bench", "--model.flavor", "bench",
            "--training.seq_len", "128", "--training.local_batch_size", "2",
            "--training.steps", str(args.steps), "--training.mixed_precision_param", "float32",
            "--metrics.log_freq", "1000", "--metrics.peak_tflops", "1",
            "--job.dump_folder", str(folder),
        ]
        if mode != "none":
            overrides += ["--checkpoint.enable", "true", "--checkpoint.async_mode", mode,
                          "--checkpoint.interval", str(args.interval)]
        trainer = Trainer(parse_args(overrides, dist.get_world_size()), device)
        start = time.perf_counter()
        trainer.train()
        loop = time.perf_counter() - start
        records = trainer.checkpointer.records[:-1]  # the last save is synchronous by design
        size = sum(f.stat().st_size for f in (folder / "checkpoint").glob(f"step-{args.steps}/*")
                   ) if mode != "none" else 0
        results[mode] = {
            "loop_s": loop,
            "saves": len(records),
            "blocked_s": [r.blocked_s for r in records],
            "complete_s": [r.written_s for r in records],
            "checkpoint_mb": size / 1e6,
        }
        dist.barrier()
    if dist.get_rank() == 0:
        Path(args.out, "results.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def report(results: dict, args: argparse.Namespace) -> None:
    size = results["disabled"]["checkpoint_mb"]
    print(f"\ncheckpoint of {size:.0f} MB, {args.nproc} process(es), {args.steps} steps, a save "
          f"every {args.interval} (the last, synchronous, not counted)")
    print("per save, in seconds: median (max)")
    print(f"{'async_mode':<24}{'saves':>6}{'blocked':>16}{'complete':>16}{'loop s':>9}")

    def median_max(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} ({max(values):.3f})" if values else "-"

    for mode, r in results.items():
        label = "no checkpoints" if mode == "none" else mode
        print(f"{label:<24}{r['saves']:>6}{median_max(r['blocked_s']):>16}"
              f"{median_max(r['complete_s']):>16}{r['loop_s']:>9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--interval", type=int, default=3)
    parser.add_argument("--out", default="")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    out = Path(tempfile.mkdtemp(prefix="bench_checkpoint_"))
    env = {**os.environ, "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1", "PYTHONWARNINGS": "ignore"}
    cmd = torchrun_argv(args.nproc, "--local-ranks-filter=0", __file__, "--worker",
                        "--out", str(out),
                        *(f"--{k}={getattr(args, k)}" for k in ("dim", "layers", "steps",
                                                                "interval")))
    try:
        subprocess.run(cmd, env=env, check=True)
        report(json.loads((out / "results.json").read_text()), args)
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
