"""The deepseek_v3 family: published parameter counts, FLOPs from active parameters, YaRN, and
a forward/backward of the debug model."""

import dataclasses
import math

import pytest
import torch

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.models.deepseek_v3 import DeepSeekV3Model, YarnScaling, deepseek_v3_flavors
from torchtitan_like.models.deepseek_v3.model import rope_frequencies, yarn_mscale
from torchtitan_like.validate import parse_args


@pytest.mark.parametrize(("flavor", "total", "active", "published_total", "published_active"), [
    # DeepSeek-V3 technical report: 671B total, 37B activated per token.
    ("671B", 671_026_404_352, 36_625_603_584, 671e9, 37e9),
    # DeepSeek-V2 paper: 236B total, 21B activated.
    ("236B", 235_741_434_880, 20_851_512_320, 236e9, 21e9),
    # DeepSeek-V2-Lite (the V2 paper's appendix): 15.7B total, 2.4B activated.
    ("16B", 15_706_484_224, 2_451_435_008, 15.7e9, 2.4e9),
])
def test_published_parameter_counts(flavor, total, active, published_total, published_active):
    """Our counts exactly (pins), and the published figures, which are rounded to two or
    three significant digits: totals within 0.2%, active counts within 2.5% (V2-Lite's
    2.45B, published as 2.4B, is the widest gap)."""
    args = deepseek_v3_flavors[flavor]
    assert (args.num_params(), args.num_active_params()) == (total, active)
    assert abs(total / published_total - 1) < 0.002
    assert abs(active / published_active - 1) < 0.025


def test_flops_count_active_parameters():
    args = deepseek_v3_flavors["671B"]
    a = args
    attention = 6 * a.n_layers * a.n_heads * 4096 * (a.qk_head_dim + a.v_head_dim)
    assert args.flops_per_token(4096) == 6 * args.num_active_params() + attention
    assert args.flops_per_token(4096) < 6 * args.num_params() / 10  # 37B of 671B


def test_debug_model_counts_match_its_modules():
    args = deepseek_v3_flavors["debugmodel"]
    model = DeepSeekV3Model(args)
    assert sum(p.numel() for p in model.parameters()) == args.num_params()
    q_lora = dataclasses.replace(args, q_lora_rank=32)
    assert sum(p.numel() for p in DeepSeekV3Model(q_lora).parameters()) == q_lora.num_params()


def test_debug_model_forward_backward():
    args = dataclasses.replace(deepseek_v3_flavors["debugmodel"], max_seq_len=16)
    torch.manual_seed(0)
    model = DeepSeekV3Model(args)
    model.init_weights()
    tokens = torch.randint(0, args.vocab_size, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, args.vocab_size)
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    moe_layers = [layer.moe for layer in model.layers.values() if layer.moe_enabled]
    assert len(moe_layers) == args.n_layers - args.n_dense_layers
    assert all(m.tokens_per_expert.sum() == 2 * 16 * args.moe.top_k for m in moe_layers)


def test_yarn_frequencies():
    plain = rope_frequencies(64, 10000.0, None)
    scaling = YarnScaling(factor=40.0, original_max_position=4096)
    yarn = rope_frequencies(64, 10000.0, scaling)
    # Fast rotations (first dims) are kept, slow ones (last dims) divided by the factor.
    assert yarn[0] == plain[0]
    torch.testing.assert_close(yarn[-1], plain[-1] / 40.0)
    assert ((yarn <= plain) & (yarn >= plain / 40.0)).all()
    assert yarn_mscale(40.0, 1.0) == pytest.approx(0.1 * math.log(40.0) + 1)
    assert yarn_mscale(1.0, 1.0) == 1.0


def test_yarn_applies_only_beyond_the_original_context():
    args = deepseek_v3_flavors["671B"]
    assert not dataclasses.replace(args, max_seq_len=4096).yarn_active
    assert dataclasses.replace(args, max_seq_len=8192).yarn_active


def test_unsupported_layouts_are_refused_at_start_up():
    base = ["--model.name", "deepseek_v3", "--model.flavor", "debugmodel"]
    cp2 = ["--parallelism.context_parallel_degree", "2"]
    parse_args([*base, *cp2], 2)  # ring attention with MLA's values padded
    parse_args([*base, "--model.flavor", "debugmodel_aux", *cp2], 2)  # counts summed over CP
    with pytest.raises(ConfigError, match="n_heads = 4 is not divisible"):
        parse_args([*base, "--parallelism.tensor_parallel_degree", "8",
                    "--parallelism.expert_tensor_parallel_degree", "8"], 8)
    parse_args([*base, "--compile.enable"], 1)
    parse_args([*base, "--compile.enable", "--parallelism.tensor_parallel_degree", "2",
                "--parallelism.expert_tensor_parallel_degree", "2"], 2)


@pytest.mark.parametrize("ac", ["none", "full"])
def test_moe_blocks_are_compiled_around_the_moe_layer(ac):
    """The dense block compiles whole; an MoE block compiles its attention, router and shared
    experts, and leaves the MoE layer's routing glue and routed experts (and the block's own
    forward, residual adds) eager, also inside an activation-checkpoint wrapper. (Compiling
    happens lazily: this only inspects where it was set up.)"""
    from torchtitan_like.config.job_config import ActivationCheckpoint, Compile
    from torchtitan_like.distributed.activation_checkpoint import apply_ac
    from torchtitan_like.distributed.compile import apply_compile
    from torchtitan_like.distributed.plan_check import _compiled
    from torchtitan_like.models.moe import routed_experts

    with torch.device("meta"):
        model = DeepSeekV3Model(deepseek_v3_flavors["debugmodel"])
    experts = routed_experts(model.layers.values())
    apply_ac(model.layers, ActivationCheckpoint(mode=ac))
    apply_compile(model.layers, Compile(enable=True), experts)
    compiled = {name for name, m in model.layers.named_modules() if _compiled(m)}
    unwrap = "._checkpoint_wrapped_module" if ac == "full" else ""
    assert "0" in compiled
    moe_block = {f"1{unwrap}.{name}" for name in
                 ("attention", "moe.router", "moe.shared_experts")}
    assert moe_block <= compiled
    assert not {"1", f"1{unwrap}", f"1{unwrap}.moe", f"1{unwrap}.moe.experts"} & compiled


def test_tensor_parallel_regions_are_compiled_inside(one_process_group):
    """Under TP (a one-rank TP mesh here) MLA and the MoE layer run as local TP regions: MLA's
    own forward is compiled while its hooks (the collectives, the parameter swap) stay eager,
    the MoE region is compiled around its routed experts, the dense SwiGLU pair whole."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from torchtitan_like.config.job_config import Compile
    from torchtitan_like.distributed.compile import apply_compile
    from torchtitan_like.distributed.plan_check import _compiled
    from torchtitan_like.models.deepseek_v3.parallelize import block_tp_plan
    from torchtitan_like.models.moe import routed_experts

    with torch.device("meta"):
        model = DeepSeekV3Model(deepseek_v3_flavors["debugmodel"])
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    for block in model.layers.values():
        parallelize_module(block, mesh, block_tp_plan(block, "cpu"))
    apply_compile(model.layers, Compile(enable=True), routed_experts(model.layers.values()))
    inside = {name for name, m in model.layers.named_modules() if "forward" in vars(m)}
    whole = {name for name, m in model.layers.named_modules() if _compiled(m)} - inside
    assert inside == {f"{i}.attention" for i in range(4)}
    assert whole == {"0.feed_forward", *(f"{i}.moe.{part}" for i in (1, 2, 3)
                                         for part in ("router", "shared_experts"))}
