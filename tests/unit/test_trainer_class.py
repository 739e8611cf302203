"""``[job] trainer = "module:Class"``: resolved at start-up, in the preflight run_train.sh runs
before torchrun, in ``python -m torchtitan_like.train`` and in ttl-ablate's per-variant check.
A class that does not exist or is not a Trainer is one ``config error`` line, exit 2, before
any process starts. That the named class then trains (through run_train.sh, ttl-ablate and the
test worker) is shown by tests/e2e/test_run_train.py, tests/e2e/test_ablation_sweep.py and
tests/parallel/test_custom_model_fork.py."""

import sys

import pytest
from harness import BASE, ROOT, run_in_process

from torchtitan_like import preflight
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.entry import trainer_class
from torchtitan_like.tools.ablate import Sweep, Variant, run_sweep
from torchtitan_like.train import Trainer
from torchtitan_like.validate import parse_args

PLUGIN = ROOT / "tests/plugins/custom_trainer.py"


def _config(trainer: str, corpus):
    return parse_args([*BASE, "--training.dataset=local", f"--training.dataset_path={corpus}",
                       f"--job.trainer={trainer}"], 1)


def test_the_named_class_is_the_trainer(corpus):
    cls = trainer_class(_config(f"{PLUGIN}:CountingTrainer", corpus))
    assert cls.__name__ == "CountingTrainer" and issubclass(cls, Trainer)
    assert trainer_class(_config("", corpus)) is Trainer
    assert trainer_class(_config("", corpus), cls) is cls  # main(trainer_cls=...)


@pytest.mark.parametrize(("trainer", "error"), [
    ("CountingTrainer", r'expected "module:Class"'),
    ("no_such_module:Trainer", r"\[job\] trainer: cannot import 'no_such_module'"),
    (f"{PLUGIN}:CountingTrainr", r"has no 'CountingTrainr'; did you mean 'CountingTrainer'"),
    (f"{PLUGIN}:NotATrainer", r"NotATrainer is not a subclass of torchtitan_like.train.Trainer"),
])
def test_a_bad_trainer_is_one_line_before_any_process(trainer, error, corpus, capsys):
    with pytest.raises(ConfigError, match=error):
        trainer_class(_config(trainer, corpus))
    argv = [*BASE, "--training.dataset=local", f"--training.dataset_path={corpus}",
            f"--job.trainer={trainer}"]
    assert preflight.main(argv) == 2
    assert run_in_process(argv) == 2  # the trainer's main, before init_distributed
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 2 and all("config error: [job] trainer" in line for line in lines)


def test_main_and_the_config_must_agree(corpus):
    with pytest.raises(ConfigError, match="but main\\(\\) was given trainer_cls=Trainer"):
        trainer_class(_config(f"{PLUGIN}:CountingTrainer", corpus), Trainer)


def test_ttl_ablate_refuses_a_variant_before_torchrun(tmp_path, corpus, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # and says why there is no chart
    sweep = Sweep(base_config=ROOT / "train_configs/debug_model.toml", steps=2,
                  output_folder=tmp_path,
                  overrides=("--training.dataset=local", f"--training.dataset_path={corpus}"),
                  variants=(Variant("bad trainer", (f"--job.trainer={PLUGIN}:NotATrainer",)),))
    lines: list[str] = []
    [result] = run_sweep(sweep, log=lines.append)
    assert result.status == "failed (exit 2)" and result.wall_seconds < 60
    assert result.error.startswith("config error: [job] trainer") and "NotATrainer" in result.error
    log = (tmp_path / "bad_trainer" / "train.log").read_text().splitlines()
    assert log[0].startswith("$ ") and log[1].endswith("(refused before torchrun)")
    assert lines[-1].startswith("no chart: matplotlib is missing; install the plot extra")
