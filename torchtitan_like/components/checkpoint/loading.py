"""Loading a checkpoint (the loading half of the checkpoint manager): which one, the checks
before reading, the checksums while reading, and what happens to a damaged one.

**Every rank decides alike.** The checks before reading run on every rank; the ranks exchange
their findings (``agree``) and all raise the first failing rank's error, so no rank is left
waiting in DCP and the launcher's line is that error whichever rank it reads. A checksum
mismatch found inside DCP's read reaches every rank through DCP's own exception gathering.

**A damaged checkpoint** (a file missing or truncated, an unreadable .metadata or
checkpoint.json, bytes that fail their checksum, checkpoint/checksums.py) stops the job with one
``checkpoint error:`` line naming the step, the file and the damage (exit 4) unless
``[checkpoint] fallback_on_damage``: then the newest earlier complete checkpoint that can resume
is loaded instead, with a warning, and the damaged folder is kept aside as ``step-N.damaged``
(never loaded or purged). Every state is loaded again from the earlier checkpoint, so what the
damaged one's read had already copied is overwritten. A damaged HuggingFace folder or
``initial_load_path`` has no earlier one: it stops the job.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException

from torchtitan_like.components.checkpoint.checksums import (
    ChecksumMismatch,
    ChecksumReader,
    note_unverified,
)
from torchtitan_like.components.checkpoint.failure import load_failure
from torchtitan_like.components.checkpoint.folder import (
    check_files,
    check_keys,
    checkpoint_to_load,
    read_info,
    step_folders,
)
from torchtitan_like.components.checkpoint.hf_checksums import check_folder
from torchtitan_like.components.checkpoint.validate import CheckpointDamaged, CheckpointError
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.logging import logger
from torchtitan_like.protocols.hf_adapter import HFAdapter

STATES = ("model", "optimizer", "lr_scheduler", "dataloader", "train_state")
_EXCLUDE_HINT = "--checkpoint.exclude_from_loading"
FALLBACK_HINT = ("to resume from the newest earlier complete checkpoint instead, set "
                 "[checkpoint] fallback_on_damage = true (or choose one with "
                 "--checkpoint.load_step)")


def data_source(config: JobConfig) -> dict[str, Any]:
    """What a saved stream position refers to: the same documents, split and tokenization."""
    t = config.training
    return {"dataset": t.dataset, "dataset_path": t.dataset_path,
            "dataset_text_field": t.dataset_text_field, "holdout_every": t.holdout_every,
            "tokenizer_path": config.model.tokenizer_path}


def agree(problem: CheckpointError | None, pg: Any, path: Path | None = None) -> None:
    """All ranks stop together, with the first failing rank's error, if any found one
    (damage: of the checkpoint ``path``)."""
    found: list[Any] = [None] * dist.get_world_size(pg)
    mine = None if problem is None else (isinstance(problem, CheckpointDamaged), str(problem))
    dist.all_gather_object(found, mine, group=pg)
    if problem is not None:
        raise problem
    first = next((f for f in found if f is not None), None)
    if first is not None:
        damaged, message = first
        raise CheckpointDamaged(message, path) if damaged else CheckpointError(message)


def _earlier_resumable(folder: Path, step: int) -> Path | None:
    """The newest complete checkpoint before ``step`` that can resume training (one whose
    checkpoint.json cannot be read is passed over)."""
    for earlier, path in reversed(step_folders(folder).items()):
        try:
            if earlier < step and "train_state" in read_info(path)["states"]:
                return path
        except CheckpointError:
            continue
    return None


def _step(path: Path) -> int:
    return int(path.name.removeprefix("step-"))


class CheckpointLoader:
    """Loads a job's states (``states``: name -> Stateful) from its checkpoint folder or its
    initial weights, on the checkpoint process group ``pg``."""

    def __init__(self, config: JobConfig, folder: Path, states: dict[str, Any], pg: Any,
                 train_state: Any, global_batch_size: int,
                 hf_adapter: HFAdapter | None = None):
        self.config, self.c, self.folder = config, config.checkpoint, folder
        self.states, self.pg, self.train_state = states, pg, train_state
        self.global_batch_size, self.hf_adapter = global_batch_size, hf_adapter
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def resume(self) -> Path | None:
        """Load the checkpoint to resume from (``load_step``, else the newest), or an earlier
        one after damage when allowed (module docstring); None when there is none."""
        try:
            path = self._choose()
        except CheckpointDamaged as e:  # the newest's checkpoint.json
            path = self._fall_back(e)
        while path is not None:
            try:
                self._resume(path)
                return path
            except CheckpointDamaged as e:
                path = self._fall_back(e)
        return None

    def _choose(self) -> Path | None:
        path = checkpoint_to_load(self.folder, self.c.load_step)
        if self.c.load_step >= 0:
            later = [s for s in step_folders(self.folder) if s > self.c.load_step]
            if later:
                logger.warning(f"checkpoint: resuming from step {self.c.load_step}; the later "
                               f"checkpoints {later} will be replaced as this run saves")
        return path

    def _fall_back(self, error: CheckpointDamaged) -> Path:
        """The checkpoint to load instead of the damaged ``error.path``, which is set aside;
        the error (with what to do) when falling back is not allowed or there is none."""
        damaged = error.path
        if not self.c.fallback_on_damage or damaged is None:
            raise CheckpointDamaged(f"{error}; {FALLBACK_HINT}", damaged) from error
        earlier = _earlier_resumable(self.folder, _step(damaged))
        if earlier is None:
            raise CheckpointDamaged(f"{error}; no earlier complete checkpoint to fall back to "
                                    "([checkpoint] fallback_on_damage)", damaged) from error
        aside = damaged.with_name(damaged.name + ".damaged")
        while aside.exists():
            aside = aside.with_name(aside.name + "-1")
        if self.rank == 0:
            damaged.rename(aside)
        dist.barrier(group=self.pg)
        logger.warning(f"checkpoint: {error}; falling back to {earlier.name} "
                       f"([checkpoint] fallback_on_damage = true); the damaged checkpoint is "
                       f"kept as {aside.name}")
        return earlier

    def _resume(self, path: Path) -> None:
        try:
            info = read_info(path)
        except CheckpointError as e:
            raise CheckpointDamaged(str(e), path) from e
        excluded = set(self.c.exclude_from_loading)
        names = [n for n in STATES if n in info["states"] and n not in excluded]
        where = f"step {info['step']} ({path})"
        if info.get("world_size") != self.world_size:
            self.train_state.rng_source = 0
        problem, sums = None, None
        try:
            if "dataloader" in names:
                self._check_data(info, where)
            metadata, sums = check_files(path)
            cuda_rng = f"train_state.rng_cuda.rank{self.train_state.rng_source}"
            self.train_state.device_rng &= cuda_rng in metadata.state_dict_metadata
            template = {n: self.states[n].state_dict() for n in names}
            check_keys(template, metadata, where + self._model_hint(info))
        except CheckpointDamaged as e:
            problem = CheckpointDamaged(f"step {info['step']}: {e}", path)
        except CheckpointError as e:
            problem = e
        agree(problem, self.pg, path)
        if sums is None and self.rank == 0:
            note_unverified(path)
        self._dcp_load({n: self.states[n] for n in names}, where, path,
                       storage_reader=ChecksumReader(path, sums))
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
        optimizer = self.config.optimizer.name
        if info.get("optimizer", optimizer) != optimizer:  # its states are another's
            return (f" (saved with [optimizer] name = {info['optimizer']!r}, this job uses "
                    f"{optimizer!r}; to start its states afresh: {_EXCLUDE_HINT}=optimizer)")
        return ""

    def _check_data(self, info: dict[str, Any], where: str) -> None:
        saved, here = info.get("data", {}), data_source(self.config)
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

    def _dcp_load(self, state: dict[str, Any], where: str, path: Path | None = None,
                  **kwargs: Any) -> None:
        try:
            dcp.load(state, process_group=self.pg, **kwargs)
        except (Exception, CheckpointException) as e:  # the latter is a BaseException
            raise load_failure(e, where, path) from e

    def load_initial(self, path: Path) -> None:
        """The initial weights: a DCP checkpoint's model, or a HuggingFace folder."""
        model = self.states["model"]
        problem: CheckpointError | None = None
        if self.c.initial_load_in_hf:
            template: dict[str, Any] = {}
            verified = False
            try:
                self.hf_adapter.check_config(json.loads((path / "config.json").read_text()))
                template = self.hf_adapter.to_hf(model.state_dict())
                verified = check_folder(path, self.rank, self.world_size)
            except ChecksumMismatch as e:
                problem = CheckpointDamaged(f"HuggingFace weights {path} are damaged: {e}")
            except (ConfigError, OSError, ValueError) as e:
                problem = CheckpointError(f"initial_load_path {path}: {e}")
            agree(problem, self.pg)
            if not verified and self.rank == 0:
                logger.info(f"checkpoint: HuggingFace weights {path} carry no checksums (not "
                            "written by torchtitan_like): their bytes load unverified")
            self._dcp_load(template, f"HuggingFace weights {path}",
                           storage_reader=dcp.HuggingFaceStorageReader(str(path)))
            model.load_state_dict(self.hf_adapter.from_hf(template))
        else:
            sums = None
            try:
                metadata, sums = check_files(path)
                check_keys({"model": model.state_dict()}, metadata, f"initial_load_path {path}")
            except CheckpointError as e:
                problem = e
            agree(problem, self.pg)
            if sums is None and self.rank == 0:
                note_unverified(path)
            self._dcp_load({"model": model}, f"initial_load_path {path}",
                           storage_reader=ChecksumReader(path, sums))
        logger.info(f"checkpoint: initial weights loaded from {path}")
