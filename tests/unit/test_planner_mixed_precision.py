"""The planner counts each tensor in the dtype the trainer holds it in
(tools/planner/mixed_precision.py): autocast without FSDP (fp32 residual stream and norms, one
compute-dtype cast per matmul input, the weights' casts), 16-bit parameters as FSDP's mixed
precision gathers them (the composite RMSNorm's fp32 tensors, the CPU attention's fp32
copies), the optimizer step's temporaries by implementation, and the one-GPU jobs users try.

The block counts are checked against what autograd really keeps (MemTracker over one block's
forward, as tests/unit/test_planner.py does in fp32): a tensor's size is exact, so the only
slack is the per-row fp32 rstd the count leaves out (1/dim of a norm's input, under 1%).
"""

import dataclasses

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from torchtitan_like.config.manager import build_job_config
from torchtitan_like.models.llama3.args import llama3_flavors
from torchtitan_like.models.llama3.model import Transformer
from torchtitan_like.tools import plan_cli
from torchtitan_like.tools.planner import (
    CPU,
    GPUS,
    Layout,
    ModelShape,
    Precision,
    from_job_config,
    layer_elements,
    stage_memory,
)
from torchtitan_like.tools.planner.attention import kernel_bytes
from torchtitan_like.tools.planner.mixed_precision import autocast, layer_extra_bytes

BF16 = Precision(compute_bytes=2)


def _kept_by_one_block(model: Transformer, x: torch.Tensor, cast: bool) -> int:
    """Bytes one block's forward leaves alive, its output not counted, less the weights'
    autocast casts (memory.py counts them with the weights: a bf16 copy of each block weight).
    The input counts where the block keeps it: an fp32 input is what the composite RMSNorm
    saves; a bf16 one the norm upcasts and saves in fp32, and nothing else keeps it."""
    tracker = MemTracker()
    tracker.track_external(model, x)
    block = model.layers["0"]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cast), tracker:
        before = tracker.get_tracker_snapshot()[torch.device("cpu")]["Total"]
        y = block(x, model.rope_cache)
        after = tracker.get_tracker_snapshot()[torch.device("cpu")]["Total"]
    casts = sum(p.numel() for p in block.parameters() if p.dim() == 2) * 2 if cast else 0
    kept_input = x.numel() * x.element_size() if x.dtype == torch.float32 else 0
    return after - before - y.numel() * y.element_size() + kept_input - casts


@pytest.mark.parametrize("cast", [True, False], ids=["autocast fp32 weights",
                                                      "bf16 weights (FSDP's mixed precision)"])
def test_block_count_matches_what_autograd_keeps_in_bf16(cast):
    args = dataclasses.replace(llama3_flavors["tiny"], max_seq_len=64)
    model = Transformer(args) if cast else Transformer(args).to(torch.bfloat16)
    b, s = 4, 64
    x = torch.randn(b, s, args.dim, requires_grad=True,
                    dtype=torch.float32 if cast else torch.bfloat16)
    m = ModelShape.from_args(args)
    layout = Layout() if cast else Layout(dp_shard=2)
    assert autocast(layout, BF16) == cast
    per_token = (layer_elements(m, "none", 1, fused_norm=False) * 2
                 + kernel_bytes(m, s, 1) + layer_extra_bytes(m, CPU, BF16, layout))
    assert _kept_by_one_block(model, x, cast) == pytest.approx(per_token * b * s, rel=0.01)


def _memory(flags: list[str], nproc: int = 1):
    config = build_job_config(["--job.config_file", "train_configs/debug_model.toml", *flags])
    m, work, layout = from_job_config(config, nproc)
    return work, stage_memory(m, CPU, work, layout, 0, 1)


def test_autocast_weight_casts_live_through_backward_unless_their_block_is_recomputed():
    """Without FSDP a bf16 job keeps fp32 weights (4 bytes) and autocast's bf16 casts (2)
    until each matmul's backward; a checkpointed block saves none in forward."""
    bf16 = ["--training.mixed_precision_param", "bfloat16"]
    _, none = _memory(bf16)
    _, full = _memory([*bf16, "--activation_checkpoint.mode", "full"])
    _, fp32 = _memory([])
    m = ModelShape.from_args(llama3_flavors["debugmodel"])
    masters = m.num_params * 4
    head_cast = m.vocab_size * m.dim * 2
    assert fp32.parameters == pytest.approx(masters)
    assert none.parameters == pytest.approx(masters + (m.n_layers * m.block_params) * 2
                                            + head_cast)
    assert full.parameters == pytest.approx(masters + head_cast)  # at the loss's backward


def test_the_optimizer_step_temporary_follows_the_implementation():
    """torch's foreach Adam makes a temporary per parameter; the fused kernel and the chunked
    bf16-moments step do not."""
    foreach, _ = _memory([])
    fused, _ = _memory(["--optimizer.implementation", "fused"])
    moments, _ = _memory(["--optimizer.state_dtype", "bfloat16"])
    assert foreach.precision.step_temporary
    assert not fused.precision.step_temporary and not moments.precision.step_temporary


def test_llama_8b_fits_one_h200_with_bf16_moments_and_full_ac(capsys):
    """Issue 37's job: 4 + 4 + 2 + 2 bytes of state per parameter (96 GB for 8.03B) plus one
    recomputed block and the head's cast: fits 141 GB; with fp32 moments and a foreach step
    (a fifth 4 bytes per parameter at the optimizer step) it does not."""
    common = ["--flavor", "8B", "--gpu", "H200", "--num_gpus", "1", "--seq_len", "8192",
              "--global_batch", "1", "--compile", "--ac", "full"]
    assert plan_cli.main([*common, "--state_dtype", "bfloat16"]) == 0
    assert "FITS" in capsys.readouterr().out
    assert plan_cli.main(common) == 1
    assert "DOES NOT FIT (149.6" in capsys.readouterr().out  # optimizer step: 20 B/param
    assert GPUS["H200"].memory_gib > 140
