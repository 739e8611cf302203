"""Side by side with TorchTitan: both trainers alternately on the identical job, median ratio.

    PEER_DIR=<torchtitan peer workspace> python scripts/bench_peer.py [--pairs 3] [--steps 12] \
        [--warmup 5] [--nproc 2] [--ours="--compile.enable true"] [--peer=--compile.enable]

The job (the throughput issue's debug job): Llama 3 debug model (dim 256, 6 layers, 16 heads,
vocab 2048), seq 512, local batch 4, FSDP over ``--nproc`` processes, bf16 parameters with fp32
reduction, no activation checkpointing, no compile; ``--ours`` / ``--peer`` add each trainer's
own flags (e.g. its best settings). The peer is TorchTitan run by ``$PEER_DIR/run_peer.sh`` (a
workspace that installs it and lets it run on a CPU); its figure is its per-step median
(``median step ... tokens/s``). Ours is the median of the per-step ``tokens_per_second`` in
metrics.jsonl after the warm-up steps. Runs alternate (ours, peer, ours, peer, ...) so that a
change in the machine's other load hits both alike; the printed ratio is the median of the
per-pair ratios, with the 1-minute load average beside each run. The bf16 GEMM peak is the
matmul measured in this process (all cores) at the start, the same one the trainer's MFU uses;
the share is (tokens/s over all ranks x FLOPs per token) / that peak.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from torchtitan_like.components.metrics import measure_cpu_tflops
from torchtitan_like.launch import torchrun_argv
from torchtitan_like.models.registry import model_spec_and_args
from torchtitan_like.validate import parse_args

OURS_JOB = ["--job.config_file", "train_configs/debug_model.toml",
            "--training.seq_len", "512", "--training.local_batch_size", "4",
            "--training.mixed_precision_param", "bfloat16",
            "--training.mixed_precision_reduce", "float32",
            "--activation_checkpoint.mode", "none", "--metrics.log_freq", "1",
            "--metrics.enable_tensorboard", "false", "--validation.enable", "false",
            "--checkpoint.enable", "false"]
PEER_MEDIAN = re.compile(r"median step ([\d.]+) s -> ([\d,]+) tokens/s")


def run_ours(args: argparse.Namespace, folder: Path) -> float:
    """Median per-device tokens/s of our trainer over the steps after the warm-up."""
    command = torchrun_argv(args.nproc, "-m", "torchtitan_like.train", *OURS_JOB,
                            "--training.steps", str(args.warmup + args.steps),
                            "--job.dump_folder", str(folder), *shlex.split(args.ours))
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["tokens_per_second"] for r in records
                             if "tokens_per_second" in r and r["step"] > args.warmup)


def run_peer(args: argparse.Namespace, folder: Path) -> float:
    """Median per-device tokens/s of TorchTitan (run_peer.sh reports all ranks together)."""
    env = {**os.environ, "NPROC": str(args.nproc), "SKIP": str(args.warmup),
           "OUTDIR": str(folder)}
    env.pop("PYTHONPATH", None)  # the peer has its own venv; keep our package out of it
    command = [f"{os.environ['PEER_DIR']}/run_peer.sh", str(args.warmup + args.steps),
               *shlex.split(args.peer), "activation-checkpoint:none"]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    match = PEER_MEDIAN.search(out)
    if match is None:
        raise SystemExit(f"no 'median step' line in the peer's output:\n{out[-2000:]}")
    return int(match.group(2).replace(",", "")) / args.nproc


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="alternating (ours, peer) pairs")
    parser.add_argument("--steps", type=int, default=12, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--nproc", type=int, default=2, help="processes (FSDP degree)")
    parser.add_argument("--ours", default="", help="extra flags for our trainer")
    parser.add_argument("--peer", default="", help="extra flags for TorchTitan")
    args = parser.parse_args(argv)
    if "PEER_DIR" not in os.environ:
        raise SystemExit("set PEER_DIR to the TorchTitan peer workspace (see --help)")
    peak = measure_cpu_tflops(torch.bfloat16)
    config = parse_args([*OURS_JOB, *shlex.split(args.ours)], args.nproc)
    flops_per_token = model_spec_and_args(config)[1].flops_per_token(config.training.seq_len)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            load_ours = os.getloadavg()[0]
            ours = run_ours(args, Path(tmp) / f"ours{pair}")
            load_peer = os.getloadavg()[0]
            peer = run_peer(args, Path(tmp) / f"peer{pair}")
            rows.append((ours, load_ours, peer, load_peer))
            print(f"pair {pair + 1}: ours {ours:,.0f} tokens/s/device (load {load_ours:.1f}), "
                  f"TorchTitan {peer:,.0f} (load {load_peer:.1f}), ratio {ours / peer:.3f}",
                  flush=True)
    ratio = statistics.median(o / p for o, _, p, _ in rows)
    ours = statistics.median(o for o, _, _, _ in rows)
    share = ours * args.nproc * flops_per_token / (peak * 1e12)
    print(f"\nmedian ratio ours/TorchTitan: {ratio:.3f} over {args.pairs} alternating pairs; "
          f"ours {ours:,.0f} tokens/s/device")
    print(f"bf16 GEMM peak measured now: {peak:.3f} TFLOP/s (all cores); ours reaches "
          f"{ours * args.nproc * flops_per_token / 1e12:.3f} TFLOP/s = {100 * share:.1f}% of it")
    print(f"command: {' '.join(shlex.quote(a) for a in [sys.argv[0], *argv])}")


if __name__ == "__main__":
    main(sys.argv[1:])
