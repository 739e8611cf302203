"""One dump folder, one run's story: TensorBoard's view equals metrics.jsonl after a run, a
resume from an earlier checkpoint, a refused fresh re-run and an overwriting re-run.

The jobs run in this process (``entry.run``, the trainer's job function without the process
exit) in a gloo group of one. The resume (``load_step = 2`` of a 4-step run, 6 steps now)
drops the records and events of steps 3-4 and continues; a fresh run (checkpoints off) into
the folder is refused with one line and changes nothing; with ``[job] overwrite`` the earlier
outputs move to ``archive/<time>/`` intact and the folder holds the new run only; a resume
from a damaged checkpoint then fails with exit code 4 and leaves every file as it was. Last,
``[job] overwrite`` with checkpoints on, beside a resumable checkpoint: a fresh run (its first
losses are the first run's, no resume marker), the other run archived whole (metrics, config
copy, TensorBoard events, checkpoint). (The first run also shows the world group on ``[comm]
train_timeout_seconds`` after the first step.)
"""

import datetime
import shutil
from pathlib import Path

import torch
from harness import job_args, read_metrics
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from torchtitan_like.entry import run
from torchtitan_like.exit_codes import ExitCode

TB = ["--metrics.enable_tensorboard=true", "--validation.enable=false"]
CKPT = ["--checkpoint.enable=true", "--checkpoint.interval=2"]


def tensorboard_losses(folder: Path) -> dict[int, float]:
    events = EventAccumulator(str(folder))  # purges the steps a resumed writer dropped
    events.Reload()
    scalars = events.Scalars("loss")
    assert len({e.step for e in scalars}) == len(scalars), "a step shown twice"
    return {e.step: e.value for e in scalars}


def metrics_losses(folder: Path) -> dict[int, float]:
    records = [r for r in read_metrics(folder) if "loss" in r]
    assert len({r["step"] for r in records}) == len(records), "a step logged twice"
    return {r["step"]: r["loss"] for r in records}


def same_view(folder: Path) -> dict[int, float]:
    tb, jsonl = tensorboard_losses(folder / "tb"), metrics_losses(folder)
    assert sorted(tb) == sorted(jsonl)
    assert all(abs(tb[s] - jsonl[s]) <= 1e-6 * abs(jsonl[s]) for s in jsonl)  # TB stores fp32
    return jsonl


def test_tensorboard_equals_metrics_through_resume_refusal_and_overwrite(
        one_process_group, corpus, tmp_path, capfd, caplog):
    folder = tmp_path / "job"

    def job(*overrides: str) -> int:
        return run(job_args([*TB, *overrides], folder, corpus))

    assert job(*CKPT, "--training.steps=4", "--comm.train_timeout_seconds=77") == ExitCode.OK
    world = torch.distributed.group.WORLD._get_backend(torch.device("cpu"))
    assert world.options._timeout == datetime.timedelta(seconds=77)  # after the first step
    first = same_view(folder)
    assert sorted(first) == [1, 2, 3, 4]

    assert job(*CKPT, "--training.steps=6", "--checkpoint.load_step=2") == ExitCode.OK
    resumed = same_view(folder)
    assert sorted(resumed) == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in read_metrics(folder) if r.get("resumed")] == [2]

    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != "job.lock"}
    capfd.readouterr()
    caplog.clear()
    assert job("--training.steps=3") == ExitCode.CONFIG  # fresh: checkpoints off
    said = capfd.readouterr().err + caplog.text  # the logger's handler, or pytest's capture
    refusal = [line for line in said.splitlines() if "error" in line]
    assert len(refusal) == 1 and "config error: [job] dump_folder" in refusal[0]
    assert "holds another run's outputs (metrics.jsonl, 2 TensorBoard event file(s), 3 " \
           "checkpoint(s))" in refusal[0]
    assert {p: p.read_bytes() for p in before} == before  # nothing touched

    assert job("--training.steps=3", "--job.overwrite=true") == ExitCode.OK
    assert sorted(same_view(folder)) == [1, 2, 3]
    (archived,) = (folder / "archive").iterdir()
    assert same_view(archived) == resumed
    assert sorted(p.name for p in (archived / "checkpoint").iterdir()) == [
        "step-2", "step-4", "step-6"]

    # A resume from a damaged checkpoint: exit 4, and the folder exactly as it was.
    damaged = folder / "checkpoint" / "step-6"
    shutil.copytree(archived / "checkpoint" / "step-6", damaged)
    with (damaged / "__0_0.distcp").open("r+b") as f:
        f.truncate(100)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != "job.lock"}
    assert job(*CKPT, "--training.steps=8") == ExitCode.CHECKPOINT
    assert {p: p.read_bytes() for p in before} == before

    # Overwrite beside a resumable checkpoint (the intact step-6 again): a fresh run.
    shutil.rmtree(damaged)
    shutil.copytree(archived / "checkpoint" / "step-6", damaged)
    other_run = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                       if p.is_file() and p.name != "job.lock" and "archive" not in p.parts)
    assert job(*CKPT, "--training.steps=2", "--job.overwrite=true") == ExitCode.OK
    fresh = same_view(folder)
    assert fresh == {step: first[step] for step in (1, 2)}  # step 0's weights, not step 6's
    assert not [r for r in read_metrics(folder) if r.get("resumed")]
    assert sorted(p.name for p in (folder / "checkpoint").iterdir()) == ["step-2"]
    newest = max((folder / "archive").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    assert newest != archived and sorted(
        str(p.relative_to(newest)) for p in newest.rglob("*") if p.is_file()) == other_run
    assert sorted(same_view(newest)) == [1, 2, 3]
