"""The checkpoint folder: discovery, publication, clean-up, and the checks made before a load
(the folder protocol is described in the package docstring)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader

from torchtitan_like.components.checkpoint.checksums import (
    ChecksumMismatch,
    Sums,
    read_checksums,
    uncovered,
)
from torchtitan_like.components.checkpoint.validate import CheckpointDamaged, CheckpointError
from torchtitan_like.logging import logger

INFO_FILE = "checkpoint.json"
_STEP_FOLDER = re.compile(r"step-(\d+)")


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
        raise CheckpointDamaged(
            f"{path} is corrupt: its {INFO_FILE} is missing or unreadable ({e})", path) from e


def checkpoint_to_load(folder: Path, load_step: int) -> Path | None:
    """The checkpoint a job resumes from: ``load_step`` if >= 0, else the newest complete one
    that holds a train state, else a seed ``step-0``; None when the folder holds none.
    CheckpointError when ``load_step`` is not there, or only model-only ones are."""
    found = step_folders(folder)
    if load_step >= 0:
        if load_step not in found:
            raise CheckpointError(
                f"[checkpoint] load_step = {load_step}: no complete checkpoint step-{load_step} "
                f"in {folder} (complete: {', '.join(map(str, found)) or 'none'})")
        return found[load_step]
    for step in reversed(found):  # the newest that can resume (older ones are not read)
        if "train_state" in read_info(found[step])["states"]:
            return found[step]
    if 0 in found:  # a seed checkpoint: the initial weights
        return found[0]
    if found:
        raise CheckpointError(
            f"{folder} holds only model-only checkpoints ({', '.join(map(str, found))}), "
            "which cannot resume training: set --checkpoint.load_step to start from one's "
            "weights, or use another dump_folder")
    return None


def finished_run(folder: Path, load_step: int, steps: int) -> str | None:
    """The line to print instead of training when the checkpoint a resume would load is at or
    past the job's last step (a finished run, restarted); None when there is work to do, or
    when the load itself should report what is wrong."""
    try:
        path = checkpoint_to_load(folder, load_step)
        info = read_info(path) if path is not None else None
    except CheckpointError:
        return None
    if info is None or "train_state" not in info["states"] or info["step"] < steps:
        return None
    return (f"nothing left to do: {path} is step {info['step']} and [training] steps = {steps}, "
            "so this run is finished; raise --training.steps to train further, or choose "
            "another dump_folder for a new run")


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


def partial_name(step: int, writer: str = "") -> str:
    """The folder a save of ``step`` writes into until it is complete: ``step-N.partial``, or
    ``step-N.<writer>.partial`` for one of several writers sharing the folder (the replica
    groups of a fault-tolerant job, each one the writer of some steps): a group starting
    again then removes only its own cut-short saves, never a live group's save in flight."""
    return f"step-{step}.{writer}.partial" if writer else f"step-{step}.partial"


def recover(folder: Path, writer: str = "") -> None:
    """Start-up clean-up (rank 0, before any save): finish an interrupted replacement and
    delete the folders of saves that never completed (``writer``'s only, when named: the
    other writers of a shared folder may be saving now)."""
    if not folder.is_dir():
        return
    for old in folder.glob("step-*.old"):
        final = old.with_name(old.name.removesuffix(".old"))
        if final.exists():
            shutil.rmtree(old)
        else:
            old.rename(final)
    for partial in folder.glob(partial_name("*", writer)):
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


def check_files(path: Path) -> tuple[Any, Sums | None]:
    """DCP's .metadata of a checkpoint and its checksums (None: saved before them), after
    checking that every file it needs is there and long enough and every stored item has a
    checksum; CheckpointDamaged otherwise."""
    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as e:  # any failure to unpickle means the same thing
        raise CheckpointDamaged(f"{path} is corrupt: its .metadata cannot be read ({e!r})",
                                path) from e
    sizes: dict[str, int] = {}
    for info in metadata.storage_data.values():
        name = info.relative_path
        if name not in sizes:
            file = path / name
            sizes[name] = file.stat().st_size if file.is_file() else -1
        if sizes[name] < 0:
            raise CheckpointDamaged(f"{path} is corrupt: data file {name} is missing", path)
        if info.offset + info.length > sizes[name]:
            raise CheckpointDamaged(
                f"{path} is corrupt: data file {name} is truncated ({sizes[name]} bytes, "
                f"{info.offset + info.length} needed)", path)
    try:
        sums = read_checksums(path)
        missing = uncovered(metadata, sums) if sums is not None else []
    except ChecksumMismatch as e:
        raise CheckpointDamaged(f"{path} is corrupt: {e}", path) from e
    if missing:
        raise CheckpointDamaged(f"{path} is corrupt: its checksums.json does not cover "
                                f"{len(missing)} stored item(s), e.g. {missing[0]}", path)
    return metadata, sums


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
