"""The plan toolkit (distributed/plan_toolkit.py, and the TP styles of distributed/tp_styles.py)
and the check that a plan applied what the config asked for (distributed/plan_check.py).

- ``NoParallel``: a feed-forward gate kept whole on every TP rank trains under TP=2 like one
  process (fp32, deterministic; TP reorders the sums of the sharded matmuls only, measured
  differences of ~1e-6 on losses of ~6 as in test_tensor_parallel.py; 1e-5 bound), and
  gradient clipping (default max_norm) runs over its replicated DTensor parameters.
- Each silent-skip case stops the job with one error naming the model and the switch: a plan
  without activation checkpointing under mode=full, without compile under compile.enable (in
  this process), and one leaving parameters unsharded under TP=2 (a torchrun of 2).
"""

from pathlib import Path

import pytest
from harness import assert_close, build_trainer, job_args, launch, losses, torchrun
from layouts import TP2, WHOLE

from torchtitan_like.config.errors import ConfigError

TOL = 1e-5
MODELS = str(Path(__file__).parent / "plan_models.py")
GATED = ["--job.custom_import", MODELS, "--model.name", "llama3_gated"]
LAZY = ["--job.custom_import", MODELS, "--model.name", "llama3_lazy_plan"]


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("plan_toolkit")
    results = launch(1, {"reference": [*GATED, *WHOLE]}, root / "1",
                     corpus)
    results.update(launch(2, {"gated_tp2": [*GATED, *TP2, *WHOLE]}, root / "2", corpus))
    return results


def test_no_parallel_gate_under_tp_matches_one_process(runs):
    assert_close(losses(runs["gated_tp2"]), losses(runs["reference"]), TOL)


@pytest.mark.parametrize(("switch", "named"), [
    (["--activation_checkpoint.mode", "full"], "activation checkpointing"),
    (["--compile.enable", "true"], "torch.compile"),
])
def test_a_plan_skipping_a_switch_is_refused(switch, named, corpus, tmp_path, one_process_group):
    with pytest.raises(ConfigError, match=f"model 'llama3_lazy_plan'.* did not apply {named}"):
        build_trainer([*LAZY, *switch], tmp_path, corpus, one_process_group)


def test_a_plan_ignoring_tp_stops_the_job(corpus, tmp_path):
    proc = torchrun(2, "-m", "torchtitan_like.train",
                    *job_args([*LAZY, *TP2, *WHOLE], tmp_path, corpus))
    assert proc.returncode != 0
    assert ("config error: model 'llama3_lazy_plan': its parallelize_fn (ModelSpec) did not "
            "apply tensor parallelism to") in proc.stderr
    assert "ConfigError" not in proc.stderr  # one line, no traceback from the trainer
