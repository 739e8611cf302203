"""Tensor parallelism (with sequence and loss parallel) reproduces the one-process run.

fp32 with deterministic kernels, same seed and global batch (4 x 64 tokens), 5 steps. TP
changes only the order of floating-point sums (the row-wise matmuls' all-reduce, the sharded
softmax of loss parallel); measured: losses (6.7 -> 3.8; 10.9 -> 3.8 tied) within 2.9e-6,
so 1e-5 keeps a margin while any real error (a wrong head split, a missing reduction, a
double-counted gradient) moves the loss by > 1e-3. The gradient norm is compared too, within
a *relative* 1e-5 (measured 2.8e-6; norms reach 18, where fp32 resolves ~2e-6 absolute): it
checks clipping and metrics over the mixed TP and FSDP x TP DTensor placements.

The tied cases train the tiny Llama with its head tied to the embedding table (as Llama 3.2
1B/3B), registered by tests/parallel/tied_llama.py through [job] custom_import.

One torchrun launch per world size; the compile case is the one slow case (cold inductor
compile per process), so there is one, with its cache under the pytest tmp folder.
"""

import pytest
from harness import (
    FP32_PARITY_TOL,
    GRAD_NORM_RTOL,
    assert_close,
    assert_float8_drift,
    launch,
    losses,
)
from layouts import TP2, WHOLE

TOL = FP32_PARITY_TOL  # class (b), reordered fp32 sums: derivation in tests/harness.py
TIED = ["--job.custom_import", "tied_llama", "--model.name", "llama3_tied"]
VALIDATE = ["--validation.enable", "true", "--validation.freq", "5", "--validation.steps", "2"]
# Blockwise float8 needs local shards of 128-multiples: the debug model's widths (dim 256, FFN
# 768), one of its layers
WIDE = ["--model.flavor", "debugmodel", "--model.overrides.n_layers", "1"]
BLOCKWISE = ["--float8.enable", "true", "--float8.recipe_name", "blockwise"]


ONE = {
    "reference": [*WHOLE, *VALIDATE],
    "reference_tied": [*WHOLE, *TIED],
    "reference_wide": [*WIDE, *WHOLE],
    "reference_wide_blockwise": [*WIDE, *BLOCKWISE, *WHOLE],
}
TWO = {  # TP=2 alone: both ranks read the whole batch
    "tp2": [*TP2, *WHOLE, *VALIDATE],
    "tp2_no_loss_parallel": [*TP2, *WHOLE, "--parallelism.disable_loss_parallel", "true"],
    "tp2_accumulation": [*TP2, *VALIDATE],  # local 2 of global 4: two microbatches
    "tp2_selective_ac": [*TP2, *WHOLE, "--activation_checkpoint.mode", "selective"],
    "tp2_tied": [*TP2, *WHOLE, *TIED],
    "tp2_blockwise": [*WIDE, *BLOCKWISE, *TP2, *WHOLE],
    "fsdp2_blockwise": [*WIDE, *BLOCKWISE],
}
FOUR = {  # FSDP=2 x TP=2: local batch 2 on each of 2 data-parallel ranks
    "fsdp2_tp2": [*TP2, *VALIDATE],
    "fsdp2_tp2_tied_no_loss_parallel": [*TP2, *TIED, "--parallelism.disable_loss_parallel",
                                        "true"],
    "fsdp2_tp2_compile": [*TP2, "--compile.enable", "true"],  # + its cache (the fixture's)
}
LAYOUTS = {**TWO, **FOUR}
CASES = [c for c in LAYOUTS if "blockwise" not in c]
"""Against the fp32 reference (the blockwise pair against one process with blockwise)."""
VALIDATED = [c for c, args in LAYOUTS.items() if "--validation.enable" in args]
BLOCKWISE_CASES = [c for c in LAYOUTS if "blockwise" in c]


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    one = launch(1, ONE, root / "one", corpus)
    two = launch(2, TWO, root / "two", corpus)
    compiled = [*FOUR["fsdp2_tp2_compile"], "--compile.cache_dir", str(root / "inductor")]
    four = launch(4, {**FOUR, "fsdp2_tp2_compile": compiled}, root / "four", corpus)
    return {**one, **two, **four}


@pytest.mark.parametrize("case", CASES)
def test_matches_one_process(runs, case):
    reference = runs["reference_tied" if "tied" in case else "reference"]
    assert len(losses(runs[case])) == 5
    assert_close(losses(runs[case]), losses(reference), TOL)
    assert grad_norms(runs[case]) == pytest.approx(grad_norms(reference), rel=GRAD_NORM_RTOL)


def grad_norms(records: list[dict]) -> list[float]:
    return [r["grad_norm"] for r in records if "grad_norm" in r]


@pytest.mark.parametrize("case", VALIDATED)
def test_validation_matches_one_process(runs, case):
    """Validation runs its loss under loss parallel too, over the same held-out sequences at
    local batch 4 and 2 (``[validation] steps`` counts global batches)."""
    [actual] = [r["validation_loss"] for r in runs[case] if "validation_loss" in r]
    [expected] = [r["validation_loss"] for r in runs["reference"] if "validation_loss" in r]
    assert_close([actual], [expected], TOL)



@pytest.mark.parametrize("case", BLOCKWISE_CASES)
def test_blockwise_float8_matches_one_process_with_it(runs, case):
    """Emulated blockwise float8 (components/blockwise_fp8.py) under TP 2 and FSDP 2 against
    one process with it. Every scale is a function of one token row's 128 channels, one
    128x128 weight block, or one weight-gradient tile of 128 tokens of one output channel: with
    128-multiple shards and 128 tokens per rank, the layout changes no tile. What it changes is
    where partial sums meet: a rank's partial GEMM (TP's row-wise linears in forward and input
    gradient; FSDP's weight gradient) is rounded to bf16, the GEMMs' output dtype, before the
    ranks' partials are added, where one process adds its blocks in fp32 and rounds once. That
    is one more bf16 rounding (2^-8 relative) of some GEMM outputs, against the e4m3 rounding
    (2^-4) of every operand and the bf16 rounding of every output that one process's run
    already makes against fp32: independent roundings move the loss in proportion to their
    size, so already at step 1 the layout stays within one process's distance from fp32
    (measured TP 2: 1.9e-6 at step 1, against 2.3e-4). From step 2 on, float8 roundings flip
    independently as in harness.assert_float8_drift; so at every step: twice one process's
    distance from fp32 so far (exact_steps = 0)."""
    assert_float8_drift(losses(runs[case]), losses(runs["reference_wide_blockwise"]),
                        losses(runs["reference_wide"]), exact_steps=0)
