"""W&B (offline) and MLflow (file store) receive exactly the records of metrics.jsonl, across a
resume, with the merged config as each run's config; the config.toml a run writes runs again.

One job of the tiny model trains 4 steps in this process with both trackers, checkpoints every 2
steps, validates every 2, and has an injected loss spike at its last step (policy warn), so
its records are training records, validation records, a spike event, and, since the spike's
checkpoint is never written, a second launch of the same job resumes from step 2: a resume
marker, then steps 3-4 again. The W&B runs are read from wandb's own protobuf records
(tests/wandb_records.py), the MLflow runs through MlflowClient; the group's runs are combined
the way metrics.jsonl is (a resumed run's records replace the earlier runs' records after its
marker step, components/trackers.py) and every value must equal the file's (class (a):
the same floats, written as JSON / text).
"""

import math

import pytest
from harness import build_trainer, read_metrics
from wandb_records import read_run

from torchtitan_like.components.trackers import flatten
from torchtitan_like.config.manager import build_job_config, to_dict

JOB = ["--training.steps=4", "--checkpoint.enable=true", "--checkpoint.interval=2",
       "--validation.enable=true", "--validation.freq=2", "--validation.steps=1",
       "--metrics.enable_wandb=true", "--metrics.enable_mlflow=true",
       "--metrics.run_name=trackers", "--spike.window=3", "--debug.spike_step=4"]


@pytest.fixture(scope="module")
def job(one_process_group, corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("trackers")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        env.setenv("WANDB_CONSOLE", "off")
        env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        build_trainer(JOB, folder, corpus, one_process_group).train()
        first = read_metrics(folder)
        resumed = build_trainer(JOB, folder, corpus, one_process_group)
        resumed.train()
    return folder, resumed.config, first, read_metrics(folder)


def by_step(records: list[dict]) -> dict[int, dict]:
    """Records merged per step, None values left out: what a tracker keeps of them."""
    rows: dict[int, dict] = {}
    for record in records:
        rows.setdefault(record["step"], {}).update(
            {k: v for k, v in record.items() if k != "step" and v is not None})
    return rows


def combine(runs: list[tuple[int, dict[int, dict]]]) -> dict[int, dict]:
    """(resume step, rows) of a group's runs in order -> the rows metrics.jsonl keeps."""
    rows: dict[int, dict] = {}
    for resume_step, run_rows in runs:
        rows = {step: row for step, row in rows.items() if step <= resume_step}
        for step, row in run_rows.items():
            rows.setdefault(step, {}).update(row)
    return rows


def test_the_job_resumed_after_its_spike_step(job):
    folder, _, first, records = job
    assert [p.name for p in (folder / "checkpoint").iterdir()] == ["step-2"]  # none of step 4
    assert [r["step"] for r in first if "loss" in r] == [1, 2, 3, 4]
    assert [(r["step"], sorted(r)[0]) for r in records if "loss" not in r] == [
        (2, "step"), (2, "resumed"), (4, "spike"), (4, "step")]  # validation, marker, spike, val
    spike = [r for r in records if r.get("spike")]
    assert spike == [r for r in first if r.get("spike")]  # the baseline resumed exactly
    assert [r["loss"] for r in records if "loss" in r] == [r["loss"] for r in first if "loss" in r]


def test_wandb_runs_hold_every_record_and_the_config(job):
    folder, config, _, records = job
    runs = [read_run(path) for path in folder.glob("wandb/offline-run-*/run-*.wandb")]
    runs.sort(key=lambda run: run[0]["resumed_from_step"])
    assert [run[0]["resumed_from_step"] for run in runs] == [0, 2]
    assert combine([(cfg["resumed_from_step"], rows) for cfg, rows in runs]) == by_step(records)
    expected = to_dict(config)
    for run_config, _ in runs:
        assert {k: v for k, v in run_config.items() if k != "resumed_from_step"} == expected


def test_mlflow_runs_hold_every_record_and_the_config(job):
    from mlflow.tracking import MlflowClient

    folder, config, _, records = job
    client = MlflowClient(tracking_uri=(folder / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("torchtitan_like")
    runs = sorted(client.search_runs([experiment.experiment_id]),
                  key=lambda run: int(run.data.tags["resumed_from_step"]))
    assert [run.data.tags["group"] for run in runs] == ["trackers", "trackers"]
    combined = []
    for run in runs:
        rows: dict[int, dict] = {}
        for key in run.data.metrics:
            for metric in client.get_metric_history(run.info.run_id, key):
                rows.setdefault(metric.step, {})[key] = metric.value
        resume_step = int(run.data.tags["resumed_from_step"])
        combined.append((resume_step, rows))
        assert run.data.params == {k: str(v) for k, v in flatten(
            {**to_dict(config), "resumed_from_step": resume_step}).items()}
    numbers = {step: {k: float(v) for k, v in row.items()} for step, row in
               by_step(records).items()}
    assert combine(combined) == numbers
    assert all(math.isfinite(v) for row in numbers.values() for v in row.values())


def test_the_written_config_runs_the_same_job(job):
    folder, config, _, _ = job
    again = build_job_config(["--job.config_file", str(folder / "config.toml")])
    again.job.config_file = config.job.config_file
    assert to_dict(again) == to_dict(config)


def test_a_tracker_without_its_package_is_refused_in_one_line(monkeypatch):
    import importlib.util

    from torchtitan_like.components import trackers
    from torchtitan_like.config.errors import ConfigError

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"^\[metrics\] enable_mlflow needs the mlflow package: "
                                          r"pip install 'torchtitan_like\[mlflow\]'"):
        trackers.validate_trackers(build_job_config(["--metrics.enable_mlflow"]))
