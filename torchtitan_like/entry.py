"""The trainer's entry point: a job from its command line to its exit code.

``python -m torchtitan_like.train`` (what run_train.sh launches under torchrun) runs ``main``
here; a fork's own script calls ``main(trainer_cls=MyTrainer)``. The Trainer itself (train.py)
knows nothing of command lines, process groups, dump-folder locks or exit codes: those are
this module's, so that the trainer module is the build and the loop only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from torchtitan_like.components import run_folder, run_outputs
from torchtitan_like.components.checkpoint.folder import finished_run
from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.manager import did_you_mean, import_user_module
from torchtitan_like.distributed import lifecycle
from torchtitan_like.distributed import utils as dist_utils
from torchtitan_like.exit_codes import ExitCode
from torchtitan_like.failure_report import ended_cleanly, report_failure
from torchtitan_like.logging import init_logger, logger
from torchtitan_like.train import Trainer
from torchtitan_like.validate import parse_args


def trainer_class(config: JobConfig, default: type[Trainer] | None = None) -> type[Trainer]:
    """The class ``[job] trainer`` names ("module:Class", the module a dotted name or a .py
    path), else ``default`` (else ``Trainer``); ConfigError when the module or the class does
    not exist, the class is not a ``Trainer``, or it contradicts ``default``."""
    named = config.job.trainer
    if not named:
        return default or Trainer
    module_name, colon, class_name = named.rpartition(":")
    if not (colon and module_name and class_name.isidentifier()):
        raise ConfigError(f"[job] trainer = {named!r}: expected \"module:Class\", e.g. "
                          "\"my_train.py:MyTrainer\" or \"my_package.train:MyTrainer\"")
    module = import_user_module(module_name, "[job] trainer")
    cls = getattr(module, class_name, None)
    if cls is None:
        classes = [n for n, v in vars(module).items() if isinstance(v, type)]
        raise ConfigError(f"[job] trainer = {named!r}: {module_name} has no {class_name!r}"
                          + did_you_mean(class_name, classes))
    if not (isinstance(cls, type) and issubclass(cls, Trainer)):
        raise ConfigError(f"[job] trainer = {named!r}: {class_name} is not a subclass of "
                          "torchtitan_like.train.Trainer")
    if default is not None and default is not cls:
        raise ConfigError(f"[job] trainer = {named!r}, but main() was given trainer_cls="
                          f"{default.__name__}; keep one of them")
    return cls


def _nothing_left_to_do(config: JobConfig) -> str | None:
    """The line a finished run prints when restarted: the checkpoint it would resume from is
    at its last step already (never for the first attempt of an ``overwrite`` job: a fresh
    run, components/run_outputs.py)."""
    c = config.checkpoint
    if not c.enable or c.create_seed_checkpoint or "train_state" in c.exclude_from_loading:
        return None
    if run_outputs.fresh_run(config) and not run_outputs.is_restart():
        return None
    return finished_run(Path(config.job.dump_folder) / c.folder, c.load_step,
                        config.training.steps)


def run(argv: list[str], trainer_cls: type[Trainer] | None = None) -> int:
    """The job from its command line to its exit code: parse and check the config, join the
    process group, hold the dump folder (components/run_folder.py), build ``[job] trainer``
    (or ``trainer_cls``; default ``Trainer``) and train. After the first step every training
    process group gets ``[comm] train_timeout_seconds``."""
    trainer = None
    try:
        config = parse_args(argv, int(os.environ.get("WORLD_SIZE", 1)))
        trainer_cls = trainer_class(config, trainer_cls)
        if done := _nothing_left_to_do(config):  # before any process group, file or model
            logger.info(done)
            return ExitCode.OK
        device = dist_utils.init_distributed(config.comm.init_timeout_seconds)
        with run_folder.claimed(config, ended_cleanly):
            trainer = trainer_cls(config, device)
            groups = [None, *dist_utils.mesh_groups(trainer.meshes.all())]
            after_first_step(trainer.optimizers, lambda: dist_utils.set_timeout(
                config.comm.train_timeout_seconds, groups))
            trainer.train()
    except BaseException as e:  # every way out gets its line and its code
        return report_failure(e)
    finally:
        if trainer is not None:  # TensorBoard's buffered events, also after a failure (which
            with contextlib.suppress(Exception):  # is the one reported; a finished job has
                trainer.metrics.close()  # closed them in train(), where a failure counts)
    return ExitCode.OK


def after_first_step(optimizers: OptimizersContainer, fn: Callable[[], None]) -> None:
    """Call ``fn`` once, right after the first optimizer step."""
    handles = []

    def once(*_: object) -> None:
        for handle in handles:
            handle.remove()
        fn()

    handles.extend(opt.register_step_post_hook(once) for opt in optimizers.optimizers[:1])


def main(argv: list[str] | None = None, trainer_cls: type[Trainer] | None = None) -> NoReturn:
    """The trainer's entry point: runs ``[job] trainer`` (or ``trainer_cls``, a fork's own
    ``Trainer`` subclass; default ``Trainer``). Ends the process (distributed/lifecycle.py:
    with the torchrun agent, and without gloo's exit race) with the job's exit code
    (exit_codes.py)."""
    lifecycle.die_with_agent()
    init_logger()
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # torchdata 0.11
    lifecycle.exit_process(run(sys.argv[1:] if argv is None else argv, trainer_cls))


if __name__ == "__main__":
    main()
