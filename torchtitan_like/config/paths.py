"""One rule for relative paths: a relative path in a job's config means a path from where the
user stands, whether it was written in a TOML or on the command line.

"Where the user stands" is the directory the job was launched from: ``run_train.sh`` changes
into the checkout before it starts Python and passes the directory it was run from as
``TTL_LAUNCH_DIR``; ``python -m torchtitan_like.train`` (or any tool) is launched from its
current directory. The path fields below are made absolute when the config is built, so the
log, ``--print_config`` and every consumer see the same absolute path. Two families keep their
own documented base: ``extends`` names files relative to the TOML that holds it, and the
folders *inside* the dump folder (``[checkpoint] folder``, ``[metrics] save_tb_folder``,
``[profiling] save_*_folder``) are relative to ``[job] dump_folder``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

LAUNCH_DIR_ENV = "TTL_LAUNCH_DIR"
"""Environment variable naming the directory a launcher was run from (run_train.sh sets it)."""

PATH_FIELDS: tuple[tuple[str, str], ...] = (
    ("job", "config_file"), ("job", "dump_folder"), ("model", "tokenizer_path"),
    ("training", "dataset_path"), ("compile", "cache_dir"), ("checkpoint", "initial_load_path"),
)
"""(section, key) of the fields that name a file or folder of the user's."""


def launch_dir() -> Path:
    """The directory relative paths are read from (module docstring)."""
    return Path(os.environ.get(LAUNCH_DIR_ENV) or os.getcwd())


def user_path(value: str, base: Path) -> str:
    """``value`` made absolute against ``base`` when relative (``..`` folded); "" stays ""."""
    if not value:
        return value
    return os.path.normpath(base / Path(value).expanduser())


def user_imports(names: list[str], base: Path) -> list[str]:
    """``[job] custom_import`` with its ``.py`` files made absolute (module names kept)."""
    return [user_path(name, base) if name.endswith(".py") else name for name in names]


def resolve_paths(config: Any, base: Path) -> None:
    """Make every path field of ``config`` (a JobConfig) absolute against ``base``."""
    for section, key in PATH_FIELDS:
        values = getattr(config, section)
        setattr(values, key, user_path(getattr(values, key), base))
    config.job.custom_import = user_imports(config.job.custom_import, base)
