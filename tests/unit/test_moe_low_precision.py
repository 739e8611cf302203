"""Low-precision routed-expert GEMMs (components/moe_low_precision.py): torchao's emulated MXFP8
against the fp32 grouped GEMM within a bound derived from the format, and every refusal.

The bound (class c of docs/testing.md, derived, not fitted). MXFP8 stores each operand element
as e4m3 times its block's power-of-two scale, the scale rounded up from amax / 448, so the
block's largest element lands in (224, 448] and nothing saturates. An element in e4m3's normal
range is rounded to 3 mantissa bits: |q(a) - a| <= 2^-4 |a| (half an ulp). One below 2^-6 in
scaled units (subnormal, spacing 2^-9) is off by at most 2^-10 scaled units, i.e. at most
2^-10 x 2 amax / 448 < 2^-17 amax. So |q(a)| <= a_hat := (1 + 2^-4)|a| + 2^-17 max|A|,
whatever the blocking, and a product of two quantized operands errs by at most
a_hat b_hat - |a||b|, summed over the reduction: ``A_hat @ B_hat - |A| @ |B|``. The emulated
kernel dequantizes exactly into bf16 (3 mantissa bits times a power of two), multiplies
(exact in fp32) and sums in fp32 (relative K 2^-24 each for it and for the reference), then
rounds the output to bf16 (2^-9 relative): + (2^-9 + 2K 2^-24) A_hat @ B_hat. The same holds
for the input gradient (output gradient x weight, reduced over the expert's output dim) and the
weight gradient (output gradient^T x input, reduced over the expert's tokens), which torchao
quantizes along their own reduction dims. The bound is worst-case (all rounding errors
aligned); the measured error is ~4% of the output's largest element (docs/moe-low-precision.md).
"""

import copy
import re

import pytest
import torch
import torch.nn.functional as F

from torchtitan_like.components.moe_low_precision import (
    MoEGroupedMMConverter,
    check_experts,
    device_unsupported_reason,
)
from torchtitan_like.config.derived import float8_enabled, model_converters
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Float8
from torchtitan_like.models.moe.experts import GroupedExperts
from torchtitan_like.validate import parse_args

E4M3_HALF_ULP = 2.0**-4
SUBNORMAL = 2.0**-17  # of the operand's largest magnitude
BF16_OUTPUT = 2.0**-9
SILU_LIPSCHITZ = 1.1  # max |silu'(x)| = 1.0998
COUNTS = torch.tensor([5, 0, 37, 22])  # an empty expert; groups of no multiple of 32
ALIGNED = torch.tensor([32, 0, 64, 32])  # as GroupedExperts pads them for MXFP8
DEEPSEEK = ["--model.name", "deepseek_v3", "--model.flavor", "debugmodel"]
MXFP8_EMULATED = ["--float8.moe_grouped_mm", "mxfp8", "--float8.emulate", "true"]


def magnitude_bound(t: torch.Tensor) -> torch.Tensor:
    """The largest |q(t)| elementwise (module docstring)."""
    peak = t.abs().max() if t.numel() else 0.0  # an idle expert's empty group
    return (1 + E4M3_HALF_ULP) * t.abs() + SUBNORMAL * peak


def product_bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Largest |low-precision a @ b - fp32 a @ b| (module docstring)."""
    hat = magnitude_bound(a) @ magnitude_bound(b)
    return hat - a.abs() @ b.abs() + (BF16_OUTPUT + 2 * a.shape[1] * 2.0**-24) * hat


def experts_pair(seed: int = 0) -> tuple[GroupedExperts, GroupedExperts]:
    """The same experts (4, dim 64, hidden 96) in fp32, and converted to emulated MXFP8."""
    torch.manual_seed(seed)
    reference = GroupedExperts(dim=64, hidden_dim=96, num_experts=4)
    reference.init_weights(0.02)
    low = copy.deepcopy(reference)
    MoEGroupedMMConverter(Float8(moe_grouped_mm="mxfp8", emulate=True)).convert(low)
    return reference, low


def rows(t: torch.Tensor, counts: torch.Tensor = COUNTS) -> tuple[torch.Tensor, ...]:
    return torch.split(t, counts.tolist())


def test_one_grouped_gemm_forward_and_gradients_within_the_e4m3_bound():
    reference, low = experts_pair()
    assert type(low.w1.data).__name__ == "MXFP8TrainingWeightWrapperTensor"
    offs = torch.cumsum(ALIGNED, 0, dtype=torch.int32)
    x = torch.randn(int(ALIGNED.sum()), 64)
    upstream = torch.randn(int(ALIGNED.sum()), 96)
    results = []
    for experts in (reference, low):
        x_in = x.clone().requires_grad_()
        y = torch._grouped_mm(x_in, experts.w1.transpose(-2, -1), offs=offs)
        (y.float() * upstream).sum().backward()
        results.append((y, x_in.grad, experts.w1.grad))
    (y, dx, dw), (y_low, dx_low, dw_low) = results
    assert y_low.dtype == torch.bfloat16  # torch's scaled grouped GEMMs' only output dtype
    y_low = y_low.float()
    assert not torch.equal(y_low, y)
    w = reference.w1.detach()
    for e, (xe, ge) in enumerate(zip(rows(x, ALIGNED), rows(upstream, ALIGNED), strict=True)):
        checks = {
            "output": (rows(y_low, ALIGNED)[e] - rows(y, ALIGNED)[e], product_bound(xe, w[e].T)),
            "input gradient": (rows(dx_low, ALIGNED)[e] - rows(dx, ALIGNED)[e],
                               product_bound(ge, w[e])),
            "weight gradient": (dw_low[e] - dw[e], product_bound(ge.T, xe)),
        }
        for name, (error, bound) in checks.items():
            assert (error.abs() <= bound).all(), (e, name, (error.abs() - bound).max())
    assert torch.equal(dw_low[1], torch.zeros_like(dw_low[1]))  # no token, no gradient


def test_converted_experts_forward_within_the_propagated_bound():
    """The SwiGLU of three converted GEMMs on fp32 weights: each GEMM's bound, carried through
    silu (slope at most 1.1) and the product with the other branch, both computed in bf16 (the
    GEMMs' output dtype: one rounding each, 2^-9 relative), into w2's GEMM, whose input is the
    perturbed product (|h_q| <= |h| + dh), quantized again."""
    reference, low = experts_pair(seed=1)
    x = torch.randn(int(COUNTS.sum()), 64)
    with torch.no_grad():
        error = low(x, COUNTS) - reference(x, COUNTS)
        w1, w2, w3 = (w.detach() for w in (reference.w1, reference.w2, reference.w3))
        for e, xe in enumerate(rows(x)):
            h1, h3 = xe @ w1[e].T, xe @ w3[e].T
            e1, e3 = product_bound(xe, w1[e].T), product_bound(xe, w3[e].T)
            a = F.silu(h1).abs()
            da = SILU_LIPSCHITZ * e1 + BF16_OUTPUT * (a + SILU_LIPSCHITZ * e1)
            dh = da * h3.abs() + a * e3 + da * e3
            dh = dh + BF16_OUTPUT * (a * h3.abs() + dh)
            bound = product_bound(a * h3.abs() + dh, w2[e].T) + dh @ w2[e].abs().T
            assert (rows(error)[e].abs() <= bound).all(), (e, (rows(error)[e].abs() - bound).max())
    assert error.abs().max() > 0


def test_padding_the_token_groups_changes_nothing_in_fp32():
    """Zero rows after each expert's tokens (what the converter asks of GroupedExperts): the
    same outputs and gradients, up to fp32 GEMMs over more rows (class b)."""
    reference, _ = experts_pair()
    padded = copy.deepcopy(reference)
    padded.token_group_multiple = 32
    x = torch.randn(int(COUNTS.sum()), 64)
    results = []
    for experts in (reference, padded):
        x_in = x.clone().requires_grad_()
        y = experts(x_in, COUNTS)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        results.append([y, x_in.grad, *(w.grad for w in (experts.w1, experts.w2, experts.w3))])
    for ours, theirs in zip(*results, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_checkpoints_hold_plain_weights_and_move_between_jobs(tmp_path):
    """The state dict holds the high-precision weights as plain tensors (torchao's wrapper
    would need its classes to unpickle), loading writes into the wrapped parameters, and a
    checkpoint of converted experts loads into unconverted ones (and back): exact copies."""
    import torch.distributed.checkpoint as dcp

    reference, low = experts_pair()
    assert all(type(t) is torch.Tensor for t in low.state_dict().values())
    dcp.save({"model": low.state_dict()}, checkpoint_id=tmp_path / "low")
    plain, again = experts_pair(seed=2)
    for target in (plain, again):
        state = {"model": target.state_dict()}
        dcp.load(state, checkpoint_id=tmp_path / "low")
        target.load_state_dict(state["model"])
        for name, w in reference.named_parameters():
            assert torch.equal(getattr(target, name).detach(), w.detach()), name
    assert type(again.w1.data).__name__ == "MXFP8TrainingWeightWrapperTensor"


@pytest.mark.parametrize(("recipe", "emulate", "device", "gpu", "capability", "kernels", "needs"), [
    ("float8_rowwise", False, "cpu", "", (0, 0), False, r"compute capability 9\.0.*runs on cpu"),
    ("float8_rowwise", True, "cpu", "", (0, 0), False, "no emulated float8 row-wise"),
    ("float8_rowwise", False, "cuda", "NVIDIA B200", (10, 0), True,
     r"9\.0.*NVIDIA B200 has compute capability 10\.0"),
    ("mxfp8", False, "cpu", "", (0, 0), False, r"compute capability 10\.x.*runs on cpu"),
    ("mxfp8", False, "cuda", "NVIDIA H100", (9, 0), False,
     r"10\.x.*NVIDIA H100 has compute capability 9\.0"),
    ("mxfp8", False, "cuda", "NVIDIA B200", (10, 0), False, "lacks its MXFP8 CUDA kernels"),
])
def test_devices_that_cannot_run_a_recipe_are_named(recipe, emulate, device, gpu, capability,
                                                    kernels, needs):
    reason = device_unsupported_reason(recipe, emulate, device, gpu, capability, kernels)
    assert reason is not None
    assert re.search(needs, reason), reason


@pytest.mark.parametrize(("recipe", "emulate", "device", "capability", "kernels"), [
    ("mxfp8", True, "cpu", (0, 0), False),
    ("mxfp8", False, "cuda", (10, 0), True),
    ("float8_rowwise", False, "cuda", (9, 0), False),
])
def test_devices_that_can_run_a_recipe(recipe, emulate, device, capability, kernels):
    assert device_unsupported_reason(recipe, emulate, device, "GPU", capability, kernels) is None


@pytest.mark.parametrize(("flags", "message"), [
    (["--float8.moe_grouped_mm", "float8_rowwise"],
     r'moe_grouped_mm = "float8_rowwise" needs a CUDA GPU of compute capability 9\.0'),
    (["--float8.moe_grouped_mm", "mxfp8"],
     r'moe_grouped_mm = "mxfp8" needs a CUDA GPU of compute capability 10\.x.*emulate = true'),
    (["--float8.moe_grouped_mm", "float8_rowwise", "--float8.emulate", "true"],
     "no emulated float8 row-wise grouped GEMM"),
    ([*MXFP8_EMULATED, "--parallelism.tensor_parallel_degree", "2",
      "--parallelism.expert_tensor_parallel_degree", "2"],
     "tensor_parallel_degree = 2 is not supported"),
    (["--model.converters", "moe_grouped_mm"], "choose its recipe"),
])
def test_refused_at_start_up_with_one_line(flags, message):
    with pytest.raises(ConfigError, match=message) as refused:
        parse_args([*DEEPSEEK, *flags], world_size=2)
    assert "\n" not in str(refused.value)


def test_a_model_without_routed_experts_is_refused():
    with pytest.raises(ConfigError, match="has no routed experts"):
        parse_args(MXFP8_EMULATED, world_size=1)  # the default llama3 debugmodel


@pytest.mark.parametrize(("recipe", "dim", "hidden", "multiple"), [
    ("mxfp8", 48, 64, 32), ("float8_rowwise", 48, 40, 16),
])
def test_expert_dims_the_recipe_cannot_quantize_are_refused(recipe, dim, hidden, multiple):
    with torch.device("meta"):
        experts = [GroupedExperts(dim, hidden, 4)]
    with pytest.raises(ConfigError, match=f"multiples of {multiple}.*dim {dim} and expert "
                                          f"hidden size {hidden}"):
        check_experts(recipe, experts, tp=1, model="this model")
    with torch.device("meta"):
        looped = [GroupedExperts(64, 64, 4, use_grouped_mm=False)]
    with pytest.raises(ConfigError, match="per-expert loop"):
        check_experts(recipe, looped, tp=1, model="this model")


def test_the_switch_adds_its_converter():
    config = parse_args([*DEEPSEEK, *MXFP8_EMULATED], world_size=1)
    assert model_converters(config) == ["moe_grouped_mm"] and not float8_enabled(config)
    assert config.model.converters == []  # derived, not written into the config


def test_the_padded_token_count_is_fixed_by_the_tokens_alone():
    """Whatever the routing, the padded GEMMs see one row count (torchao autotunes per count:
    experts.py), every group a multiple, each token at its group's start plus its rank."""
    from torchtitan_like.models.moe.experts import _padded_rows

    for counts in ([5, 0, 17, 3], [25, 0, 0, 0], [0, 0, 0, 25], [7, 6, 6, 6]):
        counts = torch.tensor(counts)
        rows, padded, total = _padded_rows(counts, 16, 25)
        assert total == 25 + 4 * 15 + 11 == int(padded.sum())  # 96: 85 rounded up to 16
        assert (padded % 16 == 0).all() and (padded >= counts).all()
        starts = torch.cumsum(padded, 0) - padded
        expected = torch.cat([starts[e] + torch.arange(int(n)) for e, n in enumerate(counts)])
        assert torch.equal(rows, expected)
