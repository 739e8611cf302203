"""Qwen3 (dense and MoE debug models) under every parallel dimension reproduces one process.

Qwen3 runs llama's plan (TP -> CP -> AC -> compile -> FSDP, the same pipeline split), which
tests/parallel/ proves case by case for llama; here each dimension runs once more on Qwen3,
aimed at what Qwen3 adds: the per-head q/k RMSNorms under TP (their weights are replicated
DTensors whose gradients sum over the TP ranks, parallelize.py), the untied head of the MoE
flavor across pipeline stages, and the MoE layer under FSDP/HSDP, PP, AC, expert
parallelism (the token all-to-alls change which rank multiplies a token, not the sums; also
with EP borrowing context-parallel ranks) and TP x FSDP (each TP rank computes a slice of
every expert's hidden features; the slices and the replicated router's gradients are summed
over TP: reordered sums again).

fp32, deterministic kernels, same seed and global batch (4 x 64 tokens), 5 steps. The layouts
change only the order of floating-point sums (reduce-scatters, row-wise all-reduces, ring
attention's merged softmax, a rank's expert GEMMs over fewer rows): measured at most 1.9e-6
(first 3 steps; losses 10.5 -> 5.2 dense, 8.1 -> 7.2 MoE), so 1e-5 as for llama.
Float8 (dense only) is compared with the fp32 run
within 1e-2, the bound tests/parallel/test_float8_fsdp.py derives for float8 rounding
(measured 4.8e-3). Without the q/k norm styles, TP fails outright (plain and DTensor
gradients mixed), so a dropped style cannot pass silently either.
"""

import pytest
import torch
from harness import assert_close, launch, losses
from layouts import CP2, EP2, ETP2, HSDP, PP2, TP2, WHOLE

TOL = 1e-5
FLOAT8_TOL = 1e-2
DENSE = ["--model.name", "qwen3", "--model.flavor", "debugmodel"]
MOE = ["--model.name", "qwen3", "--model.flavor", "debugmodel_moe"]
PP2_MB1 = [*PP2, "--parallelism.pipeline_parallel_microbatch_size=1"]


ONE = {"dense": [*DENSE, *WHOLE], "moe": [*MOE, *WHOLE]}
FOUR = {
    "dense_cp2_tp2": [*DENSE, *WHOLE, *CP2, *TP2],
    "dense_fsdp2_tp2_float8": [*DENSE, *TP2, "--float8.enable", "true",
                               "--float8.emulate", "true"],
    "moe_pp2_fsdp2": [*MOE, *PP2_MB1, "--training.local_batch_size", "2"],
    "moe_hsdp2x2_ac": [*MOE, *HSDP,
                       "--training.local_batch_size", "1",
                       "--activation_checkpoint.mode", "full"],
    # FSDP 4 x EP 2: each rank computes 4 of the 8 experts, expert weights FSDP-sharded
    # over the 2 ranks that hold the same experts
    "moe_fsdp4_ep2": [*MOE, "--training.local_batch_size", "1", *EP2],
    # CP 2 x FSDP 2, EP 2 borrowing from both: an all-to-all partner may be the rank
    # holding the other half of the same sequences; experts FSDP-sharded over 2 ranks
    # (measured 4.8e-7, default and avx2 kernels)
    "moe_cp2_ep2": [*MOE, *CP2, *EP2],
    # TP 2 x FSDP 2: attention split by heads, every expert by hidden features (ETP = TP)
    "moe_fsdp2_tp2": [*MOE, *TP2, *ETP2],
    # compiled blocks (q/k norms inside) under FSDP 4: fused kernels reorder fp32 sums
    # (+ an inductor cache per kernel level, the fixture's)
    "dense_fsdp4_compile": [*DENSE, "--training.local_batch_size", "1",
                            "--compile.enable", "true"],
}
PARITY = [c for c in FOUR if "float8" not in c]
"""Against the fp32 run of the same family (the float8 case against it within FLOAT8_TOL)."""


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3")
    # one inductor cache per kernel level: its key does not include ATEN_CPU_CAPABILITY
    level = torch.backends.cpu.get_cpu_capability().lower()
    cache = ["--compile.cache_dir", str(tmp_path_factory.getbasetemp().parent
                                        / f"inductor_{level}")]
    one = launch(1, ONE, root / "one", corpus)
    compiled = [*FOUR["dense_fsdp4_compile"], *cache]
    four = launch(4, {**FOUR, "dense_fsdp4_compile": compiled}, root / "four", corpus)
    return {**one, **four}


@pytest.mark.parametrize("case", PARITY)
def test_matches_one_process(runs, case):
    reference = runs[case.split("_")[0]]
    assert len(losses(runs[case])) == 5
    assert_close(losses(runs[case]), losses(reference), TOL)


def test_float8_trains_like_fp32(runs):
    assert_close(losses(runs["dense_fsdp2_tp2_float8"]), losses(runs["dense"]), FLOAT8_TOL)
