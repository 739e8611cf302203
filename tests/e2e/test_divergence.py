"""A NaN loss stops the run with the step number, before the optimizer step."""

import subprocess
import sys

from harness import ROOT, env, losses, read_metrics


def test_nan_loss_stops_with_a_clear_error(tmp_path, corpus):
    cmd = [sys.executable, "-m", "torchtitan_like.train",
           "--job.custom_import=tests/e2e/nan_model.py", "--model.name=nan_llama",
           "--model.flavor=tiny", "--training.seq_len=32",
           "--training.steps=5", "--metrics.log_freq=1", "--metrics.peak_tflops=1",
           "--training.dataset=local", f"--training.dataset_path={corpus}",
           f"--job.dump_folder={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "training diverged: step 3: gradient norm is nan" in proc.stderr
    assert "stopped before the optimizer step" in proc.stderr
    assert len(losses(read_metrics(tmp_path))) == 2  # steps 1 and 2 were logged, then the stop
