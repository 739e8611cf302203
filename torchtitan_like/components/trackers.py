"""Where rank 0's metrics records go besides ``metrics.jsonl``: TensorBoard, W&B, MLflow.

Every tracker receives exactly the records ``metrics.jsonl`` gets, in the same order, with the
same names and steps: training records, validation records, spike events and the
``{"step": N, "resumed": true}`` marker a resumed run starts with. Values that are None (an
unknown MFU) are left out; MLflow takes numbers only (booleans as 0/1), W&B and TensorBoard take
what they are given (TensorBoard: numbers and booleans).

A resumed job is a new W&B / MLflow run in the group ``[metrics] run_name``, configured with
the merged config plus ``resumed_from_step``. Its records start at the resume marker; the
steps after it that an earlier run had logged before its failure are superseded, exactly as
``metrics.jsonl`` drops them (components/metrics.py): reading the group's runs in order and
letting each run's records replace the earlier runs' records after its marker step
gives the file's records. (W&B's own "rewind" of a run is a private preview, and its normal
resume drops steps that go backwards, so one run per resumed job is the portable choice.)

A tracker's write that fails for a reason a restart meets again (a full disk under TensorBoard's
folder or MLflow's file store) stops the job with one ``storage error:`` line naming the tracker
(components/storage.py; MetricsLogger frames every call with ``Tracker.what``). TensorBoard
writes from a thread of its own, which would print the error's traceback before the job's
line; the thread's OSError is left to the main thread, which raises it at the next record.

Both trackers are optional extras (``pip install 'torchtitan_like[wandb]'`` / ``[mlflow]``),
imported when the first record is written, so that a job that fails before its first step
creates no run; ``validate`` refuses a tracker whose package is missing, with one line.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.manager import to_dict

DEFAULT_PROJECT = "torchtitan_like"
MLFLOW_BATCH = 100
"""MLflow's ``log_batch`` takes at most 100 params per call."""


class Tracker(Protocol):
    """The interface ``MetricsLogger`` writes through."""

    what: str
    """What it writes to, in the words of a failed write (``TensorBoard events (folder)``)."""

    def log(self, step: int, record: dict[str, Any]) -> None:
        """One record of ``metrics.jsonl`` (``record["step"] == step``)."""

    def close(self) -> None:
        """Flush and end the run (after the last record)."""


def _values(record: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    return ((k, v) for k, v in record.items() if k != "step" and v is not None)


def _tensorboard_thread_hook(previous: Any) -> Any:
    """``threading.excepthook`` that leaves the OSError of TensorBoard's writer thread to the
    main thread (tensorboard raises it there at the next write: one line, not a traceback per
    thread); every other thread's exception goes to ``previous``."""
    from tensorboard.summary.writer import event_file_writer

    writer_thread = getattr(event_file_writer, "_AsyncWriterThread", None)

    def hook(args: threading.ExceptHookArgs) -> None:
        if writer_thread is None or not (isinstance(args.thread, writer_thread)
                                         and isinstance(args.exc_value, OSError)):
            previous(args)

    hook.tensorboard = True  # type: ignore[attr-defined]
    return hook


class TensorBoardTracker:
    """Scalars to TensorBoard event files; ``purge_step`` drops a failed run's later events."""

    def __init__(self, folder: Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.what = f"TensorBoard events ({folder})"
        if not getattr(threading.excepthook, "tensorboard", False):
            threading.excepthook = _tensorboard_thread_hook(threading.excepthook)
        self.writer = SummaryWriter(folder, purge_step=purge_step)

    def log(self, step: int, record: dict[str, Any]) -> None:
        for key, value in _values(record):
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a failed write surfaces with its record, not at the next one

    def close(self) -> None:
        self.writer.close()


class _RunIdentity:
    """Project, run name and config the trackers share, resolved once from the config."""

    def __init__(self, config: JobConfig, resume_step: int):
        m = config.metrics
        self.dump_folder = Path(config.job.dump_folder)
        self.project = m.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        self.name = m.run_name or self.dump_folder.resolve().name
        self.resume_step = resume_step
        self.config = {**to_dict(config), "resumed_from_step": resume_step}


class WandbTracker:
    """One W&B run per job (a resumed job is a new run of the group): ``WANDB_MODE=offline``
    writes it under ``dump_folder/wandb`` with no account or network (``wandb sync`` later)."""

    def __init__(self, identity: _RunIdentity, entity: str):
        self.identity, self.entity = identity, entity
        self.run: Any = None
        self.what = f"the W&B run (under {identity.dump_folder / 'wandb'})"

    def _start(self) -> None:
        import wandb

        ident = self.identity
        try:
            self.run = wandb.init(
                project=ident.project, entity=self.entity or None, name=ident.name,
                group=ident.name, dir=str(ident.dump_folder), config=ident.config,
                job_type="train")
        except Exception as e:  # no account, no network, a bad entity: the user's to fix
            raise ConfigError(f"[metrics] enable_wandb: wandb.init failed: {e} (WANDB_MODE="
                              "offline logs without an account)") from e

    def log(self, step: int, record: dict[str, Any]) -> None:
        if self.run is None:
            self._start()
        self.run.log(dict(_values(record)), step=step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()


class MlflowTracker:
    """One MLflow run per job in the experiment ``project``; the merged config as params
    (``section.key``). Without a tracking URI, a file store in ``dump_folder/mlruns``
    (``mlflow ui --backend-store-uri`` it; MLflow keeps file stores behind
    ``MLFLOW_ALLOW_FILE_STORE=true``, which this sets for that case)."""

    def __init__(self, identity: _RunIdentity, tracking_uri: str):
        self.identity = identity
        self.uri = (tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
                    or (identity.dump_folder / "mlruns").resolve().as_uri())
        self.client: Any = None
        self.run_id = ""
        self.what = f"the MLflow run ({self.uri})"

    def _start(self) -> None:
        if self.uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        ident = self.identity
        self.client = MlflowClient(tracking_uri=self.uri)
        experiment = self.client.get_experiment_by_name(ident.project)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(ident.project))
        self.run_id = self.client.create_run(experiment_id, run_name=ident.name, tags={
            "group": ident.name, "resumed_from_step": str(ident.resume_step)}).info.run_id
        params = [Param(key, str(value)) for key, value in flatten(ident.config).items()]
        for i in range(0, len(params), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=params[i: i + MLFLOW_BATCH])

    def log(self, step: int, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        if self.client is None:
            self._start()
        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, step) for key, value in _values(record)
                   if isinstance(value, (int, float))]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        if self.client is not None:
            self.client.set_terminated(self.run_id)


def flatten(config: dict[str, Any]) -> dict[str, Any]:
    """``{"training": {"steps": 5}}`` -> ``{"training.steps": 5}`` (top-level values kept)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{name}": v for name, v in value.items()})
        else:
            flat[key] = value
    return flat


EXTRAS = {"enable_wandb": ("wandb", "wandb"), "enable_mlflow": ("mlflow", "mlflow")}
"""Switch -> (module it needs, the extra that installs it)."""


def validate_trackers(config: JobConfig) -> None:
    """One line for a tracker whose package is not installed (a tracker field set while no
    tracker that reads it is on is a setting without effect: config/switches.py)."""
    m = config.metrics
    for switch, (module, extra) in EXTRAS.items():
        if getattr(m, switch) and importlib.util.find_spec(module) is None:
            raise ConfigError(f"[metrics] {switch} needs the {module} package: pip install "
                              f"'torchtitan_like[{extra}]', or set {switch} = false")


def build_trackers(config: JobConfig, resume_step: int) -> list[Tracker]:
    """The W&B and MLflow trackers the config switches on (not yet started)."""
    identity = _RunIdentity(config, resume_step)
    trackers: list[Tracker] = []
    if config.metrics.enable_wandb:
        trackers.append(WandbTracker(identity, config.metrics.wandb_entity))
    if config.metrics.enable_mlflow:
        trackers.append(MlflowTracker(identity, config.metrics.mlflow_tracking_uri))
    return trackers
