"""A real sweep on CPU: three variants, one of them impossible.

The baseline (FSDP over 2 processes) and a one-process variant with full activation
checkpointing, run by a Trainer subclass the variant names (``[job] trainer``), train the same
global batch from the same seed in fp32 with deterministic kernels, so their final losses
agree (the runner's loss delta ~ 0, measured ~1e-6) and so do their validation losses (the
same held-out sequences); the third asks for 3 data-parallel replicas of 2 processes and must
be recorded as failed by the runner's preflight, with the config error as its error line and no
torchrun started, while the sweep still writes its table and chart (or says why not).
"""

import json
import sys
from pathlib import Path

from harness import FP32_PARITY_TOL, ROOT

from torchtitan_like.tools.ablate import load_sweep, run_sweep
from torchtitan_like.tools.ablate_report import model_metric_names


def test_sweep_runs_variants_and_records_a_failure(tmp_path: Path, corpus: Path):
    sweep_file = tmp_path / "sweep.toml"
    sweep_file.write_text(f"""
[sweep]
base_config = "{ROOT}/train_configs/debug_model.toml"
steps = 3
nproc = 2
output_folder = "{tmp_path / 'out'}"
overrides = ["--model.flavor=tiny", "--training.dataset=local",
             "--training.dataset_path={corpus}", "--training.seq_len=64",
             "--training.local_batch_size=2", "--training.global_batch_size=4",
             "--metrics.log_freq=1", "--metrics.enable_tensorboard=false",
             "--validation.freq=3", "--validation.steps=1", "--debug.deterministic=true"]
timeout_s = 300

[[variants]]
name = "FSDP 2"

[[variants]]
name = "1 process, AC full"
nproc = 1
overrides = ["--activation_checkpoint.mode=full",
             "--job.trainer={ROOT}/tests/plugins/custom_trainer.py:CountingTrainer"]

[[variants]]
name = "impossible"
overrides = ["--parallelism.data_parallel_replicate_degree=3"]
""")
    lines: list[str] = []
    results = run_sweep(load_sweep(sweep_file), log=lines.append)

    assert [r.status for r in results] == ["ok", "ok", "failed (exit 2)"]  # a config error
    assert "[3/3] impossible" in "\n".join(lines) and "ETA" in lines[2]
    baseline, single, impossible = results
    assert [r["step"] for r in baseline.training] == [1, 2, 3]
    # FSDP vs one process: reordered fp32 sums (tests/harness.py)
    assert abs(single.final_loss - baseline.final_loss) <= FP32_PARITY_TOL
    assert abs(single.validation_loss - baseline.validation_loss) <= FP32_PARITY_TOL
    assert baseline.planned_memory_gib > 0 and single.planned_memory_gib > 0
    assert model_metric_names(baseline.records) == []  # llama logs no metrics of its own
    assert json.loads((tmp_path / "out" / "1_process_AC_full" / "trainer.json").read_text())[
        "class"] == "CountingTrainer"
    assert "world size 2 is not divisible" in impossible.error
    assert impossible.error.startswith("config error:")
    assert impossible.planned_memory_gib is None

    out = tmp_path / "out"
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 4 and rows[3].startswith("impossible,failed (exit 2),2,0,")
    table = (out / "results.md").read_text()
    assert "| FSDP 2 | 2 | ok |" in table and "**impossible** (failed (exit 2))" in table
    chart = out / "results.png"  # or a note in the table and a line without the `plot` extra
    assert chart.is_file() or ("No chart: matplotlib is not installed" in table
                               and lines[-1].startswith("no chart: matplotlib is missing"))
    log = (out / "impossible" / "train.log").read_text().splitlines()
    assert log[0].startswith(f"$ {sys.executable} -m torchtitan_like.launch --standalone "
                             "--nproc_per_node=2 ")
    assert log[1:] == [f"{impossible.error} (refused before torchrun)"]
