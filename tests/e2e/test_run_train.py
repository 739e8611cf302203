"""The README's training command, and a model registered from outside the package, trained
by a Trainer subclass named in the config (``[job] trainer``)."""

import json
import subprocess
import sys

from harness import FP32_PARITY_TOL, ROOT, assert_close, env, losses, read_metrics


def run_train(tmp_path, *overrides, nproc=1, config=None):
    extra = {"NPROC": str(nproc), "PYTHON": sys.executable}
    if config:
        extra["CONFIG_FILE"] = config
    proc = subprocess.run(["./run_train.sh", f"--job.dump_folder={tmp_path}", *overrides],
                          cwd=ROOT, env={**env(), **extra}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_default_job_trains_and_says_where_its_logs_are(tmp_path):
    out = run_train(tmp_path, "--training.steps=12", "--metrics.log_freq=4",
                    "--validation.freq=12")
    records = read_metrics(tmp_path)
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 4, 8, 12]
    assert train[-1]["loss"] < train[0]["loss"] - 1.0
    assert any("validation_loss" in r for r in records)
    assert f"metrics in {tmp_path}/metrics.jsonl" in out
    assert (tmp_path / "tb").is_dir()


def test_custom_model_trains_with_fsdp_like_one_process(tmp_path, corpus):
    config = "examples/custom_model/tiny_gpt.toml"
    common = ["--training.steps=6", "--training.seq_len=64", "--training.local_batch_size=2",
              "--training.global_batch_size=4", "--training.mixed_precision_param=float32",
              "--metrics.log_freq=1", "--metrics.peak_tflops=1", "--debug.deterministic=true",
              "--validation.enable=false", "--training.dataset=local",
              f"--training.dataset_path={corpus}"]
    trainer = "--job.trainer=tests/plugins/custom_trainer.py:CountingTrainer"
    out = run_train(tmp_path / "two", *common, trainer, nproc=2, config=config)
    assert "tiny_gpt small" in out and "dp_shard 2" in out
    assert json.loads((tmp_path / "two" / "trainer.json").read_text()) == {
        "class": "CountingTrainer", "microbatches": 6}  # 6 steps of 1 microbatch per rank
    run_train(tmp_path / "one", *common, config=config)
    two, one = losses(read_metrics(tmp_path / "two")), losses(read_metrics(tmp_path / "one"))
    assert two[-1] < two[0]
    assert_close(two, one, FP32_PARITY_TOL)  # FSDP reorders fp32 sums (tests/harness.py)
