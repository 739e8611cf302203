"""Planner vs measurement: peak memory per rank of the debug model on this CPU.

For each case (a layout / activation-checkpointing mode on top of
train_configs/debug_model.toml), the planner predicts the peak tensor memory of every pipeline
rank from the config alone, and the real trainer measures every rank's peak with MemTracker
over one steady-state step (torchtitan_like/tools/memory.py; one torchrun launch per process
count). Prints a markdown table with the error of each case: one row per pipeline stage under
PP (its ranks' largest peak), else the largest peak over the ranks.

    python scripts/validate_plan_memory.py            # about 6 minutes on 2 cores
    python scripts/validate_plan_memory.py --only PP
    python scripts/validate_plan_memory.py --moe   # the MoE models instead (their own table)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from torchtitan_like.config.manager import build_job_config
from torchtitan_like.tools.memory import measure_cases
from torchtitan_like.tools.planner import CPU, predict_stage_peaks

ROOT = Path(__file__).resolve().parents[1]

COMMON = ["--job.config_file", str(ROOT / "train_configs/debug_model.toml"),
          "--metrics.enable_tensorboard", "false", "--validation.enable", "false"]
SELECTIVE = ["--activation_checkpoint.mode", "selective",
             "--activation_checkpoint.selective_ac_option"]
FULL = ["--activation_checkpoint.mode", "full"]
BATCH_4 = ["--training.local_batch_size", "4"]
TP = ["--parallelism.tensor_parallel_degree", "2"]
BF16 = ["--training.mixed_precision_param", "bfloat16"]  # autocast unless FSDP is on
# Two stages; the local batch of 8 in 4 microbatches of 2 sequences.
PP = ["--parallelism.pipeline_parallel_degree", "2",
      "--parallelism.pipeline_parallel_microbatch_size", "2"]
SCHEDULE = "--parallelism.pipeline_parallel_schedule"
QWEN3_MOE = ["--model.name", "qwen3", "--model.flavor", "debugmodel_moe"]
DEEPSEEK = ["--model.name", "deepseek_v3", "--model.flavor", "debugmodel"]
EP_2 = [*BATCH_4, "--parallelism.expert_parallel_degree", "2"]

# name -> (processes, overrides on top of COMMON); the debug config: batch 8 x 256, fp32.
CASES: dict[str, tuple[int, list[str]]] = {
    "1 proc, AC none": (1, []),
    "1 proc, AC op": (1, [*SELECTIVE, "op"]),
    "1 proc, AC full": (1, FULL),
    "1 proc, AC every 2": (1, [*SELECTIVE, "2"]),
    "1 proc, tiny (GQA), seq 512, AC every 3": (
        1, ["--model.flavor", "tiny", "--training.seq_len", "512", *SELECTIVE, "3"]),
    "FSDP 2, AC none": (2, BATCH_4),
    "FSDP 2, AC full": (2, [*BATCH_4, *FULL]),
    "FSDP 2, no reshard": (2, [*BATCH_4, "--parallelism.fsdp_reshard_after_forward",
                               "never"]),
    "FSDP 2, bf16 params, AC op": (2, [*BATCH_4, "--training.mixed_precision_param",
                                       "bfloat16", *SELECTIVE, "op"]),
    "FSDP 2, 2 microbatches": (2, ["--training.local_batch_size", "2",
                                   "--training.global_batch_size", "8"]),
    "HSDP 2x1, AC none": (2, [*BATCH_4, "--parallelism.data_parallel_replicate_degree",
                              "2"]),
    "TP 2 (SP, loss parallel)": (2, [*BATCH_4, *TP]),
    "CP 2": (2, [*BATCH_4, "--parallelism.context_parallel_degree", "2"]),
    "PP 2 1F1B": (2, [*PP, SCHEDULE, "1F1B"]),
    "PP 2 1F1B, AC full": (2, [*PP, SCHEDULE, "1F1B", *FULL]),
    "PP 2 GPipe": (2, [*PP, SCHEDULE, "GPipe"]),
    "PP 2 Interleaved1F1B (4 stages)": (2, [*PP, SCHEDULE, "Interleaved1F1B"]),
    "1 proc, bf16 autocast": (1, BF16),
    "1 proc, bf16 autocast, AC full": (1, [*BF16, *FULL]),
    "1 proc, bf16 autocast, AC op": (1, [*BF16, *SELECTIVE, "op"]),
    "1 proc, bf16 moments": (1, ["--optimizer.state_dtype", "bfloat16"]),
    "FSDP 2, bf16 params, AC none": (2, [*BATCH_4, *BF16]),
    "FSDP 2, bf16 moments": (2, [*BATCH_4, "--optimizer.state_dtype", "bfloat16"]),
    "TP 2, bf16 autocast": (2, [*BATCH_4, *TP, *BF16]),
    "PP 2 1F1B, bf16 autocast": (2, [*PP, SCHEDULE, "1F1B", *BF16]),
    "FSDP 2 x TP 2": (4, [*BATCH_4, *TP]),
    "PP 2 x TP 2, 1F1B": (4, [*PP, *TP]),
    "PP 2 x FSDP 2, 1F1B": (4, [*PP, "--training.local_batch_size", "4",
                                "--training.global_batch_size", "8"]),
}
MOE_CASES: dict[str, tuple[int, list[str]]] = {
    "MoE qwen3 1 proc": (1, QWEN3_MOE),
    "MoE qwen3 1 proc, AC op": (1, [*QWEN3_MOE, *SELECTIVE, "op"]),
    "MoE qwen3 FSDP 2 x EP 2": (2, [*QWEN3_MOE, *EP_2]),
    "MoE qwen3 FSDP 2 x EP 2, AC full": (2, [*QWEN3_MOE, *EP_2, *FULL]),
    "MoE deepseek_v3 1 proc": (1, DEEPSEEK),
    "MoE deepseek_v3 1 proc, AC op": (1, [*DEEPSEEK, *SELECTIVE, "op"]),
    "MoE deepseek_v3 FSDP 2 x EP 2": (2, [*DEEPSEEK, *EP_2]),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="only the cases whose name contains one of "
                        "these strings")
    parser.add_argument("--moe", action="store_true", help="the MoE cases instead")
    args = parser.parse_args()
    chosen = MOE_CASES if args.moe else CASES
    cases = {name: (n, [*COMMON, *overrides]) for name, (n, overrides) in chosen.items()
             if not args.only or any(key in name for key in args.only)}
    with tempfile.TemporaryDirectory() as tmp:
        measured = measure_cases(cases, Path(tmp))
    print("| case | predicted MiB | measured MiB | error | predicted peak at |")
    print("|---|---:|---:|---:|---|")
    errors = []
    for name, (nproc, overrides) in cases.items():
        stages = predict_stage_peaks(build_job_config(overrides), nproc, CPU)
        per_stage = nproc // len(stages)  # the mesh puts PP outermost
        for s, predicted in enumerate(stages):
            peak = max(measured[name][s * per_stage:(s + 1) * per_stage])
            error = 100 * (predicted.total - peak) / peak
            errors.append(abs(error))
            label = f"{name}, PP rank {s}" if len(stages) > 1 else name
            print(f"| {label} | {predicted.total / 2**20:.1f} | {peak / 2**20:.1f} | "
                  f"{error:+.1f}% | {predicted.moment} |")
    print(f"\nlargest |error|: {max(errors):.1f}% over {len(errors)} rows")


if __name__ == "__main__":
    main()
