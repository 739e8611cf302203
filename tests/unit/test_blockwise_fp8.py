"""Blockwise float8 (components/blockwise_fp8.py): the GEMMs against fp64 within a bound derived
from e4m3, the quantizers against torchao's own reference, the conversion scope, the checks.

The per-element bound of one blockwise GEMM C = A B^T (A tiled 1x128 along K; B 1x128 or
128x128). A tile with amax a gets the scale s = 448/a, so an element x becomes
q(x s)/s with q rounding to e4m3: for a normal e4m3 result (|x s| >= 2^-6) the error is at
most half an ulp, 2^-4 |x| (3 mantissa bits); below, in e4m3's subnormals (spacing 2^-9), at
most 2^-10 / s = 2^-10 a / 448. The scale's own fp32 roundings (s, x s, 1/s: one each) add
3 x 2^-24 |x|. So |x^ - x| <= e(x) = (2^-4 + 2^-22) |x| + 2^-10 a / 448, and

    |C^ - C| <= |A| e(B)^T + e(A) |B|^T + e(A) e(B)^T                     (quantization)
              + (128 + K/128 + 2) 2^-24 |A^| |B^|^T                        (fp32 sums)
              + 2^-8 (|C| + the two lines above)                          (bf16 output)

where |A^| <= |A| + e(A): the fp32 sums are a 128-term partial sum per block, two scale
products and a sum over the K/128 blocks, each term rounded at most once per addition
(Higham's gamma_n ~ n 2^-24), and the GEMM emits bf16 (half an ulp: 2^-8 of 8 bits). The bound holds
for the forward and, with their operands, for the input gradient (dY 1x128 along N, W^T in
the forward's 128x128 blocks) and the weight gradient (dY^T and X^T, both 1x128 along the
tokens). The tests print the margin: the largest |error| / bound.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
import torch
import torchao
from torch import nn

from torchtitan_like.components import blockwise_fp8
from torchtitan_like.components.blockwise_fp8 import (
    BLOCK,
    E4M3_MAX,
    EmulatedBlockwiseLinear,
    blockwise_mm,
    emulated_blockwise_linear,
    gpu_unsupported_reason,
    quantize_blocks,
    quantize_rows,
    select_blockwise,
)
from torchtitan_like.components.float8 import Float8Converter
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Float8
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.models.deepseek_v3 import DeepSeekV3Model, deepseek_v3_flavors
from torchtitan_like.models.llama3 import Llama3Args, Transformer
from torchtitan_like.validate import parse_args

BLOCKWISE = Float8(enable=True, recipe_name="blockwise")


def torchao_reference_quantizers() -> dict:
    """torchao's pure-torch reference quantizers (``torch_blockwise_scale_*`` in
    ``torchao/prototype/blockwise_fp8_training/kernels.py``), read from its source: the module
    imports Triton at its top, which CPU torch lacks, so its three plain-torch functions are
    executed on their own, unchanged, with the names they use."""
    source = Path(torchao.__file__).parent / "prototype/blockwise_fp8_training/kernels.py"
    tree = ast.parse(source.read_text())
    wanted = [node for node in tree.body if isinstance(node, ast.FunctionDef)
              and node.name.startswith("torch_blockwise_scale_")]
    namespace = {"torch": torch, "Tuple": tuple, "e4m3_dtype": torch.float8_e4m3fn,
                 "EPS": 1e-12, "FP8_E4M3_DTYPES": {torch.float8_e4m3fn, torch.float8_e4m3fnuz}}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(source), "exec"), namespace)
    assert len(wanted) == 3, [node.name for node in wanted]
    return {node.name: namespace[node.name] for node in wanted}


def operand(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Gaussian values with a few outlier columns (x30), as activations have."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    x[:, torch.randperm(cols, generator=g)[:4]] *= 30
    return x


def dequantized(q: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """fp64 values of e4m3 ``q`` times its tiles' inverse scales (exact in fp64)."""
    rows = q.shape[0]
    per_row = inverse if inverse.shape[0] == rows else inverse.repeat_interleave(BLOCK, 0)
    return q.double() * per_row.double().repeat_interleave(BLOCK, 1)


def test_quantizers_equal_torchaos_reference_bit_for_bit():
    reference = torchao_reference_quantizers()
    x, w = operand(256, 384, 0), operand(256, 384, 1)
    for ours, theirs in ((quantize_rows(x), reference["torch_blockwise_scale_act_quant_lhs"](x)),
                         (quantize_blocks(w),
                          reference["torch_blockwise_scale_weight_quant"](w))):
        assert torch.equal(ours[0].view(torch.uint8), theirs[0].view(torch.uint8))
        assert torch.equal(ours[1], theirs[1])
    # 128x1 tiles of X (the weight gradient's right operand) = 1x128 tiles of X^T.
    q, inverse = quantize_rows(x.t().contiguous())
    theirs_q, theirs_inverse = reference["torch_blockwise_scale_act_quant_rhs"](x)
    assert torch.equal(q.t().view(torch.uint8), theirs_q.view(torch.uint8))
    assert torch.equal(inverse.t(), theirs_inverse)


def test_emulated_gemm_equals_the_dequantized_product_up_to_summation_order():
    """Against fp64 of torchao's quantize-dequantize (the same quantized values): only fp32
    rounding differs, at most (128 + K/128 + 2) 2^-24 of sum |a^ b^| per element."""
    x, w = operand(256, 512, 2), operand(384, 512, 3)
    (xq, xs), (wq, ws) = quantize_rows(x), quantize_blocks(w)
    a, b = dequantized(xq, xs), dequantized(wq, ws)
    ours = blockwise_mm(xq, xs, wq, ws).double()
    bound = (128 + 512 // BLOCK + 2) * 2.0**-24 * (a.abs() @ b.abs().t())
    margin = ((ours - a @ b.t()).abs() / bound).max().item()
    print(f"emulated vs dequantized: margin {margin:.3g}")
    assert margin <= 1


def tile_error(t: torch.Tensor, square: bool) -> torch.Tensor:
    """e(t) of the module docstring: the largest quantization error of each element of ``t``
    (R, C), tiled 1x128 along C or (``square``) 128x128."""
    rows, cols = t.shape
    if square:
        amax = t.abs().reshape(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK).amax(dim=(1, 3))
        amax = amax.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    else:
        amax = t.abs().reshape(rows, cols // BLOCK, BLOCK).amax(-1).repeat_interleave(BLOCK, 1)
    return (2.0**-4 + 2.0**-22) * t.abs() + 2.0**-10 * amax / E4M3_MAX


def gemm_bound(a: torch.Tensor, b: torch.Tensor, b_square: bool) -> torch.Tensor:
    """The module docstring's bound for C = a b^T (fp64 operands, both reduced over dim 1)."""
    ea, eb = tile_error(a, False), tile_error(b, b_square)
    quantization = a.abs() @ eb.t() + ea @ b.abs().t() + ea @ eb.t()
    sums = (128 + a.shape[1] // BLOCK + 2) * 2.0**-24 * ((a.abs() + ea) @ (b.abs() + eb).t())
    return quantization + sums + 2.0**-8 * ((a @ b.t()).abs() + quantization + sums)


def test_forward_and_both_gradients_within_the_e4m3_bound():
    x = operand(256, 512, 4).requires_grad_()
    w = (operand(384, 512, 5) * 0.02).requires_grad_()
    dy = operand(256, 384, 6) * 1e-3
    y = emulated_blockwise_linear(x, w)
    y.backward(dy)
    xd, wd, dyd = x.detach().double(), w.detach().double(), dy.double()
    checks = {
        "forward": (y, xd @ wd.t(), gemm_bound(xd, wd, b_square=True)),
        "input gradient": (x.grad, dyd @ wd, gemm_bound(dyd, wd.t(), b_square=True)),
        "weight gradient": (w.grad, dyd.t() @ xd, gemm_bound(dyd.t(), xd.t(), b_square=False)),
    }
    for name, (ours, exact, bound) in checks.items():
        error = (ours.double() - exact).abs()
        margin = (error / bound).max().item()
        relative = (error.norm() / exact.norm()).item()
        print(f"{name}: margin {margin:.3g} of the bound, relative error {relative:.3g}")
        assert margin <= 1, name
        assert relative > 1e-3, f"{name}: no float8 rounding happened"


def test_a_saturating_scale_breaks_the_bound(monkeypatch):
    """Negative control: a scale 2x too large clips each tile's largest elements."""
    monkeypatch.setattr(blockwise_fp8, "E4M3_MAX", 2 * E4M3_MAX)
    x, w = operand(128, 256, 7), operand(128, 256, 8)
    y = blockwise_fp8.emulated_blockwise_linear(x, w)
    xd, wd = x.double(), w.double()
    assert ((y.double() - xd @ wd.t()).abs() / gemm_bound(xd, wd, True)).max() > 1


def test_module_keeps_the_weight_and_its_name():
    with torch.device("meta"):
        linear = nn.Linear(256, 128, bias=False)
    converted = EmulatedBlockwiseLinear.from_linear(linear)
    assert converted.weight is linear.weight
    assert list(converted.state_dict()) == ["weight"]


def test_what_stays_in_high_precision_is_named_in_one_line(caplog):
    """DeepSeek-V3 debug model: only the 128-multiple linears without bias in the blocks
    convert (wo, the dense SwiGLU); the head, the router gate and the narrow projections stay."""
    with torch.device("meta"):
        model = DeepSeekV3Model(deepseek_v3_flavors["debugmodel"])
    with caplog.at_level(logging.INFO, logger="torchtitan_like"):
        Float8Converter(BLOCKWISE, ParallelDims.resolve(1), "cpu", False).convert(model)
    converted = {fqn for fqn, m in model.named_modules()
                 if isinstance(m, EmulatedBlockwiseLinear)}
    assert converted == {f"layers.{i}.attention.wo" for i in range(4)} | {
        f"layers.0.feed_forward.{w}" for w in ("w1", "w2", "w3")}
    kept = [r.message for r in caplog.records if "kept in high precision" in r.message]
    assert len(kept) == 1
    for expected in ("output (outside the transformer blocks)",
                     "layers.1.moe.router.gate (MoE gating)",
                     "layers.1.attention.wkv_a (80x128 not a multiple of 128)"):
        assert expected in kept[0]


def test_the_mtp_depths_are_blocks():
    """DeepSeek-V3's MTP depth (a block, and its 2 dim -> dim projection) converts as the
    trunk's blocks do."""
    import dataclasses

    with torch.device("meta"):
        model = DeepSeekV3Model(dataclasses.replace(deepseek_v3_flavors["debugmodel"],
                                                    mtp_depth=1))
    selection = select_blockwise(model, filter_fqns=[])
    assert {"mtp.depths.0.eh_proj", "mtp.depths.0.block.attention.wo"} <= set(
        selection.converted)
    assert selection.kept["mtp.depths.0.block.moe.router.gate"] == "MoE gating"


def test_bias_filter_and_tensor_parallel_shapes():
    with torch.device("meta"):
        model = nn.ModuleDict({"layers": nn.ModuleList([nn.ModuleDict({
            "biased": nn.Linear(256, 256), "plain": nn.Linear(256, 256, bias=False),
            "narrow": nn.Linear(256, 128, bias=False)})])})
    selection = select_blockwise(model, filter_fqns=[])
    assert selection.converted == ["layers.0.plain", "layers.0.narrow"]
    assert selection.kept["layers.0.biased"] == "has a bias"
    under_tp = select_blockwise(model, filter_fqns=["plain"], tp=2)
    assert under_tp.converted == []
    assert under_tp.kept["layers.0.narrow"] == "128x256 not a multiple of 128 x TP 2"
    assert under_tp.kept["layers.0.plain"] == "filter_fqns ['plain']"


def test_llama_linears_train_through_the_emulated_module():
    torch.manual_seed(0)
    model = Transformer(Llama3Args(dim=128, n_layers=1, n_heads=8, vocab_size=256,
                                   multiple_of=128))
    model.init_weights()
    Float8Converter(BLOCKWISE, ParallelDims.resolve(1), "cpu", False).convert(model)
    assert isinstance(model.layers["0"].feed_forward.w1, EmulatedBlockwiseLinear)
    model(torch.randint(0, 256, (2, 64))).float().logsumexp(-1).sum().backward()
    assert model.layers["0"].feed_forward.w1.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("flags, message", [
    (["--training.seq_len", "96", "--training.local_batch_size", "1"],
     "a rank's GEMMs see 96"),
    (["--float8.enable_fsdp_float8_all_gather", "true"], 'needs recipe_name = "tensorwise"'),
])
def test_refused_at_start_up(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(["--float8.enable", "true", "--float8.recipe_name", "blockwise", *flags],
                   world_size=1)


def test_only_hopper_runs_the_gpu_path():
    assert gpu_unsupported_reason("NVIDIA H100", (9, 0)) is None
    for gpu, capability in (("NVIDIA L4", (8, 9)), ("NVIDIA B200", (10, 0))):
        assert f"{gpu} has {capability[0]}.{capability[1]}" in gpu_unsupported_reason(
            gpu, capability)
