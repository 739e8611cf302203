"""A NaN loss stops the run with the step number, before the optimizer step; so does a loss
spike under ``[spike] policy = "stop"``."""

import subprocess
import sys

from harness import ROOT, env, job_args, losses, read_metrics, run_in_process


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


def test_a_spike_stops_with_exit_3_and_the_last_checkpoint_intact(tmp_path, corpus, monkeypatch,
                                                                  capsys):
    """``[spike] policy = "stop"`` (max_consecutive 1 here; the streak count is unit-tested
    in tests/unit/test_spikes.py): the injected spike at step 6 ends the job through ``run``
    (``main``'s body) with exit code 3, naming the step and its samples; the step-5 checkpoint
    is the last one, complete, and nothing was written from the spike (in-process: one
    process group of one)."""
    argv = job_args(["--training.steps=8", "--checkpoint.enable=true", "--checkpoint.interval=5",
                     "--spike.window=4", "--spike.policy=stop", "--spike.max_consecutive=1",
                     "--debug.spike_step=6"], tmp_path, corpus)
    assert run_in_process(argv) == 3
    log = capsys.readouterr().err
    assert "training diverged: step 6: 1 loss/grad-norm spike(s) in a row (loss" in log
    assert "this step's data: samples 20-23 of the training stream (4 a step)" in log
    assert [p.name for p in (tmp_path / "checkpoint").iterdir()] == ["step-5"]
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5]
    spikes = [(r["step"], r["spike_update_skipped"]) for r in records if r.get("spike")]
    assert spikes == [(6, True)]
