"""The planner's peak memory per rank matches MemTracker's measurement of the real trainer.

Two processes on the tiny model, one launch: FSDP over 2 ranks without and with full
activation checkpointing (two different peak moments: a layer's backward; a recomputed
layer's backward), TP 2 (sequence and loss parallel), CP 2, and PP 2 with 1F1B and with
Interleaved1F1B (two stages per rank), where each rank holds its own stages and rank 0 more
microbatches in flight, compared rank by rank. TP, CP and PP also accumulate gradients over
two microbatches / schedule steps. The full table over more layouts is
scripts/validate_plan_memory.py (docs/planner.md); there every case is within
3.1%, so 5% here catches a real change in what the trainer allocates (the figures are
deterministic: tensor sizes, not timings).
"""

import pytest
from harness import BASE, ROOT

from torchtitan_like.config.manager import build_job_config
from torchtitan_like.tools.memory import measure_cases
from torchtitan_like.tools.planner import CPU, predict_stage_peaks

TOL = 0.05
BF16 = ["--training.mixed_precision_param", "bfloat16"]


def test_planner_predicts_measured_peak(tmp_path, corpus):
    common = [*BASE, "--job.config_file", str(ROOT / "train_configs/debug_model.toml"),
              "--training.dataset", "local", "--training.dataset_path", str(corpus),
              "--metrics.enable_tensorboard", "false", "--validation.enable", "false",
              "--training.local_batch_size", "4", "--training.global_batch_size", "8",
              "--training.seq_len", "128"]
    cases = {"none": (2, common),
             "full": (2, [*common, "--activation_checkpoint.mode", "full"]),
             "tp": (2, [*common, "--parallelism.tensor_parallel_degree", "2"]),
             "cp": (2, [*common, "--parallelism.context_parallel_degree", "2"]),
             "pp 1F1B": (2, [*common, "--parallelism.pipeline_parallel_degree", "2"]),
             "pp interleaved": (2, [*common, "--parallelism.pipeline_parallel_degree", "2",
                                    "--parallelism.pipeline_parallel_schedule",
                                    "Interleaved1F1B"]),
             "fsdp bf16": (2, [*common, *BF16]),
             "tp bf16 autocast": (2, [*common, *BF16, "--parallelism.tensor_parallel_degree",
                                      "2"])}
    measured = measure_cases(cases, tmp_path)
    for name, (nproc, overrides) in cases.items():
        stages = predict_stage_peaks(build_job_config(overrides), nproc, CPU)
        for rank, peak in enumerate(measured[name]):
            predicted = stages[rank * len(stages) // nproc].total
            assert predicted == pytest.approx(peak, rel=TOL), (name, rank)
