"""Pipeline parallelism with every schedule reproduces the one-process run step by step.

fp32 with deterministic kernels. A pipelined step computes the same sums as one process, cut
into microbatches (each microbatch's loss is sum(cross-entropy) / the step's global token
count) and reduced in another order, so losses differ only by rounding: measured <= 4.8e-7 on
these losses (~6.7 falling to ~3.9), and 1e-5 leaves a margin while catching any real error
(a wrong normalisation, a dropped microbatch or an unsynchronised stage moves the loss by
> 1e-2).
The validation loss (the schedule's forward-only path) is compared as well.

One torchrun launch per world size; each case is one line of ``LAYOUTS``. Tensor parallelism
composes through the same plan (PP x TP on 4 processes), and the 3-D layout PP x TP x FSDP,
2 x 2 x 2, is the smallest there is: 8 processes on this machine's 2 cores, kept to one case.

Document masking (``[model] attn_mask_type = "block_causal"``) rides in the same launches: PP=2,
where later stages get the document ids beside their activations, and FSDP=2 and TP=2 (attention
sees the whole sequence after the sequence-parallel all-gather), each against one process with
the same mask. Same kernels (SDPA with the explicit mask in every layout), sums reordered as
above: class (b), FP32_PARITY_TOL. The masked reference must differ from the causal one by far
more than that, or the corpus' samples held no document boundary and the cases proved nothing.
"""

import pytest
from harness import FP32_PARITY_TOL, assert_close, launch_layouts, losses
from layouts import PP2_MICROBATCHES, TP2

TOL = FP32_PARITY_TOL  # class (b), reordered fp32 sums: derivation in tests/harness.py
SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
             "ZBVZeroBubble", "DualPipeV"]
VALIDATION = ["--validation.enable=true", "--validation.freq=3", "--validation.steps=2"]
# Global batch 4: with PP alone one schedule step of 4 microbatches of 1 sequence (the tiny
# flavor's 4 layers make 2 stages of 2 layers, or 4 stages of 1 for 2 stages per rank).
PP2 = [*PP2_MICROBATCHES, *VALIDATION]
# With 2 data-parallel replicas, 2 sequences per rank: 2 microbatches per schedule step.
PP2_DP2 = [*PP2, "--training.local_batch_size=2"]
BLOCK_CAUSAL = ["--model.attn_mask_type=block_causal", "--training.local_batch_size=4",
                *VALIDATION]


def schedule(name: str) -> str:
    return f"--parallelism.pipeline_parallel_schedule={name}"


LAYOUTS: dict[int, dict[str, list[str]]] = {
    1: {"reference": ["--training.local_batch_size=4", *VALIDATION],
        "block_causal_reference": BLOCK_CAUSAL},
    2: {
        **{f"pp2_{name}": [*PP2, schedule(name)] for name in SCHEDULES},
        # 2 schedule steps of 2 microbatches accumulate into one optimizer step; validation
        # reads the same 2 global batches as the reference, in 4 local batches of 2.
        "pp2_accumulation": [*PP2, "--training.local_batch_size=2"],
        # Activation checkpointing through the plan, under the split (B/W) backward.
        "pp2_ZBVZeroBubble_full_ac": [*PP2, schedule("ZBVZeroBubble"),
                                      "--activation_checkpoint.mode=full"],
        # An uneven explicit split: 1 layer, then 3 layers and the head.
        "pp2_explicit_split": [*PP2, "--parallelism.pipeline_parallel_module_fqns_per_stage="
                               "tok_embeddings layers.0,layers.1 layers.2 layers.3 norm output"],
        "block_causal_pp2": [*PP2, *BLOCK_CAUSAL],
        "block_causal_fsdp2": [*BLOCK_CAUSAL, "--training.local_batch_size=2"],
        "block_causal_tp2": [*BLOCK_CAUSAL, *TP2],
    },
    4: {
        "pp2_fsdp2": PP2_DP2,
        "pp2_fsdp2_ZBVZeroBubble": [*PP2_DP2, schedule("ZBVZeroBubble")],
        "pp2_tp2": [*PP2, *TP2],
        "pp2_tp2_Interleaved1F1B": [*PP2, *TP2, schedule("Interleaved1F1B")],
    },
    8: {"pp2_tp2_fsdp2": [*PP2_DP2, *TP2]},
}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    return launch_layouts(LAYOUTS, tmp_path_factory.mktemp("pipeline"), corpus)


def validation_losses(records: list[dict]) -> list[float]:
    return [r["validation_loss"] for r in records if "validation_loss" in r]


@pytest.mark.parametrize("case", [c for n, cases in LAYOUTS.items() if n > 1 for c in cases])
def test_matches_one_process(runs, case):
    reference = runs["block_causal_reference" if case.startswith("block_causal") else "reference"]
    assert len(losses(runs[case])) == 5
    assert_close(losses(runs[case]), losses(reference), TOL)
    assert len(validation_losses(runs[case])) == 2  # after steps 3 and 5: eval, then train on
    assert_close(validation_losses(runs[case]), validation_losses(reference), TOL)


def test_block_causal_masking_changes_the_run(runs):
    masked, causal = losses(runs["block_causal_reference"]), losses(runs["reference"])
    assert max(abs(m - c) for m, c in zip(masked, causal, strict=True)) > 100 * TOL


def test_rank0_reports_the_last_stage_metrics(runs):
    """Rank 0 holds the first stage under 1F1B; its records carry the global loss anyway."""
    records = [r for r in runs["pp2_1F1B"] if "loss" in r]
    assert records[-1]["loss"] < records[0]["loss"]
    reference = [r for r in runs["reference"] if "loss" in r]
    for record, expected in zip(records, reference, strict=True):
        # Tells the global norm from one stage's (>= 10% off); reordering moves it ~1e-6.
        assert record["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)
        for key in ("step", "loss", "lr", "tokens_per_second", "tflops", "mfu", "memory_gib"):
            assert record[key] is not None and record[key] > 0, key
