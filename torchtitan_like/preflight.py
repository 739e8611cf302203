"""Check a job before torchrun starts: ``python -m torchtitan_like.preflight [overrides]``.

run_train.sh calls this first, with its launcher variables (NPROC, NNODES, NODE_RANK,
RDZV_ENDPOINT, MAX_RESTARTS, LOG_RANK: config/launcher_env.py), so a bad one, a bad config or
dataset (or a ``[job] trainer`` class that does not exist or is not a Trainer) prints one line
and exits 2 instead of starting processes that each fail with a traceback. The world size the
config is checked against is theirs, NPROC x NNODES (1 when unset). It
runs the same parse + validation as the trainer (which keeps its own check for
``python -m torchtitan_like.train``), and the dump-folder checks (components/run_folder.py: no
running job holds the folder, a fresh start finds no other run's outputs). ``--help`` and
``--print_config`` are answered here.

    NPROC=8 python -m torchtitan_like.preflight --job.config_file job.toml
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from torchtitan_like.components.run_folder import DumpFolderInUse, check_before_start
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.launcher_env import read_launcher_env
from torchtitan_like.entry import trainer_class
from torchtitan_like.exit_codes import ExitCode
from torchtitan_like.failure_report import report_failure
from torchtitan_like.logging import init_logger, logger
from torchtitan_like.validate import parse_args


def main(argv: list[str] | None = None) -> int:
    """0 when the job may start, else (after one line) its exit code: 2 for a config or a
    launcher variable that cannot run, 6 for a dump folder a running job holds."""
    init_logger()
    argv = sys.argv[1:] if argv is None else argv
    try:
        world_size = 1 if {"-h", "--help"} & set(argv) else launcher_world_size(os.environ)
        config = parse_args(argv, world_size)
        trainer_class(config)  # [job] trainer: it exists and is a Trainer
        check_before_start(config)
    except (ConfigError, DumpFolderInUse, KeyboardInterrupt) as e:
        return report_failure(e)
    return ExitCode.OK


def launcher_world_size(environ: Mapping[str, str]) -> int:
    """NPROC x NNODES of checked launcher variables; one warning line names those one node
    does not read."""
    launcher = read_launcher_env(environ)
    if launcher.unused:
        logger.warning(f"{', '.join(launcher.unused)} set but unused: NNODES="
                       f"{launcher.nnodes}, the job's processes meet on this node")
    return launcher.world_size


if __name__ == "__main__":
    raise SystemExit(main())
