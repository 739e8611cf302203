"""Distributed checkpoints (torch.distributed.checkpoint, DCP): save, exact resume, resharding.

On disk, under ``{dump_folder}/{[checkpoint] folder}``::

    step-N/           a complete checkpoint: DCP's .metadata and __<rank>_0.distcp files,
                      plus checkpoint.json (step, what it holds, the layout and data it came from)
    step-N.partial/   a save in progress, or one cut short; never loaded, removed at start-up

**Atomic saves.** Every rank writes into ``step-N.partial``. DCP ends a save by gathering every
rank's write results at the coordinator (rank 0), which then writes .metadata; so once rank 0's
save has returned (or its async future completed), every rank's files are on disk (fsynced).
Only then does rank 0 write checkpoint.json and rename the folder to ``step-N``. The rename is
atomic: a checkpoint is either complete and visible, or invisible. A job killed mid-save leaves
a ``.partial`` folder, and its restart resumes from the previous complete checkpoint. Replacing
an existing ``step-N`` (after resuming from an earlier ``load_step``) moves the old folder to
``step-N.old`` first and deletes it only after the new one is in place.

**What a checkpoint holds.** The DCP state dict has one flat entry per state:

- ``model``: ``get_model_state_dict`` of each model part, merged. Its keys are the plain
  model's FQNs whatever the layout (FSDP/TP DTensors are saved as shards of the global tensors;
  activation-checkpoint wrappers and ``Module.compile`` leave no trace in the names), so DCP
  reshards between any two layouts at load time.
- ``optimizer``: ``get_optimizer_state_dict`` flattened (``state.<param FQN>.exp_avg``, ...):
  the same keys under every layout, pipeline stages included.
- ``lr_scheduler``: the schedule's state (identical for every model part), as JSON.
- ``dataloader``: the position in the token stream, as JSON. At a step boundary every rank's
  position is the same (components/data/datasets.py), so rank 0 saves it and every rank of any
  data-parallel degree loads it: a resumed run continues the stream where it stopped, never
  repeating or skipping a token. With the same global batch and seq_len the batches equal those
  of an uninterrupted run; with others the stream continues, cut into the new shapes.
- ``train_state``: step, tokens seen, and each rank's RNG states (under the same world size each
  rank gets its own back; otherwise rank 0's, which every rank's equals unless the model draws
  rank-dependent random numbers).

**Async saves.** ``async``: a blocking copy of the state to CPU memory, then DCP writes it from a
thread. ``async_with_pinned_mem``: the copy into pinned shared memory runs in the background
(the loop waits for it only before the next optimizer step, which would modify the copied
tensors) and a separate writer process writes it; on CPU, pinning and non-blocking copies need
an accelerator, so shared memory without pinning is used. Async saves use their own gloo
process group, so their collectives never interleave with training's. At most one save is in
flight: a new save first waits for the previous one. Old checkpoints are deleted
(``keep_latest_k``) in the background, only after a newer save is complete.

**Which checkpoint loads.** ``load_step`` if set, else the newest complete checkpoint that
holds a train state. Model-only checkpoints (``step-0`` written by ``create_seed_checkpoint`` or
scripts/convert_hf.py, and ``last_save_model_only`` exports) cannot resume training: a seed
gives the initial weights when nothing else is there, an export is loaded only when named by
``load_step``; neither is ever purged. With no checkpoint at all, ``initial_load_path`` (DCP or
HuggingFace) gives the initial weights.

**Loading.** Before anything is read, every rank checks the checkpoint: checkpoint.json and
.metadata readable, every data file present and long enough, every expected key present with
the same global shape, the data source unchanged. Any failure stops the run with a message that
says what differs and what to do; DCP itself plans all reads before reading, so nothing is
loaded from an incompatible checkpoint. Content corruption inside a data file (no checksums) is
not detected.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from torchtitan_like.components.fault_injection import FaultInjector
from torchtitan_like.components.lr_scheduler import LRSchedulersContainer
from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.utils import DTYPES
from torchtitan_like.logging import logger
from torchtitan_like.models.registry import HFAdapter

STATES = ("model", "optimizer", "lr_scheduler", "dataloader", "train_state")
INFO_FILE = "checkpoint.json"
_STEP_FOLDER = re.compile(r"step-(\d+)")
_EXCLUDE_HINT = "--checkpoint.exclude_from_loading"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be saved or loaded; the message says why and what to do."""


def validate_checkpoint(config: JobConfig, world_size: int) -> None:
    """ConfigError for every [checkpoint] setting that cannot work, before anything starts."""
    c = config.checkpoint

    def require(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(f"[checkpoint] {message}")

    require(c.interval >= 1, f"interval = {c.interval}: must be >= 1")
    require(c.keep_latest_k >= 0, f"keep_latest_k = {c.keep_latest_k}: must be >= 0 (0 = all)")
    require(c.load_step >= -1, f"load_step = {c.load_step}: must be a step >= 0, or -1 (latest)")
    require(bool(c.folder.strip()), "folder: must not be empty")
    require(c.export_dtype == "float32" or c.last_save_model_only or c.last_save_in_hf,
            f"export_dtype = {c.export_dtype} applies to a model-only last save only: set "
            "last_save_model_only = true, or last_save_in_hf = true for a HuggingFace one (a "
            "resumable checkpoint keeps the training dtype)")
    require(c.load_step == -1 or c.enable,
            f"load_step = {c.load_step} needs enable = true (nothing is loaded otherwise)")
    if c.create_seed_checkpoint:
        require(c.enable, "create_seed_checkpoint needs enable = true")
        require(world_size == 1, f"create_seed_checkpoint runs in one process (the seed must "
                f"not depend on a layout), not {world_size}: run it with NPROC=1")
    if c.initial_load_in_hf:
        require(bool(c.initial_load_path), "initial_load_in_hf needs initial_load_path")
    if c.initial_load_path:
        path = Path(c.initial_load_path)
        if c.initial_load_in_hf:
            from torchtitan_like.models.registry import get_model_spec

            require(get_model_spec(config.model.name).hf_adapter is not None,
                    f"initial_load_in_hf: model {config.model.name!r} has no HuggingFace adapter")
            require((path / "config.json").is_file() and any(path.glob("*.safetensors")),
                    f"initial_load_path = {path}: no config.json and *.safetensors there "
                    "(a HuggingFace model folder is expected with initial_load_in_hf)")
        else:
            require((path / ".metadata").is_file(),
                    f"initial_load_path = {path}: no DCP checkpoint there (no .metadata file); "
                    "for a HuggingFace folder set initial_load_in_hf = true")


# --- the states, each a Stateful with a flat state dict (so DCP keys are "<state>.<key>") ---


class _ModelState:
    """The model parts as one state dict of plain-model FQNs (optionally cast on save)."""

    def __init__(self, parts: list[nn.Module], dtype: torch.dtype | None = None):
        self.parts = parts
        self.dtype = dtype

    def state_dict(self) -> dict[str, Any]:
        merged = {k: v for part in self.parts for k, v in get_model_state_dict(part).items()}
        if self.dtype is not None:
            merged = {k: v.to(self.dtype) for k, v in merged.items()}
        return merged

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Each part takes its own keys (a pipeline stage has only its modules).
        for part in self.parts:
            set_model_state_dict(part, state_dict, options=StateDictOptions(strict=False))


class _OptimizerState:
    """One flattened optimizer state dict over all parts: keys name parameters by FQN."""

    _OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

    def __init__(self, parts: list[nn.Module], optimizers: OptimizersContainer):
        self.pairs = list(zip(parts, optimizers.optimizers, strict=True))

    def state_dict(self) -> dict[str, Any]:
        return {k: v for part, opt in self.pairs
                for k, v in get_optimizer_state_dict(part, opt, options=self._OPTIONS).items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part, opt in self.pairs:
            set_optimizer_state_dict(part, opt, state_dict, options=self._OPTIONS)


class _JSONState:
    """A small Python state (scheduler, dataloader position) stored as one JSON string."""

    def __init__(self, get: Callable[[], Any], put: Callable[[Any], None]):
        self.get, self.put = get, put

    def state_dict(self) -> dict[str, Any]:
        return {"json": json.dumps(self.get())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.put(json.loads(state_dict["json"]))


def _lr_scheduler_state(schedulers: LRSchedulersContainer) -> _JSONState:
    def put(state: dict[str, Any]) -> None:
        for scheduler in schedulers.schedulers:
            scheduler.load_state_dict(dict(state))

    return _JSONState(lambda: schedulers.schedulers[0].state_dict(), put)


class _TrainState:
    """The owner's ``state_dict`` (step, tokens seen) plus this rank's RNG states."""

    def __init__(self, owner: Any, rank: int, device: torch.device):
        self.owner, self.rank, self.device = owner, rank, device
        # Set by the loader: whose RNG states to load, and whether the checkpoint has CUDA's
        # (not when it was saved on CPU).
        self.rng_source = rank
        self.device_rng = device.type == "cuda"

    def state_dict(self) -> dict[str, Any]:
        state = {**self.owner.state_dict(), f"rng_cpu.rank{self.rng_source}": torch.get_rng_state()}
        if self.device_rng:
            state[f"rng_cuda.rank{self.rng_source}"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        rng = {k: state_dict.pop(k) for k in list(state_dict) if k.startswith("rng_")}
        self.owner.load_state_dict(state_dict)
        torch.set_rng_state(rng[f"rng_cpu.rank{self.rng_source}"])
        if self.device_rng:
            torch.cuda.set_rng_state(rng[f"rng_cuda.rank{self.rng_source}"], self.device)


# --- the folder: discovery, publication, clean-up ---


def step_folders(folder: Path) -> dict[int, Path]:
    """The complete checkpoints in ``folder`` by step (a ``step-N`` folder exists only once
    its save completed)."""
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.iterdir():
        match = _STEP_FOLDER.fullmatch(path.name)
        if match and path.is_dir():
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def read_info(path: Path) -> dict[str, Any]:
    """A complete checkpoint's checkpoint.json; CheckpointError if missing or unreadable."""
    try:
        info = json.loads((path / INFO_FILE).read_text())
        if not isinstance(info, dict) or not {"step", "states"} <= info.keys():
            raise ValueError("not a checkpoint description")
        return info
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"{path} is corrupt: its {INFO_FILE} is missing or unreadable ({e}). Delete or move "
            "the folder to resume from an earlier checkpoint, or choose one with "
            "--checkpoint.load_step") from e


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(partial: Path, final: Path, info: dict[str, Any]) -> None:
    """Make a fully written checkpoint visible: checkpoint.json, then an atomic rename."""
    with (partial / INFO_FILE).open("w") as f:
        json.dump(info, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    old = final.with_name(final.name + ".old")
    if final.exists():  # a checkpoint of this step from before an earlier load_step
        final.rename(old)
    partial.rename(final)
    _fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def recover(folder: Path) -> None:
    """Start-up clean-up (rank 0, before any save): finish an interrupted replacement and
    delete the folders of saves that never completed."""
    if not folder.is_dir():
        return
    for old in folder.glob("step-*.old"):
        final = old.with_name(old.name.removesuffix(".old"))
        if final.exists():
            shutil.rmtree(old)
        else:
            old.rename(final)
    for partial in folder.glob("step-*.partial"):
        logger.info(f"checkpoint: removing {partial.name}, a save that never completed")
        shutil.rmtree(partial)


def purge(folder: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest resumable checkpoints (model-only ones, i.e. seeds
    and exports, are kept). Called after a save completed, so what goes is superseded."""
    if keep <= 0:
        return
    resumable = []
    for path in step_folders(folder).values():
        try:
            if "train_state" in read_info(path)["states"]:
                resumable.append(path)
        except CheckpointError as e:  # not ours to judge: left in place
            logger.warning(f"checkpoint: not purging {path.name}: {e}")
    for path in resumable[:-keep]:
        logger.info(f"checkpoint: deleting {path.name} (keep_latest_k = {keep})")
        shutil.rmtree(path, ignore_errors=True)


def check_files(path: Path) -> Any:
    """DCP's .metadata of a checkpoint, after checking that every file it needs is there and
    long enough; CheckpointError otherwise."""
    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as e:  # any failure to unpickle means the same thing
        raise CheckpointError(f"{path} is corrupt: its .metadata cannot be read ({e!r})") from e
    sizes: dict[str, int] = {}
    for info in metadata.storage_data.values():
        name = info.relative_path
        if name not in sizes:
            file = path / name
            sizes[name] = file.stat().st_size if file.is_file() else -1
        if sizes[name] < 0:
            raise CheckpointError(f"{path} is corrupt: data file {name} is missing")
        if info.offset + info.length > sizes[name]:
            raise CheckpointError(
                f"{path} is corrupt: data file {name} is truncated ({sizes[name]} bytes, "
                f"{info.offset + info.length} needed)")
    return metadata


def check_keys(template: dict[str, dict[str, Any]], metadata: Any, where: str) -> None:
    """Every entry the template expects is in the checkpoint, tensors with the same global
    shape; CheckpointError listing what differs otherwise."""
    saved = metadata.state_dict_metadata
    missing, shapes = [], []
    for name, state in template.items():
        for key, value in state.items():
            fqn = f"{name}.{key}"
            if fqn not in saved:
                missing.append(fqn)
            elif isinstance(value, torch.Tensor) and hasattr(saved[fqn], "size") \
                    and tuple(saved[fqn].size) != tuple(value.shape):
                shapes.append(f"{fqn}: saved {list(saved[fqn].size)}, here {list(value.shape)}")
    if missing or shapes:
        problems = ([f"{len(missing)} missing, e.g. " + ", ".join(missing[:4])] if missing
                    else []) + ([f"{len(shapes)} of another shape, e.g. " + "; ".join(shapes[:3])]
                                if shapes else [])
        raise CheckpointError(f"{where} does not fit this job: {'; '.join(problems)}")


def _data_source(config: JobConfig) -> dict[str, Any]:
    """What a saved stream position refers to: the same documents, split and tokenization."""
    t = config.training
    return {"dataset": t.dataset, "dataset_path": t.dataset_path,
            "dataset_text_field": t.dataset_text_field, "holdout_every": t.holdout_every,
            "tokenizer_path": config.model.tokenizer_path}


@dataclasses.dataclass
class SaveRecord:
    """How one save went: ``blocked_s`` is the time the training loop waited for it."""

    step: int
    mode: str
    blocked_s: float = 0.0
    written_s: float | None = None
    """Seconds from the start of the save until it was complete and visible."""


class CheckpointManager:
    """Saves and loads the trainer's state; all logic of checkpointing lives here.

    The trainer calls ``load()`` once after building everything, ``save(step, last)`` at the end
    of every step, ``close()`` after the loop, and ``create_seed()`` for
    ``create_seed_checkpoint``. ``train_state`` is the trainer (its ``state_dict`` holds step and
    tokens seen).
    """

    def __init__(
        self,
        config: JobConfig,
        *,
        parallel_dims: ParallelDims,
        model_parts: list[nn.Module],
        optimizers: OptimizersContainer,
        lr_schedulers: LRSchedulersContainer,
        dataloader: Any,
        train_state: Any,
        device: torch.device,
        faults: FaultInjector,
        hf_adapter: HFAdapter | None = None,
    ):
        self.config = config
        self.c = config.checkpoint
        self.folder = Path(config.job.dump_folder) / self.c.folder
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.parallel_dims = parallel_dims
        self.faults = faults
        self.hf_adapter = hf_adapter
        self.model_parts = model_parts
        self.train_state = _TrainState(train_state, self.rank, device)
        self.states: dict[str, Any] = {
            "model": _ModelState(model_parts),
            "optimizer": _OptimizerState(model_parts, optimizers),
            "lr_scheduler": _lr_scheduler_state(lr_schedulers),
            "dataloader": _JSONState(dataloader.state_dict, dataloader.load_state_dict),
            "train_state": self.train_state,
        }
        self.records: list[SaveRecord] = []
        self.loaded_from: Path | None = None
        self._in_flight: Future | None = None
        self._staging: Future | None = None
        self._stager: DefaultStager | None = None
        needed = self.c.enable or bool(self.c.initial_load_path)
        # Checkpoint collectives (DCP's plans, the load checks) run on their own gloo group: a
        # CPU group for NCCL jobs, and one that async saves' threads never share with training.
        self.pg = dist.new_group(backend="gloo") if needed else None
        self._background = ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
        if self.c.enable and self.c.async_mode == "async_with_pinned_mem":
            self._stager = DefaultStager(self._staging_options(device))
            for optimizer in optimizers.optimizers:
                optimizer.register_step_pre_hook(self._wait_for_staging)

    @staticmethod
    def _staging_options(device: torch.device) -> StagingOptions:
        """Pinned memory and non-blocking copies on an accelerator; on CPU (where both need
        one) plain shared memory, still staged in the background."""
        accelerator = device.type != "cpu"
        return StagingOptions(use_pinned_memory=accelerator, use_shared_memory=True,
                              use_async_staging=True, use_non_blocking_copy=accelerator)

    # --- loading ---

    def load(self) -> None:
        """Resume from the latest complete checkpoint (or ``load_step``), else load the initial
        weights (``initial_load_path``), else leave the fresh initialisation."""
        if self.pg is None:
            return
        if self.rank == 0 and self.c.enable:
            recover(self.folder)
        dist.barrier(group=self.pg)
        if self.c.create_seed_checkpoint:
            found = step_folders(self.folder)
            if found:
                raise CheckpointError(
                    f"create_seed_checkpoint writes step-0 into an empty folder, but {self.folder} "
                    f"holds step(s) {', '.join(map(str, found))}; use another dump_folder")
            return
        path = self._choose() if self.c.enable else None
        if path is not None:
            self._resume(path)
        elif self.c.initial_load_path:
            self._load_initial(Path(self.c.initial_load_path))

    def _choose(self) -> Path | None:
        found = step_folders(self.folder)
        if self.c.load_step >= 0:
            if self.c.load_step not in found:
                raise CheckpointError(
                    f"[checkpoint] load_step = {self.c.load_step}: no complete checkpoint "
                    f"step-{self.c.load_step} in {self.folder} (complete: "
                    f"{', '.join(map(str, found)) or 'none'})")
            later = [s for s in found if s > self.c.load_step]
            if later:
                logger.warning(f"checkpoint: resuming from step {self.c.load_step}; the later "
                               f"checkpoints {later} will be replaced as this run saves")
            return found[self.c.load_step]
        for step in reversed(found):  # the newest that can resume (older ones are not read)
            if "train_state" in read_info(found[step])["states"]:
                return found[step]
        if 0 in found:  # a seed checkpoint: the initial weights
            return found[0]
        if found:
            raise CheckpointError(
                f"{self.folder} holds only model-only checkpoints ({', '.join(map(str, found))}), "
                "which cannot resume training: set --checkpoint.load_step to start from one's "
                "weights, or use another dump_folder")
        return None

    def _resume(self, path: Path) -> None:
        info = read_info(path)
        excluded = set(self.c.exclude_from_loading)
        names = [n for n in STATES if n in info["states"] and n not in excluded]
        where = f"checkpoint {path}"
        if info.get("world_size") != self.world_size:
            self.train_state.rng_source = 0
        problem = None
        try:
            if "dataloader" in names:
                self._check_data(info, where)
            metadata = check_files(path)
            cuda_rng = f"train_state.rng_cuda.rank{self.train_state.rng_source}"
            self.train_state.device_rng &= cuda_rng in metadata.state_dict_metadata
            template = {n: self.states[n].state_dict() for n in names}
            check_keys(template, metadata, where + self._model_hint(info))
        except CheckpointError as e:
            problem = e
        self._agree(problem)
        self._dcp_load({n: self.states[n] for n in names}, str(path), where)
        self.loaded_from = path
        step = info["step"] if "train_state" in names else 0
        skipped = sorted(set(STATES) - set(names))
        logger.info(f"checkpoint: loaded {', '.join(names)} from {path} (step {info['step']}, "
                    f"saved by {info.get('world_size')} process(es)); training continues "
                    f"after step {step}" + (f"; not loaded: {', '.join(skipped)}" if skipped
                                            else ""))

    def _model_hint(self, info: dict[str, Any]) -> str:
        saved, here = info.get("model", {}), self.config.model
        if saved and (saved.get("name"), saved.get("flavor")) != (here.name, here.flavor):
            return (f" (saved by [model] {saved.get('name')}/{saved.get('flavor')}, this job "
                    f"runs {here.name}/{here.flavor})")
        return ""

    def _check_data(self, info: dict[str, Any], where: str) -> None:
        saved, here = info.get("data", {}), _data_source(self.config)
        changed = [f"{k}: saved {saved.get(k)!r}, now {v!r}" for k, v in here.items()
                   if saved.get(k) != v]
        if changed:
            raise CheckpointError(
                f"{where}: its data-stream position refers to other data ({'; '.join(changed)}). "
                f"To start the new data from its beginning, do not load that position: "
                f"{_EXCLUDE_HINT}=dataloader (or exclude_from_loading = [\"dataloader\"])")
        shape = (self.global_batch_size, self.config.training.seq_len)
        saved_shape = (info.get("global_batch_size"), info.get("seq_len"))
        if saved_shape != shape:
            logger.info(f"checkpoint: (global batch, seq_len) changed from {saved_shape} to "
                        f"{shape}: the token stream continues where it stopped, cut into the new "
                        "shapes (no token repeated or skipped)")

    def _agree(self, problem: CheckpointError | None) -> None:
        """All ranks stop together if any found a problem (none is left waiting in DCP)."""
        flag = torch.tensor([0 if problem is None else 1])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.pg)
        if problem is not None:
            raise problem
        if flag.item():
            raise CheckpointError("another rank found the checkpoint unusable (see its error)")

    def _dcp_load(self, state: dict[str, Any], checkpoint_id: str | None, where: str,
                  **kwargs: Any) -> None:
        try:
            dcp.load(state, checkpoint_id=checkpoint_id, process_group=self.pg, **kwargs)
        except Exception as e:
            raise CheckpointError(f"loading {where} failed, the run stops: {e}") from e

    def _load_initial(self, path: Path) -> None:
        """The initial weights: a DCP checkpoint's model, or a HuggingFace folder."""
        model = self.states["model"]
        problem = None
        if self.c.initial_load_in_hf:
            template: dict[str, Any] = {}
            try:
                self.hf_adapter.check_config(json.loads((path / "config.json").read_text()))
                template = self.hf_adapter.to_hf(model.state_dict())
            except (ConfigError, OSError, ValueError) as e:
                problem = CheckpointError(f"initial_load_path {path}: {e}")
            self._agree(problem)
            self._dcp_load(template, None, f"HuggingFace weights {path}",
                           storage_reader=dcp.HuggingFaceStorageReader(str(path)))
            model.load_state_dict(self.hf_adapter.from_hf(template))
        else:
            try:
                check_keys({"model": model.state_dict()}, check_files(path),
                           f"initial_load_path {path}")
            except CheckpointError as e:
                problem = e
            self._agree(problem)
            self._dcp_load({"model": model}, str(path), f"initial_load_path {path}")
        logger.info(f"checkpoint: initial weights loaded from {path}")

    # --- saving ---

    @property
    def global_batch_size(self) -> int:
        t = self.config.training
        return (t.global_batch_size if t.global_batch_size != -1
                else t.local_batch_size * self.parallel_dims.dp)

    def _info(self, step: int, states: list[str], dtype: str) -> dict[str, Any]:
        return {
            "step": step,
            "states": states,
            "dtype": dtype,
            "model": {"name": self.config.model.name, "flavor": self.config.model.flavor},
            "world_size": self.world_size,
            "layout": {k: v for k, v in dataclasses.asdict(self.parallel_dims).items()
                       if k != "world_size"},
            "data": _data_source(self.config),
            "global_batch_size": self.global_batch_size,
            "seq_len": self.config.training.seq_len,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__,
        }

    def save(self, step: int, last: bool = False) -> None:
        """Save after ``step`` when due: every ``interval`` steps and after the last one."""
        if not self.c.enable or not (last or step % self.c.interval == 0):
            return
        self._wait()
        start = time.perf_counter()
        if last and self.c.last_save_model_only:
            dtype = self.c.export_dtype
            states = {"model": _ModelState(self.model_parts, DTYPES[dtype])}
        else:
            dtype, states = self.config.training.dtype, dict(self.states)
            if self.rank != 0:  # the stream position is every rank's: rank 0 writes it
                states["dataloader"] = {}
        mode = "disabled" if last else self.c.async_mode  # the last save is waited for anyway
        record = SaveRecord(step, mode)
        self.records.append(record)
        partial = self.folder / f"step-{step}.partial"
        writer = self.faults.storage_writer(str(partial), step) or FileSystemWriter(str(partial))
        info = self._info(step, [n for n in STATES if n in states], dtype)
        if mode == "disabled":
            dcp.save(states, storage_writer=writer, process_group=self.pg)
            upload: Future = Future()
            upload.set_result(None)
        elif mode == "async":
            upload = dcp.async_save(states, storage_writer=writer, process_group=self.pg,
                                    async_checkpointer_type=AsyncCheckpointerType.THREAD)
        else:
            response = dcp.async_save(states, storage_writer=writer, process_group=self.pg,
                                      async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                                      async_stager=self._stager)
            self._staging, upload = response.staging_completion, response.upload_completion
        self._in_flight = self._background.submit(self._finish, upload, partial, info, record,
                                                  start)
        record.blocked_s += time.perf_counter() - start
        logger.info(f"checkpoint step {step}: {mode if mode != 'disabled' else 'sync'} save "
                    f"of {', '.join(states)}; the loop waited {record.blocked_s:.3f} s")
        if last:
            self._wait()

    def _finish(self, upload: Future, partial: Path, info: dict[str, Any], record: SaveRecord,
                start: float) -> None:
        """In the background: once the save completed everywhere, rank 0 publishes it and
        deletes what it supersedes."""
        upload.result()
        if self.rank == 0:
            publish(partial, self.folder / f"step-{info['step']}", info)
            purge(self.folder, self.c.keep_latest_k)
            logger.info(f"checkpoint step {info['step']}: complete after "
                        f"{time.perf_counter() - start:.2f} s")
        record.written_s = time.perf_counter() - start

    def _wait_for_staging(self, *_: Any) -> None:
        """Before an optimizer step: the background copy of the last save must be done."""
        if self._staging is not None:
            start = time.perf_counter()
            self._staging.result()
            self._staging = None
            self.records[-1].blocked_s += time.perf_counter() - start

    def _wait(self) -> None:
        """Wait for the save in flight (at most one); raise if it failed."""
        if self._in_flight is None:
            return
        start = time.perf_counter()
        try:
            self._in_flight.result()
        except Exception as e:
            raise CheckpointError(f"the checkpoint save failed: {e!r}") from e
        finally:
            self._in_flight, self._staging = None, None
        if self.records:
            self.records[-1].blocked_s += time.perf_counter() - start

    def create_seed(self) -> bool:
        """With ``create_seed_checkpoint``: save the initial weights as step-0 (model only)."""
        if not self.c.create_seed_checkpoint:
            return False
        partial = self.folder / "step-0.partial"  # one process (validate_checkpoint)
        dcp.save({"model": self.states["model"]}, storage_writer=FileSystemWriter(str(partial)),
                 process_group=self.pg)
        publish(partial, self.folder / "step-0",
                self._info(0, ["model"], self.config.training.dtype))
        logger.info(f"checkpoint: seed checkpoint written to {self.folder / 'step-0'}")
        return True

    def close(self) -> None:
        """Wait for the last save and release the background machinery."""
        self._wait()
        self._background.shutdown()
        if self._stager is not None:
            self._stager.close()
