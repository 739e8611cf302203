"""The README's training command (interrupted by Ctrl-C, then resumed by the same command),
and a model registered from outside the package, trained by a Trainer subclass named in the
config (``[job] trainer``)."""

import json
import os
import re
import signal
import subprocess
import sys

from harness import FP32_PARITY_TOL, ROOT, assert_close, env, losses, read_metrics

from torchtitan_like.exit_codes import INTERRUPTED_LINE

PROGRESS = re.compile(r"\[rank0\]:\d\d:\d\d:\d\d (step +\d+/|checkpoint step \d+: )")
"""The trainer's own lines of a step (its record, its checkpoint)."""


def run_train(tmp_path, *overrides, nproc=1, config=None):
    extra = {"NPROC": str(nproc), "PYTHON": sys.executable}
    if config:
        extra["CONFIG_FILE"] = config
    proc = subprocess.run(["./run_train.sh", f"--job.dump_folder={tmp_path}", *overrides],
                          cwd=ROOT, env={**env(), **extra}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def interrupt(tmp_path, *overrides, after: str) -> tuple[int, list[str], list[str]]:
    """./run_train.sh in a session of its own, SIGINT to that session (what Ctrl-C sends the
    terminal's foreground group) once a line contains ``after``: (exit code, lines before,
    lines after)."""
    proc = subprocess.Popen(["./run_train.sh", f"--job.dump_folder={tmp_path}", *overrides],
                            cwd=ROOT, env={**env(), "NPROC": "1", "PYTHON": sys.executable},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        before = []
        while not before or after not in before[-1]:
            line = proc.stdout.readline()
            assert line, "".join(before[-30:])
            before.append(line.rstrip("\n"))
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, before, rest.splitlines()


def test_default_job_trains_and_says_where_its_logs_are(tmp_path):
    """Interrupted after its step-4 checkpoint, it says one line (besides the step lines of
    work in flight) and exits 130; the same command resumes it. A setting whose switch is off
    is named in one warning line at start-up."""
    job = ["--training.steps=12", "--metrics.log_freq=4", "--validation.freq=12",
           "--checkpoint.enable=true", "--checkpoint.interval=4", "--float8.recipe_name=rowwise"]
    code, before, after = interrupt(tmp_path, *job, after="checkpoint step 4: complete")
    assert code == 130, "\n".join(before + after)
    assert [line for line in after if not PROGRESS.match(line)] == [INTERRUPTED_LINE], after
    (unused,) = [line for line in before if "without effect" in line]
    assert unused.endswith('1 setting(s) without effect, kept for a sweep that turns their '
                           'switch on: [float8] recipe_name = "rowwise" ([float8] enable is off)')
    out = run_train(tmp_path, *job)
    records = read_metrics(tmp_path)
    assert sum(r.get("resumed", False) for r in records) == 1
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
