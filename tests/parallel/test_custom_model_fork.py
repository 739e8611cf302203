"""The worked research model of docs/extending.md, trained from a copy outside the checkout.

examples/custom_model/tiny_gpt.py (copied to a temporary folder and imported by path) adds a
z-loss through the loss hook, reports a metric, takes its coefficient from a model override
and parallelizes with the plan toolkit. One launch of 1 process (the references) and one of 2
(FSDP=2, FSDP=2 with full activation checkpointing, TP=2, PP=2) compare per step. Tolerance as
in tests/parallel/test_model_hooks.py (fp32, deterministic kernels, sums reordered only): 1e-5;
under TP the matmuls split over ranks sum their halves in another order and every TP rank
computes the z-loss from the same gathered logits, so the same class of bound holds (the model
declares the gathered logits, ModelSpec.loss_parallel, so loss parallel is recorded as off). CP
is not implemented by this model: it declares so (ModelSpec.supported_dims), and the job is
refused before any process group exists, as is a TP degree that does not divide the heads.

The extra head (``mtp_depth = 1``: a multi-token-prediction module on the last stage reading the
token ids and labels as stage inputs, sharing the trunk's embedding) in the same launches:
under PP=2 (with full AC on both block groups) the embedding is a weight tied across the two
stages, its two gradient contributions summed by an all-reduce instead of autograd's
accumulation (the same two terms, class (b)); FSDP=2 keeps the shared embedding in the root
unit; TP=2 splits the MTP block like the trunk's. Each equals one process within 1e-5 per step,
training and validation loss and the logged MTP term alike. A PP=2 job resumes the
one-process step-1 checkpoint (the tied weight stored once, the last stage's copy loading it
and its Adam state under the embedding's name) and continues with the reference's losses. The
PP=2 case runs a Trainer subclass named by ``[job] trainer`` (tests/plugins/custom_trainer.py).

A research optimizer the same way: examples/custom_optimizer/lion.py (docs/extending.md's
recipe), copied outside the checkout and named in ``[job] custom_import``, trains the tiny
Llama with ``[optimizer] name = "Lion"`` and its own ``[lion]`` section under FSDP=2 against one
process (LION_TOL).
"""

import json
import shutil

import pytest
from harness import GRAD_NORM_RTOL, ROOT, assert_close, launch, losses
from layouts import PP2_MICROBATCHES as PP2
from layouts import TP2, WHOLE
from torch.distributed.checkpoint import FileSystemReader

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import tomllib
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.tools.ablate_report import model_metric_names
from torchtitan_like.validate import parse_args

TOL = 1e-5
MTP = ["--model.overrides.mtp_depth=1"]
VALIDATE = ["--validation.enable=true", "--validation.freq=5", "--validation.steps=2"]
SAVE = ["--checkpoint.enable=true", "--checkpoint.interval=1"]
COUNTING = f"--job.trainer={ROOT / 'tests/plugins/custom_trainer.py'}:CountingTrainer"
MTP_CASES = ["mtp_pp2", "mtp_fsdp2", "mtp_tp2"]
LION_TOL = 1e-4
"""Lion (lr 3e-4) under FSDP 2 against one process, 5 steps. Its update is sign(c), c = b1 m +
(1 - b1) g, element by element: where the layouts' gradients differ by their reordered sums
(relative d = 1.9e-6, tests/harness.py) the update is the same, unless c lies within d |c| of 0
and its sign flips: probability ~2 d x 0.4 per element (c's density at 0, ~0.4 / its scale),
1.4 of the tiny Llama's 0.92M parameters per step, at most 20 in 5 steps (Poisson with mean 7:
P(> 20) < 1e-4). A flip moves one weight by 2 lr = 6e-4, and the loss by its gradient times
that: 4 standard deviations of an element's gradient, 4 |g| / sqrt(N) = 4 x 1.6 / 958, give
4.0e-6 per flip, 8e-5 for 20 flips of one sign. Beside it FP32_PARITY_TOL's reordered sums:
1e-5. Measured 1.4e-6."""


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    folder = tmp_path_factory.mktemp("my_research")
    shutil.copy(ROOT / "examples/custom_model/tiny_gpt.py", folder / "my_gpt.py")
    return ["--job.custom_import", str(folder / "my_gpt.py"), "--model.name=tiny_gpt",
            "--model.flavor=small", "--model.overrides.z_loss_coef=0.01",
            "--model.overrides.n_layers=4"]


@pytest.fixture(scope="module")
def lion(tmp_path_factory):
    folder = tmp_path_factory.mktemp("my_optimizer")
    shutil.copy(ROOT / "examples/custom_optimizer/lion.py", folder / "my_lion.py")
    return ["--job.custom_import", str(folder / "my_lion.py"), "--optimizer.name=Lion",
            "--lion.lr=3e-4"]


@pytest.fixture(scope="module")
def runs(fork, lion, corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("fork")
    mtp = [*fork, *MTP, *VALIDATE]
    results = launch(1, {"lion_reference": [*lion, "--training.local_batch_size=4"],
                         "reference": [*fork, "--training.local_batch_size=4"],
                         "no_z_loss": [*fork, "--training.local_batch_size=4",
                                       "--model.overrides.z_loss_coef=0"],
                         "mtp_reference": [*mtp, "--training.local_batch_size=4", *SAVE]},
                     root / "1", corpus)
    shutil.copytree(root / "1" / "mtp_reference" / "checkpoint" / "step-1",
                    root / "2" / "mtp_pp2_from_one" / "checkpoint" / "step-1")
    results.update(launch(2, {
        "fsdp2": fork,
        "fsdp2_full_ac": [*fork, "--activation_checkpoint.mode=full"],
        "tp2": [*fork, *TP2, *WHOLE],
        "pp2": [*fork, *PP2],
        "mtp_pp2": [*mtp, *PP2, "--activation_checkpoint.mode=full", COUNTING],
        "mtp_fsdp2": mtp,
        "mtp_tp2": [*mtp, *TP2, *WHOLE],
        "mtp_pp2_from_one": [*fork, *MTP, *PP2, *SAVE],
        "lion_fsdp2": lion,
    }, root / "2", corpus))
    return results, root


def series(records, name):
    return [r[name] for r in records if "loss" in r]


def test_the_override_and_the_hooks_take_effect(runs):
    runs, _ = runs
    assert abs(losses(runs["reference"])[-1] - losses(runs["no_z_loss"])[-1]) > 1e-4
    assert all(v > 0 for v in series(runs["reference"], "aux_loss/z_loss"))
    assert series(runs["no_z_loss"], "aux_loss/z_loss") == [0.0] * 5


@pytest.mark.parametrize("case", ["fsdp2", "fsdp2_full_ac", "tp2", "pp2"])
def test_each_layout_matches_one_process(runs, case):
    runs, _ = runs
    assert_close(losses(runs[case]), losses(runs["reference"]), TOL)
    for name in ("aux_loss/z_loss", "max_logsumexp"):
        ratios = [a / e for a, e in zip(series(runs[case], name),
                                        series(runs["reference"], name), strict=True)]
        assert_close(ratios, [1.0] * 5, TOL)


@pytest.mark.parametrize("case", MTP_CASES)
def test_the_extra_head_matches_one_process(runs, case):
    runs, _ = runs
    reference = runs["mtp_reference"]
    assert_close(losses(runs[case]), losses(reference), TOL)
    mtp = [series(r, "aux_loss/mtp") for r in (runs[case], reference)]
    assert_close([a / e for a, e in zip(*mtp, strict=True)], [1.0] * 5, TOL)
    assert series(runs[case], "grad_norm") == pytest.approx(series(reference, "grad_norm"),
                                                           rel=GRAD_NORM_RTOL)
    assert_close(*[[r["validation_loss"] for r in run if "validation_loss" in r]
                   for run in (runs[case], reference)], TOL)


def test_the_extra_head_trains_and_its_metrics_reach_the_ablation_table(runs):
    runs, _ = runs
    reference = runs["mtp_reference"]
    assert abs(losses(reference)[-1] - losses(runs["reference"])[-1]) > 1e-3  # MTP took effect
    assert series(reference, "aux_loss/mtp")[-1] < series(reference, "aux_loss/mtp")[0]
    assert model_metric_names(reference) == ["aux_loss/mtp", "aux_loss/z_loss", "max_logsumexp"]


def test_a_checkpoint_with_the_tied_weight_resumes_under_pp(runs):
    """One process saved the embedding once (its further name ``mtp.0.embed.weight`` is the
    same Parameter); under PP=2 both stages load it, the last stage into its own copy."""
    runs, root = runs
    keys = FileSystemReader(str(root / "1/mtp_reference/checkpoint/step-1")).read_metadata() \
        .state_dict_metadata
    assert "model.tok_emb.weight" in keys and "optimizer.state.tok_emb.weight.exp_avg" in keys
    assert not any("mtp.0.embed" in key for key in keys)
    assert [r["step"] for r in runs["mtp_pp2_from_one"] if "loss" in r] == [2, 3, 4, 5]
    assert_close(losses(runs["mtp_pp2_from_one"]), losses(runs["mtp_reference"])[1:], TOL)


def test_an_optimizer_registered_outside_the_package_trains_under_fsdp(runs):
    runs, root = runs
    ours, one = losses(runs["lion_fsdp2"]), losses(runs["lion_reference"])
    assert ours[-1] < ours[0] - 0.3  # it trains
    assert_close(ours, one, LION_TOL)
    config = tomllib.loads((root / "2/lion_fsdp2/config.toml").read_text())
    assert config["optimizer"]["name"] == "Lion" and config["lion"]["lr"] == 3e-4


def test_a_trainer_named_in_the_config_runs(runs):
    _, root = runs
    marker = json.loads((root / "2/mtp_pp2/trainer.json").read_text())
    assert marker == {"class": "CountingTrainer", "microbatches": 5}


def test_gathered_logits_record_loss_parallel_as_off(fork):
    example = ["--job.custom_import", str(ROOT / "examples/custom_model/tiny_gpt.py"),
               *fork[2:]]
    config = parse_args([*example, "--parallelism.tensor_parallel_degree=2"], 2)
    assert config.parallelism.disable_loss_parallel is True  # --print_config says so
    layout = ParallelDims.from_config(config, 2)  # what checkpoint.json records as the layout
    assert layout.loss_parallel_enabled is False and layout.enable_loss_parallel is False


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
