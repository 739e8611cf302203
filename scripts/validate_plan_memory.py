"""Planner vs measurement: peak memory per rank of the debug model on this CPU.

For each case (a layout / activation-checkpointing mode on top of
train_configs/debug_model.toml), the planner predicts the peak tensor memory of rank 0 from the
config alone, and the real trainer measures it with MemTracker over one steady-state step
(torchtitan_like/tools/memory.py; one torchrun launch per process count). Prints a markdown
table with the error of each case.

    python scripts/validate_plan_memory.py            # about 5 minutes on 2 cores
    python scripts/validate_plan_memory.py --only FSDP
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchtitan_like.config.manager import build_job_config
from torchtitan_like.tools.memory import measure_cases
from torchtitan_like.tools.planner import CPU, predict_peak

ROOT = Path(__file__).resolve().parents[1]

COMMON = ["--job.config_file", str(ROOT / "train_configs/debug_model.toml"),
          "--metrics.enable_tensorboard", "false", "--validation.enable", "false"]
SELECTIVE = ["--activation_checkpoint.mode", "selective",
             "--activation_checkpoint.selective_ac_option"]
FULL = ["--activation_checkpoint.mode", "full"]
FSDP_BATCH = ["--training.local_batch_size", "4"]

# name -> (processes, overrides on top of COMMON); the debug config: batch 8 x 256, fp32.
CASES: dict[str, tuple[int, list[str]]] = {
    "1 proc, AC none": (1, []),
    "1 proc, AC op": (1, [*SELECTIVE, "op"]),
    "1 proc, AC full": (1, FULL),
    "1 proc, AC every 2": (1, [*SELECTIVE, "2"]),
    "1 proc, tiny (GQA), seq 512, AC every 3": (
        1, ["--model.flavor", "tiny", "--training.seq_len", "512", *SELECTIVE, "3"]),
    "FSDP 2, AC none": (2, FSDP_BATCH),
    "FSDP 2, AC full": (2, [*FSDP_BATCH, *FULL]),
    "FSDP 2, no reshard": (2, [*FSDP_BATCH, "--parallelism.fsdp_reshard_after_forward",
                               "never"]),
    "FSDP 2, bf16 params, AC op": (2, [*FSDP_BATCH, "--training.mixed_precision_param",
                                       "bfloat16", *SELECTIVE, "op"]),
    "FSDP 2, 2 microbatches": (2, ["--training.local_batch_size", "2",
                                   "--training.global_batch_size", "8"]),
    "HSDP 2x1, AC none": (2, [*FSDP_BATCH, "--parallelism.data_parallel_replicate_degree",
                              "2"]),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="only the cases whose name contains one of "
                        "these strings")
    args = parser.parse_args()
    cases = {name: (n, [*COMMON, *overrides]) for name, (n, overrides) in CASES.items()
             if not args.only or any(key in name for key in args.only)}
    with tempfile.TemporaryDirectory() as tmp:
        measured = measure_cases(cases, Path(tmp))
    print("| case | predicted MiB | measured MiB | error | predicted peak at |")
    print("|---|---:|---:|---:|---|")
    errors = []
    for name, (nproc, overrides) in cases.items():
        predicted = predict_peak(build_job_config(overrides), nproc, CPU)
        error = 100 * (predicted.total - measured[name]) / measured[name]
        errors.append(abs(error))
        print(f"| {name} | {predicted.total / 2**20:.1f} | {measured[name] / 2**20:.1f} | "
              f"{error:+.1f}% | {predicted.moment} |")
    print(f"\nlargest |error|: {max(errors):.1f}% over {len(errors)} cases")


if __name__ == "__main__":
    main()
