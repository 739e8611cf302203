"""Start-up checks of every path a job will write, so that a dump folder below a file, a
read-only checkpoint folder or a ``[checkpoint] folder`` naming ``metrics.jsonl`` is one line
before anything starts, not a traceback at the first record or the first save (hours in,
perhaps after overwriting the file it pointed at).

The outputs are the dump folder's ``metrics.jsonl`` and, when switched on, the checkpoint
folder (HuggingFace exports go inside it, as ``step-N-hf``), the TensorBoard folder, the
profiler's trace and memory-snapshot folders and the inductor cache. Each folder must be a
writable directory, or creatable: its nearest existing ancestor a writable directory, not a
file. No output may be, or lie inside, another one (they all lie in the dump folder, which is
not an output of its own). Nothing is created here.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig

METRICS_FILE = "metrics.jsonl"


def output_paths(config: JobConfig) -> dict[str, Path]:
    """``"[section] key"`` -> the absolute path it makes the job write (folders, and the
    metrics file), for the outputs this job switches on."""
    dump = Path(config.job.dump_folder)
    paths = {f"{METRICS_FILE} of [job] dump_folder": dump / METRICS_FILE}
    if config.checkpoint.enable:
        paths["[checkpoint] folder"] = dump / config.checkpoint.folder
    if config.metrics.enable_tensorboard:
        paths["[metrics] save_tb_folder"] = dump / config.metrics.save_tb_folder
    if config.profiling.enable_profiling:
        paths["[profiling] save_traces_folder"] = dump / config.profiling.save_traces_folder
    if config.profiling.enable_memory_snapshot:
        paths["[profiling] save_memory_snapshot_folder"] = (
            dump / config.profiling.save_memory_snapshot_folder)
    if config.compile.cache_dir:
        paths["[compile] cache_dir"] = Path(config.compile.cache_dir)
    return {name: path.resolve() for name, path in paths.items()}


def _check_folder(name: str, path: Path) -> None:
    """A writable directory, or one that can be created (nearest existing ancestor)."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        below = "" if existing == path else f", so {path} cannot be created below it"
        raise ConfigError(f"{name}: {existing} is a file, not a folder{below}")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "" if existing == path else f" (where {path} would be created)"
        raise ConfigError(f"{name}: {existing}{what} is not writable by this user")


def check_output_paths(config: JobConfig) -> None:
    """ConfigError unless every output of the job can be written (module docstring)."""
    paths = output_paths(config)
    _check_folder("[job] dump_folder", Path(config.job.dump_folder).resolve())
    for name, path in paths.items():
        if name.startswith(METRICS_FILE):
            if path.exists() and not path.is_file():
                raise ConfigError(f"[job] dump_folder: {path} is a folder, not the metrics file")
        else:
            _check_folder(name, path)
    for (name, path), (other, other_path) in itertools.permutations(paths.items(), 2):
        if path == other_path:
            raise ConfigError(f"{name} and {other} are the same path, {path}: give each "
                              "output its own")
        if other_path in path.parents:
            raise ConfigError(f"{name} ({path}) lies inside {other} ({other_path}): give each "
                              "output its own place in the dump folder")
