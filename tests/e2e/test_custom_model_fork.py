"""The worked research model of docs/extending.md, trained from a copy outside the checkout.

examples/custom_model/tiny_gpt.py (copied to a temporary folder and imported by path) adds a
z-loss through the loss hook, reports a metric, takes its coefficient from a model override
and parallelizes with the plan toolkit. One launch of 1 process (the reference) and one of 2
(FSDP=2, FSDP=2 with full activation checkpointing, TP=2, PP=2) compare per step. Tolerance as
in tests/parallel/test_model_hooks.py (fp32, deterministic kernels, sums reordered only): 1e-5;
under TP the matmuls split over ranks sum their halves in another order and every TP rank
computes the z-loss from the same gathered logits, so the same class of bound holds. CP is not
implemented by this model: it declares so (ModelSpec.supported_dims), and the job is refused
before any process group exists, as is a TP degree that does not divide the heads.
"""

import shutil

import pytest
from harness import ROOT, assert_close, launch, losses

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.validate import parse_args

TOL = 1e-5


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    folder = tmp_path_factory.mktemp("my_research")
    shutil.copy(ROOT / "examples/custom_model/tiny_gpt.py", folder / "my_gpt.py")
    return ["--job.custom_import", str(folder / "my_gpt.py"), "--model.name=tiny_gpt",
            "--model.flavor=small", "--model.overrides.z_loss_coef=0.01",
            "--model.overrides.n_layers=4"]


@pytest.fixture(scope="module")
def runs(fork, corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("fork")
    pp2 = ["--parallelism.pipeline_parallel_degree=2", "--training.local_batch_size=4",
           "--parallelism.pipeline_parallel_microbatch_size=1"]
    results = launch(1, {"reference": [*fork, "--training.local_batch_size=4"],
                         "no_z_loss": [*fork, "--training.local_batch_size=4",
                                       "--model.overrides.z_loss_coef=0"]}, root / "1", corpus)
    results.update(launch(2, {
        "fsdp2": fork,
        "fsdp2_full_ac": [*fork, "--activation_checkpoint.mode=full"],
        "tp2": [*fork, "--parallelism.tensor_parallel_degree=2",
                "--training.local_batch_size=4"],
        "pp2": [*fork, *pp2],
    }, root / "2", corpus))
    return results


def series(records, name):
    return [r[name] for r in records if "loss" in r]


def test_the_override_and_the_hooks_take_effect(runs):
    assert abs(losses(runs["reference"])[-1] - losses(runs["no_z_loss"])[-1]) > 1e-4
    assert all(v > 0 for v in series(runs["reference"], "aux_loss/z_loss"))
    assert series(runs["no_z_loss"], "aux_loss/z_loss") == [0.0] * 5


@pytest.mark.parametrize("case", ["fsdp2", "fsdp2_full_ac", "tp2", "pp2"])
def test_each_layout_matches_one_process(runs, case):
    assert_close(losses(runs[case]), losses(runs["reference"]), TOL)
    for name in ("aux_loss/z_loss", "max_logsumexp"):
        ratios = [a / e for a, e in zip(series(runs[case], name),
                                        series(runs["reference"], name), strict=True)]
        assert_close(ratios, [1.0] * 5, TOL)


@pytest.mark.parametrize(("extra", "error"), [
    (["--parallelism.context_parallel_degree=2"],
     r"model 'tiny_gpt' supports only data parallelism and \[pp, tp\]"),
    (["--parallelism.tensor_parallel_degree=2", "--model.overrides.n_heads=3",
      "--model.overrides.dim=96"], r"tensor_parallel_degree = 2 must divide .* n_heads = 3"),
])
def test_what_the_plan_cannot_do_is_refused_before_process_groups(fork, extra, error):
    # the checkout's file, in this process: a second file registering "tiny_gpt" here would
    # clash with it in the registry (the launches above imported the copy in their processes)
    example = ["--job.custom_import", str(ROOT / "examples/custom_model/tiny_gpt.py"),
               *fork[2:]]
    with pytest.raises(ConfigError, match=error):
        parse_args([*example, *extra], 2)
