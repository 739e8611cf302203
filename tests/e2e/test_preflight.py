"""A bad job fails before it starts: one line, exit code 2, before torchrun launches any
process (run_train.sh runs torchtitan_like/preflight.py first); an existing metrics.jsonl is
left as it was (a fresh run into its folder is refused), also by a job that fails after its
process group started."""

import json
import subprocess
import sys

import pytest
from harness import BASE, ROOT, env

EARLIER_RUN = json.dumps({"step": 1, "loss": 1.0}) + "\n"


@pytest.fixture
def dump_folder(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(EARLIER_RUN)
    return folder


def test_bad_inputs_fail_before_torchrun_with_one_line(tmp_path, dump_folder):
    no_field = tmp_path / "no_field.jsonl"
    no_field.write_text(json.dumps({"content": "x"}) + "\n")
    cases = [
        (["--training.stepz=3", "--checkpoint.enable_checkpoint"], "2 problems:"),
        (["--optimizer.eps=-1"], "[optimizer] eps = -1.0: must be > 0"),
        (["--training.dataset=local", f"--training.dataset_path={no_field}"],
         "no text field 'text'"),
        (["--parallelism.data_parallel_shard_degree=3"], "but 2 processes"),
        ([], "holds another run's outputs (metrics.jsonl) and this run starts at step 0"),
    ]
    for overrides, message in cases:
        proc = subprocess.run(["./run_train.sh", f"--job.dump_folder={dump_folder}", *overrides],
                              cwd=ROOT, env={**env(), "NPROC": "2", "PYTHON": sys.executable},
                              capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out
        assert message in out and "config error:" in out, out
        assert "torch.distributed" not in out and "Traceback" not in out, out
        if not message.endswith("problems:"):
            assert len(out.strip().splitlines()) == 1, out
        assert (dump_folder / "metrics.jsonl").read_text() == EARLIER_RUN


def test_bad_launcher_variables_fail_before_bash_computes_with_them(tmp_path, dump_folder):
    """run_train.sh hands its variables to preflight before any arithmetic on them
    (tests/unit/test_launcher_env.py checks each variable's bad values)."""
    cases = [({"NPROC": "0"}, "config error: NPROC=0: processes on this node must be a whole "
                              "number >= 1"),
             ({"NNODES": "2", "NODE_RANK": "0"}, "config error: NNODES=2 needs RDZV_ENDPOINT"),
             ({"NPROC": "1", "LOG_RANK": "1"}, "config error: LOG_RANK=1: expected local ranks")]
    for variables, line in cases:
        proc = subprocess.run(["./run_train.sh", f"--job.dump_folder={dump_folder}"], cwd=ROOT,
                              env={**env(), "PYTHON": sys.executable, **variables},
                              capture_output=True, text=True, timeout=300)
        out = (proc.stdout + proc.stderr).strip()
        assert proc.returncode == 2 and len(out.splitlines()) == 1 and line in out, out
        assert (dump_folder / "metrics.jsonl").read_text() == EARLIER_RUN


def test_a_job_failing_after_start_up_keeps_the_metrics_file(tmp_path, dump_folder):
    """The second record lacks the text field: the start-up check reads only a file's first
    record, so training meets it at step 1, after the process group, the model and the
    metrics logger were built: one ``data error:`` line, exit 5. The earlier run's metrics are
    intact: moved to the archive by ``[job] overwrite`` (without it the fresh run is refused,
    test above), and no new file was started (it opens at the first record)."""
    corpus = tmp_path / "late.jsonl"
    corpus.write_text(json.dumps({"text": "short"}) + "\n" + json.dumps({}) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "torchtitan_like.train", *BASE, f"--job.dump_folder={dump_folder}",
         "--training.dataset=local", f"--training.dataset_path={corpus}", "--job.overwrite=true"],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 5, proc.stderr[-3000:]
    assert "data error: " in proc.stderr and "late.jsonl:2: no text field" in proc.stderr
    assert "Traceback" not in proc.stderr
    (archived,) = (dump_folder / "archive").iterdir()
    assert (archived / "metrics.jsonl").read_text() == EARLIER_RUN
    assert not (dump_folder / "metrics.jsonl").exists()
