"""Check a job before torchrun starts: ``python -m torchtitan_like.preflight [overrides]``.

run_train.sh calls this first, with the world size torchrun will use (NPROC x NNODES), so a
bad config or dataset (or a ``[job] trainer`` class that does not exist or is not a Trainer)
prints one line and exits 2 instead of starting processes that each fail with a traceback. It
runs the same parse + validation as the trainer (which keeps its own check for
``python -m torchtitan_like.train``), and the dump-folder checks (components/run_folder.py: no
running job holds the folder, a fresh start finds no other run's outputs). ``--help`` and
``--print_config`` are answered here.

    WORLD_SIZE=8 python -m torchtitan_like.preflight --job.config_file job.toml
"""

from __future__ import annotations

import os
import sys

from torchtitan_like.components.run_folder import DumpFolderInUse, check_before_start
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.entry import trainer_class
from torchtitan_like.exit_codes import ExitCode
from torchtitan_like.failure_report import report_failure
from torchtitan_like.logging import init_logger
from torchtitan_like.validate import parse_args


def main(argv: list[str] | None = None) -> int:
    """0 when the job may start, else (after one line) its exit code: 2 for a config that
    cannot run, 6 for a dump folder a running job holds."""
    init_logger()
    try:
        config = parse_args(sys.argv[1:] if argv is None else argv,
                            int(os.environ.get("WORLD_SIZE", 1)))
        trainer_class(config)  # [job] trainer: it exists and is a Trainer
        check_before_start(config)
    except (ConfigError, DumpFolderInUse) as e:
        return report_failure(e)
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
