"""FSDP2, HSDP and gradient accumulation reproduce the one-process run step by step.

fp32 with deterministic kernels; the layouts differ from one process only in the order of
floating-point sums (reduce-scatter vs local accumulation), measured at <= 1e-6 on these losses
(~6.5), so 1e-5 leaves a margin while catching any real error (a wrong normalisation or a
duplicated sample moves the loss by > 1e-2).

The validation loss too, at local batch sizes 4 (the reference), 2 and 1: ``[validation]
steps`` counts global batches, so every layout scores the same held-out sequences (a set that
grew with the data-parallel degree moved it by 2.5e-2 on llama3); same sums reordered, same
bound.
"""

import pytest
from harness import FP32_PARITY_TOL, assert_close, launch, losses

TOL = FP32_PARITY_TOL  # class (b), reordered fp32 sums: derivation in tests/harness.py
BF16_MOMENTS = ["--optimizer.state_dtype", "bfloat16"]  # components/bf16_moments.py
VALIDATE = ["--validation.enable=true", "--validation.freq=5", "--validation.steps=2"]
VALIDATED = ["accumulation", "fsdp", "fsdp_accumulation", "hsdp_2x2"]


ONE = {
    "reference": ["--training.local_batch_size", "4", *VALIDATE],
    "accumulation": VALIDATE,  # local 2 of global 4: two microbatches per step
    "reference_bf16_moments": ["--training.local_batch_size", "4", *BF16_MOMENTS],
}
TWO = {
    "fsdp": VALIDATE,
    "fsdp_accumulation": ["--training.local_batch_size", "1", *VALIDATE],
    "fsdp_no_reshard": ["--parallelism.fsdp_reshard_after_forward", "never"],
    "fsdp_bf16_moments": BF16_MOMENTS,
}
FOUR = {
    "hsdp_2x2": ["--parallelism.data_parallel_replicate_degree", "2",
                 "--training.local_batch_size", "1", *VALIDATE],
}
PARITY = [c for c in {**ONE, **TWO, **FOUR} if not c.startswith("reference") and
          not c.endswith("bf16_moments")]
"""Every case against the fp32 reference (the bf16-moment pair has its own test)."""


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    one = launch(1, ONE, root / "one", corpus)
    two = launch(2, TWO, root / "two", corpus)
    four = launch(4, FOUR, root / "four", corpus)
    return {**one, **two, **four}


@pytest.mark.parametrize("case", PARITY)
def test_matches_one_process(runs, case):
    assert len(losses(runs[case])) == 5
    assert_close(losses(runs[case]), losses(runs["reference"]), TOL)


def test_loss_falls_and_metrics_are_complete(runs):
    records = [r for r in runs["fsdp"] if "loss" in r]  # the training records
    assert records[-1]["loss"] < records[0]["loss"]
    for key in ("step", "loss", "grad_norm", "lr", "tokens_per_second", "tflops", "mfu",
                "memory_gib"):
        assert all(r[key] is not None for r in records), key
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]


def test_bf16_moments_under_fsdp_match_one_process_with_them(runs):
    """Adam's moments stored in bf16 (sharded DTensor states under FSDP 2) against one process
    with them. The gradients differ by reordered fp32 sums (a few ulps, 2^-22 relative); a
    stored moment then rounds to the other bf16 neighbour only when it lies that close to a
    rounding boundary (probability ~2^-22 / 2^-8 = 2^-14 per element), and such a flip changes
    one element's update by a bf16 step of its moment (<= 2^-7 relative, <= lr 2^-7 = 2.3e-5
    of a weight ~2e-2): far below what moves the loss by 1e-5. So class (b), FP32_PARITY_TOL;
    and they differ from fp32 moments (the rounding ran)."""
    ours, one = losses(runs["fsdp_bf16_moments"]), losses(runs["reference_bf16_moments"])
    assert_close(ours, one, TOL)
    assert ours != losses(runs["fsdp"])


@pytest.mark.parametrize("case", VALIDATED)
def test_validation_matches_one_process(runs, case):
    [actual] = [r["validation_loss"] for r in runs[case] if "validation_loss" in r]
    [expected] = [r["validation_loss"] for r in runs["reference"] if "validation_loss" in r]
    assert_close([actual], [expected], TOL)
