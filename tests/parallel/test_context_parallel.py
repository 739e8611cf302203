"""Context parallelism (ring attention over the sequence) reproduces the one-process run.

fp32 with deterministic kernels, same seed and global batch (4 x 64 tokens), 5 steps. CP
changes only the order of floating-point sums: the online-softmax merge of the attention
blocks, the per-rank partial cross-entropy sums and FSDP's reduce-scatter over dp_shard x cp.
Measured: losses (6.7 -> 3.9) within 7.2e-7 and validation losses within 2.4e-7, so 1e-5
keeps a margin while any real error (a token scored twice or not at all, a RoPE row out of
place, a missed K/V block, a wrong normalisation) moves the loss by > 1e-3. Gradient norms are
compared within a relative 1e-5 (measured 2.8e-6).

CP=2 runs with both K/V rotations and with head-tail load balancing on and off, with
gradient accumulation, selective AC and validation; then CP=2 x FSDP=2, CP=2 x TP=2 and
CP=2 x PP=2 (the CP context covers the whole pipeline schedule: every stage's forward and
backward, each stage's own RoPE table) on four processes. One torchrun launch per world size.
"""

import pytest
from harness import FP32_PARITY_TOL, GRAD_NORM_RTOL, assert_close, launch, losses
from layouts import CP2, PP2_MICROBATCHES, TP2, WHOLE

TOL = FP32_PARITY_TOL  # class (b), reordered fp32 sums: derivation in tests/harness.py
ALLTOALL = ["--parallelism.context_parallel_rotate_method", "alltoall"]
NO_BALANCE = ["--parallelism.context_parallel_load_balancer", "none"]
VALIDATE = ["--validation.enable", "true", "--validation.freq", "5", "--validation.steps", "2"]


TWO = {
    "cp2_allgather_headtail": [*CP2, *WHOLE, *VALIDATE],
    "cp2_alltoall_headtail": [*CP2, *WHOLE, *ALLTOALL],
    "cp2_allgather_none": [*CP2, *WHOLE, *NO_BALANCE],
    "cp2_alltoall_none": [*CP2, *WHOLE, *ALLTOALL, *NO_BALANCE],
    "cp2_accumulation": [*CP2, *VALIDATE],  # local 2 of global 4: two microbatches
    "cp2_selective_ac": [*CP2, *WHOLE, "--activation_checkpoint.mode", "selective"],
}
FOUR = {
    "cp2_fsdp2": [*CP2, *VALIDATE],  # local batch 2 on each of 2 data-parallel ranks
    "cp2_tp2": [*CP2, *WHOLE, *TP2, *VALIDATE],
    "cp2_pp2": [*CP2, *PP2_MICROBATCHES, *VALIDATE],
}
CASES = [*TWO, *FOUR]  # every case, each against the one-process reference


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("cp")
    one = launch(1, {"reference": [*WHOLE, *VALIDATE]}, root / "one", corpus)
    two = launch(2, TWO, root / "two", corpus)
    four = launch(4, FOUR, root / "four", corpus)
    return {**one, **two, **four}


def grad_norms(records: list[dict]) -> list[float]:
    return [r["grad_norm"] for r in records if "grad_norm" in r]


@pytest.mark.parametrize("case", CASES)
def test_matches_one_process(runs, case):
    assert len(losses(runs[case])) == 5
    assert_close(losses(runs[case]), losses(runs["reference"]), TOL)
    reference = grad_norms(runs["reference"])
    assert grad_norms(runs[case]) == pytest.approx(reference, rel=GRAD_NORM_RTOL)


@pytest.mark.parametrize("case", ["cp2_allgather_headtail", "cp2_accumulation", "cp2_fsdp2",
                                  "cp2_tp2", "cp2_pp2"])
def test_validation_matches_one_process(runs, case):
    """Validation shards its batches too; tokens are counted before the sharding. Local batch 2
    reads the reference's held-out sequences in twice as many batches."""
    [actual] = [r["validation_loss"] for r in runs[case] if "validation_loss" in r]
    [expected] = [r["validation_loss"] for r in runs["reference"] if "validation_loss" in r]
    assert_close([actual], [expected], TOL)
