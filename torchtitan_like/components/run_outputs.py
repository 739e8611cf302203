"""The run-folder rule: one run's outputs per dump folder, and ``[job] overwrite``.

**A run that starts at step 0** (no ``[checkpoint] enable``, no resumable checkpoint,
``train_state`` excluded) refuses to start in a folder holding another run's ``metrics.jsonl``,
TensorBoard events, or (when it does not manage checkpoints itself) checkpoints: mixed outputs
would make TensorBoard and metrics.jsonl disagree and a later resume load another run's state.
A resumed run continues the folder (records and events past the checkpoint are dropped,
components/metrics.py).

**``[job] overwrite = true`` is a fresh run**: whatever the folder holds (a resumable
checkpoint too) belongs to another run, which is moved whole to ``{dump_folder}/archive/<time>/``
(its metrics.jsonl, config.toml, TensorBoard events, every entry of the checkpoint folder and the
fault-injection markers; nothing is deleted), and the job starts at step 0. A seed checkpoint
(``step-0``, model only) stays: it is where a fresh run of this folder starts. The moves are
renames within one file system, checked before the first: an output that cannot be moved (on
another file system, in a folder that is not writable) refuses the job with one line, and a
move that fails halfway is undone, so an archive is complete or not made. Under
``[fault_tolerance]`` the checkpoint folder is the job's, shared by its replica groups: a
group's ``overwrite`` archives its own folder's outputs only when it does not resume
(docs/fault-tolerance.md).

The rule runs before torchrun starts (preflight.py) and again in the job under the lock
(run_folder.claimed), where a restarted attempt of a job that applied it already continues its
own outputs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

from torchtitan_like.components import storage
from torchtitan_like.components.checkpoint.folder import read_info, step_folders
from torchtitan_like.components.checkpoint.validate import CheckpointError
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.logging import logger

ARCHIVE = "archive"
CONFIG_COPY = "config.toml"


def fresh_run(config: JobConfig) -> bool:
    """``[job] overwrite``: the job starts at step 0 whatever the folder holds (the module
    docstring; not under fault tolerance, whose checkpoints are the job's)."""
    return config.job.overwrite and not config.fault_tolerance.enable


def is_restart() -> bool:
    """A restarted attempt of a torchrun job (torchrun's restart count above 0)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0


def resumes(config: JobConfig) -> bool:
    """Whether the job continues a run of its folder: the checkpoint it would load (load_step,
    else the newest) holds a train state that is loaded. A checkpoint that cannot be read
    counts as one: loading reports it (exit 4) before anything is written."""
    c = config.checkpoint
    if fresh_run(config) or not c.enable or "train_state" in c.exclude_from_loading:
        return False
    found = step_folders(Path(config.job.dump_folder) / c.folder)
    if c.load_step >= 0:
        found = {c.load_step: found[c.load_step]} if c.load_step in found else {}
        if not found:
            return True  # the checkpoint manager names what is missing
    for path in reversed(found.values()):
        try:
            if "train_state" in read_info(path)["states"]:
                return True
        except CheckpointError:
            return True
    return False


def earlier_outputs(config: JobConfig) -> list[Path]:
    """What another run left in the dump folder that a run starting at step 0 would mix with:
    metrics.jsonl, TensorBoard event files, and checkpoints unless this run manages them."""
    dump = Path(config.job.dump_folder)
    metrics = dump / "metrics.jsonl"
    found = [metrics] if metrics.is_file() and metrics.stat().st_size > 0 else []
    tb = dump / config.metrics.save_tb_folder
    found += sorted(tb.glob("events.out.tfevents.*")) if tb.is_dir() else []
    checkpoints = dump / config.checkpoint.folder
    if not config.checkpoint.enable and checkpoints.is_dir():
        found += sorted(p for p in checkpoints.glob("step-*") if p.is_dir())
    return found


def _seed(path: Path, config: JobConfig) -> bool:
    """A seed checkpoint this job starts from (kept by an overwrite)."""
    c = config.checkpoint
    if path.name != "step-0" or not c.enable or c.create_seed_checkpoint:
        return False
    try:
        return "train_state" not in read_info(path)["states"]
    except CheckpointError:
        return False


def _overwritten(config: JobConfig) -> list[Path]:
    """Everything another run left (a fresh run's archive): metrics.jsonl, TensorBoard events,
    every entry of the checkpoint folder but a seed, and the config copy."""
    found = earlier_outputs(config)
    checkpoints = Path(config.job.dump_folder) / config.checkpoint.folder
    if config.checkpoint.enable and checkpoints.is_dir():
        found += sorted(p for p in checkpoints.iterdir() if not _seed(p, config))
    return found


def _summary(outputs: list[Path]) -> str:
    names = [p.name for p in outputs]
    events = sum(n.startswith("events.out.tfevents.") for n in names)
    checkpoints = sum(n.startswith("step-") for n in names)
    parts = [n for n in ("metrics.jsonl", CONFIG_COPY) if n in names] + \
        ([f"{events} TensorBoard event file(s)"] if events else []) + \
        ([f"{checkpoints} checkpoint(s)"] if checkpoints else [])
    return ", ".join(parts)


def _why_step_0(config: JobConfig) -> str:
    c = config.checkpoint
    if not c.enable:
        return "[checkpoint] enable = false"
    if "train_state" in c.exclude_from_loading:
        return "train_state is excluded from loading"
    return f"no resumable checkpoint in {Path(config.job.dump_folder) / c.folder}"


def check_fresh_start(config: JobConfig) -> list[Path]:
    """The outputs to archive before the job starts (none for a resumed run); ConfigError
    when a run starting at step 0 finds another run's outputs and ``[job] overwrite`` is off."""
    if fresh_run(config):
        outputs = _overwritten(config)
    elif resumes(config):
        return []
    else:
        outputs = earlier_outputs(config)
    if outputs and not config.job.overwrite:
        dump = config.job.dump_folder
        raise ConfigError(
            f"[job] dump_folder = {dump} holds another run's outputs ({_summary(outputs)}) "
            f"and this run starts at step 0 ({_why_step_0(config)}): set [job] overwrite = true "
            f"to move them to {dump}/{ARCHIVE}/ first, or choose another dump_folder")
    config_copy = Path(config.job.dump_folder) / CONFIG_COPY
    return [*outputs, config_copy] if outputs and config_copy.is_file() else outputs


def _moves(dump: Path, outputs: list[Path], target: Path) -> list[tuple[Path, Path]]:
    """(source, destination) of every output and fault-injection marker, or ConfigError
    naming those that cannot be renamed into ``target`` (another file system, a folder
    that is not writable): nothing has moved yet."""
    moves, problems = [], []
    device = os.stat(dump).st_dev
    for path in [*outputs, *dump.glob(".fault_injected_*")]:
        try:
            relative = path.relative_to(dump)
        except ValueError:  # a TensorBoard or checkpoint folder outside the dump folder
            relative = Path("outside", path.name)
        if os.lstat(path).st_dev != device:
            problems.append(f"{path} is on another file system")
        elif not os.access(path.parent, os.W_OK | os.X_OK):
            problems.append(f"{path.parent} is not writable")
        moves.append((path, target / relative))
    if problems:
        raise ConfigError(f"[job] overwrite cannot archive the earlier run's outputs into "
                          f"{target}: {'; '.join(problems)}; move them away yourself, or "
                          "choose another dump_folder")
    return moves


def archive(config: JobConfig, outputs: list[Path]) -> Path:
    """Move ``outputs`` (and fault-injection markers) under ``{dump}/archive/<time>/``, keeping
    their paths relative to the dump folder: all of them, or (a move failed, the moves made
    are undone) none."""
    dump = Path(config.job.dump_folder)
    target = dump / ARCHIVE / time.strftime("%Y%m%d-%H%M%S")
    while target.exists():
        target = target.with_name(target.name + "-1")
    moves = _moves(dump, outputs, target)
    done: list[tuple[Path, Path]] = []
    try:
        with storage.writing("the archive of the earlier run", target):
            for source, destination in moves:
                destination.parent.mkdir(parents=True, exist_ok=True)
                os.rename(source, destination)
                done.append((source, destination))
    except OSError as e:  # not a full disk: still nothing half-archived
        _undo(done, target)
        raise ConfigError(f"[job] overwrite: archiving into {target} failed "
                          f"({storage.describe(e.errno or errno.EIO, e.filename)}); nothing "
                          "was moved") from e
    except storage.StorageError:
        _undo(done, target)
        raise
    logger.info(f"[job] overwrite: moved the earlier run's {_summary(outputs)} to {target}")
    return target


def _undo(done: list[tuple[Path, Path]], target: Path) -> None:
    """Move back what an archive that failed had moved, and remove its folders."""
    for source, destination in reversed(done):
        try:
            os.rename(destination, source)
        except OSError as e:
            logger.warning(f"[job] overwrite: could not move {destination} back to {source}: "
                           f"{e}")
    for folder in [*sorted(target.rglob("*"), reverse=True), target, target.parent]:
        with contextlib.suppress(OSError):  # only empty folders go
            folder.rmdir()
