"""Tensor parallelism (with sequence and loss parallel) reproduces the one-process run.

fp32 with deterministic kernels, same seed and global batch (4 x 64 tokens), 5 steps. TP
changes only the order of floating-point sums (the row-wise matmuls' all-reduce, the sharded
softmax of loss parallel); measured diffs are <= 3e-6 on losses of ~6.7 -> 3.9 (CPU_NOTES),
so 1e-5 keeps a margin while any real error (a wrong head split, a missing reduction, a
double-counted gradient) moves the loss by > 1e-3. The gradient norm is compared too, within
a *relative* 1e-5 (norms reach ~18 early on, where fp32 resolves ~2e-6): it checks clipping
and metrics over the mixed TP and FSDP x TP DTensor placements.

One torchrun launch per world size; the compile case is the one slow case (cold inductor
compile per process), so there is one, with its cache under the pytest tmp folder.
"""

import pytest
from harness import assert_close, launch, losses

TOL = 1e-5
TP2 = ["--parallelism.tensor_parallel_degree", "2"]
TIED = ["--job.custom_import", "tied_llama", "--model.name", "llama3_tied"]


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    whole = ["--training.local_batch_size", "4"]
    one = launch(1, {
        "reference": whole,
        "reference_tied": [*whole, *TIED],
    }, root / "one", corpus)
    two = launch(2, {  # TP=2 alone: both ranks read the whole batch
        "tp2": [*TP2, *whole],
        "tp2_no_loss_parallel": [*TP2, *whole, "--parallelism.disable_loss_parallel", "true"],
        "tp2_accumulation": TP2,  # local 2 of global 4: two microbatches
        "tp2_selective_ac": [*TP2, *whole, "--activation_checkpoint.mode", "selective"],
        "tp2_tied": [*TP2, *whole, *TIED],
    }, root / "two", corpus)
    four = launch(4, {  # FSDP=2 x TP=2: local batch 2 on each of 2 data-parallel ranks
        "fsdp2_tp2": TP2,
        "fsdp2_tp2_tied": [*TP2, *TIED],
        "fsdp2_tp2_compile": [*TP2, "--compile.enable", "true",
                              "--compile.cache_dir", str(root / "inductor")],
    }, root / "four", corpus)
    return {**one, **two, **four}


CASES = ["tp2", "tp2_no_loss_parallel", "tp2_accumulation", "tp2_selective_ac", "tp2_tied",
         "fsdp2_tp2", "fsdp2_tp2_tied", "fsdp2_tp2_compile"]


@pytest.mark.parametrize("case", CASES)
def test_matches_one_process(runs, case):
    reference = runs["reference_tied" if "tied" in case else "reference"]
    assert len(losses(runs[case])) == 5
    assert_close(losses(runs[case]), losses(reference), TOL)
    norms = [r["grad_norm"] for r in runs[case]]
    assert norms == pytest.approx([r["grad_norm"] for r in reference], rel=TOL)


def test_throughput_is_per_device(runs):
    """tokens_per_second divides the replica's tokens by the TP ranks that produced them."""
    for case in ("tp2", "fsdp2_tp2"):
        for r in runs[case]:
            assert r["tokens_per_second_total"] == pytest.approx(
                r["tokens_per_second"] * (2 if case == "tp2" else 4))
