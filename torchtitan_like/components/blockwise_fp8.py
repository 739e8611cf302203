"""Blockwise float8 linears: DeepSeek-V3's fine-grained FP8 recipe (``[float8] recipe_name =
"blockwise"``).

DeepSeek-V3 (technical report, section 3.3) runs the three GEMMs of every linear in e4m3 with
one scale per 1x128 tile of an activation (per token, per 128 channels) and per 128x128 block
of a weight, and accumulates in fp32, promoted every 128 elements of the reduction:

    Fprop  Y  = X W^T      X: 1x128 along K,        W: 128x128
    Dgrad  dX = dY W       dY: 1x128 along N,       W^T: 128x128 (the same tiles)
    Wgrad  dW = dY^T X     dY^T: 1x128 along M,     X: 128x1 (1x128 of X^T along M)

Each scale is ``s = 448 / amax(|tile|)`` (amax taken in fp64, floored at 1e-12, s rounded to
fp32), each element ``q = e4m3(clamp(x s, +-448))``, and the stored scale is ``1 / s``: no
element saturates, and a tile's error is e4m3's half-ulp at its own scale. Per output element
a GEMM computes ``sum_b (sum_{k in b} qa_k qb_k) / (s_a,b s_b,b)``: a 128-wide exact-ish partial
sum per block (products of e4m3 values are exact in fp32), scaled by the two blocks' inverse
scales and accumulated in fp32. Every dimension the scales tile must be a multiple of 128: a
converted linear's in and out features (checked when converting) and the tokens of a
microbatch (Wgrad tiles them; checked at start-up, ``validate``).

Two code paths.

- **GPU (CUDA SM 9.x, Hopper)**: torchao's ``Float8BlockwiseLinear``
  (``torchao.prototype.blockwise_fp8_training``), whose Triton kernels quantize and whose
  ``torch.nn.functional.scaled_mm`` with the BlockWise1x128/128x128 recipes multiplies. Its
  GEMMs emit bf16 (the only output it supports); ``BlockwiseLinear`` casts the output back to
  the input's dtype. It trained on an H200 with torch 2.11 (docs/gpu.md); its Triton kernels
  autotune up to 45 configurations per kernel and shape on the first step (132 s for the debug
  model there), which the job announces and Triton's cache keeps (components/first_step.py).
- **Emulated** (CPU always, and any device with ``[float8] emulate = true``):
  ``EmulatedBlockwiseLinear``, the same three GEMMs written with plain torch ops, quantized as
  above (equal, bit for bit, to torchao's own pure-torch reference quantizers:
  tests/unit/test_blockwise_fp8.py; torchao's module cannot be imported without Triton, which
  CPU torch lacks, so they are not called here) and accumulated per 128-wide block in fp32,
  with bf16 outputs like the GPU's. No speed-up: it is there for numerics.

What stays in high precision (``select_blockwise``): linears outside the transformer blocks
(outside every ModuleList/ModuleDict: the output head; embeddings and norms are no linears;
DeepSeek-V3's MTP depths are blocks), the MoE router's gate (DeepSeek keeps
gating in high precision; its forward reads the weight directly), linears with a bias, and
linears whose local in or out features are not multiples of 128 (x the TP degree). Attention
itself (softmax(QK^T)V) and the norms are not linears and keep their dtype.

Routed experts (``GroupedExperts``, no linears) are not converted: ``[float8] moe_grouped_mm``
is their switch, and it has no blockwise recipe (torchao 0.18's blockwise grouped GEMM is a
prototype function, not a training op config, whose quantization needs Triton on a GPU); the
conversion says so in one log line.

Tensor parallelism: under a plain Colwise/Rowwise style the emulated linear computes on the
local shards (``_on_local_shards``): with shards that are multiples of 128 every tile of a
shard is a tile of the whole weight or activation, so each rank uses the one-process scales,
and only the row-wise linears' partial sums are added in another order. The GPU module relies
on torchao's DTensor sharding rules for its ops instead (not run).

Checkpoints: both modules are ``nn.Linear`` subclasses with the same ``weight``: state dicts,
DCP and HF exports hold the plain high-precision weight.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Shard

from torchtitan_like.config.derived import float8_enabled
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.logging import logger
from torchtitan_like.models.moe.experts import GroupedExperts
from torchtitan_like.models.moe.router import TokenChoiceTopKRouter

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import Float8 as Float8Config
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import ParallelDims

BLOCK = 128
"""Tile edge of every scale (DeepSeek-V3's 1x128 and 128x128)."""

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448
AMAX_FLOOR = 1e-12
"""An all-zero tile gets this amax (a finite scale; its elements stay zero)."""

GEMM_DTYPE = torch.bfloat16
"""Output dtype of the blockwise GEMMs (torchao's scaled_mm path supports only bf16)."""

HOPPER = 9
"""The CUDA compute capability major the GPU path runs on."""


# ----------------------------------------------------------------------------- quantization


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, C) -> e4m3 values (R, C) and inverse scales (R, C/128): one per 1x128 tile."""
    rows, cols = x.shape
    tiles = x.reshape(rows, cols // BLOCK, BLOCK)
    q, inverse = _quantize_tiles(tiles, tiles.abs().amax(dim=-1, keepdim=True))
    return q.reshape(rows, cols), inverse.reshape(rows, cols // BLOCK)


def quantize_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, C) -> e4m3 values (R, C) and inverse scales (R/128, C/128): one per 128x128 block."""
    rows, cols = w.shape
    blocks = w.reshape(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
    q, inverse = _quantize_tiles(blocks, blocks.abs().amax(dim=(1, 3), keepdim=True))
    return q.reshape(rows, cols), inverse.reshape(rows // BLOCK, cols // BLOCK)


def _quantize_tiles(tiles: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = (E4M3_MAX / amax.double().clamp(min=AMAX_FLOOR)).float()
    q = (tiles * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, 1.0 / scale


def blockwise_mm(a: torch.Tensor, a_inverse: torch.Tensor, b: torch.Tensor,
                 b_inverse: torch.Tensor) -> torch.Tensor:
    """``a @ b^T`` of e4m3 operands a (M, K), b (N, K), both reduced over their last dim, with
    inverse scales a_inverse (M, K/128) and b_inverse (N, K/128) or (N/128, K/128): each
    128-wide block's partial sums in fp32, scaled by both blocks' inverse scales, summed over
    the blocks in fp32. Returns fp32 (M, N)."""
    with torch.autocast(a.device.type, enabled=False):  # fp32 under any autocast
        return _blockwise_mm_fp32(a, a_inverse, b, b_inverse)


def _blockwise_mm_fp32(a: torch.Tensor, a_inverse: torch.Tensor, b: torch.Tensor,
                       b_inverse: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[0]
    if b_inverse.shape[0] != n:  # 128x128 blocks: each row of b takes its block's scale
        b_inverse = b_inverse.repeat_interleave(BLOCK, dim=0)
    blocks = k // BLOCK
    a_blocks = a.float().reshape(m, blocks, BLOCK).transpose(0, 1)
    b_blocks = b.float().reshape(n, blocks, BLOCK).permute(1, 2, 0)
    partial = torch.bmm(a_blocks, b_blocks)  # (blocks, M, N)
    scales = a_inverse.t().unsqueeze(2) * b_inverse.t().unsqueeze(1)
    return (partial * scales).sum(dim=0)


class _EmulatedBlockwiseMM(torch.autograd.Function):
    """Y = X W^T and its two gradients, each a blockwise GEMM (module docstring). Saves the
    high-precision X and W, as torchao's function does, and quantizes again in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        x2 = x.reshape(-1, x.shape[-1])
        y = blockwise_mm(*quantize_rows(x2), *quantize_blocks(weight))
        return y.to(GEMM_DTYPE).reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        x, weight = ctx.saved_tensors
        x2 = x.reshape(-1, x.shape[-1])
        dy = grad_y.reshape(-1, grad_y.shape[-1])
        w_q, w_inverse = quantize_blocks(weight)
        grad_x = blockwise_mm(*quantize_rows(dy), w_q.t(), w_inverse.t())
        grad_w = blockwise_mm(*quantize_rows(dy.t()), *quantize_rows(x2.t()))
        return (grad_x.to(GEMM_DTYPE).reshape(x.shape).to(x.dtype),
                grad_w.to(GEMM_DTYPE).to(weight.dtype))


def emulated_blockwise_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight^T`` through the three emulated blockwise GEMMs (plain tensors)."""
    return _EmulatedBlockwiseMM.apply(x, weight)


def _on_local_shards(x: torch.Tensor, weight: DTensor) -> torch.Tensor:
    """The emulated linear under a Colwise (weight Shard(0), input replicated: output
    Shard(-1), input gradient partial) or Rowwise (weight Shard(1), input Shard(-1): output
    partial) tensor-parallel style, computed on the local shards."""
    (placement,) = weight.placements
    colwise = placement == Shard(0)
    if not isinstance(x, DTensor) or placement not in (Shard(0), Shard(1)):
        raise NotImplementedError(f"blockwise float8 under TP: unexpected weight placement "
                                  f"{weight.placements} or a plain input")
    local_x = x.to_local(grad_placements=[Partial()] if colwise else None)
    out = emulated_blockwise_linear(local_x, weight.to_local())
    return DTensor.from_local(out, weight.device_mesh,
                              [Shard(out.dim() - 1) if colwise else Partial()], run_check=False)


class EmulatedBlockwiseLinear(nn.Linear):
    """``nn.Linear`` (no bias) whose three GEMMs are emulated blockwise float8 (any device)."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> EmulatedBlockwiseLinear:
        """The same weight (same name: checkpoints are unchanged), built on meta."""
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=False)
        new.weight = linear.weight
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, DTensor):
            return _on_local_shards(x, self.weight)
        return emulated_blockwise_linear(x, self.weight)


@functools.cache
def _gpu_linear_class() -> type[nn.Linear]:
    """torchao's Float8BlockwiseLinear with its bf16 output cast back to the input's dtype
    (imported on first use: its module needs Triton)."""
    from torchao.prototype.blockwise_fp8_training.linear import Float8BlockwiseLinear

    class BlockwiseLinear(Float8BlockwiseLinear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x).to(x.dtype)

    return BlockwiseLinear


def _gpu_linear(linear: nn.Linear) -> nn.Linear:
    """``linear`` as torchao's Float8BlockwiseLinear (which asserts SM 9.0+ when built)."""
    return _gpu_linear_class().from_float(linear)


# -------------------------------------------------------------------------- model conversion


@dataclasses.dataclass
class BlockwiseSelection:
    """Which linears of a model get blockwise float8, and why the others do not."""

    converted: list[str]
    kept: dict[str, str]  # fqn -> reason


def select_blockwise(model: nn.Module, filter_fqns: list[str], tp: int = 1
                     ) -> BlockwiseSelection:
    """The ``nn.Linear`` modules to convert (module docstring, "What stays")."""
    blocks = [f"{name}." for name, m in model.named_modules()
              if name and isinstance(m, (nn.ModuleList, nn.ModuleDict))]
    routers = {fqn for fqn, m in model.named_modules() if isinstance(m, TokenChoiceTopKRouter)}
    multiple = BLOCK * tp
    selection = BlockwiseSelection(converted=[], kept={})
    for fqn, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        out_features, in_features = module.weight.shape
        if not any(fqn.startswith(container) for container in blocks):
            selection.kept[fqn] = "outside the transformer blocks"
        elif fqn.rpartition(".")[0] in routers:
            selection.kept[fqn] = "MoE gating"
        elif matched := [f for f in filter_fqns if f in fqn]:
            selection.kept[fqn] = f"filter_fqns {matched}"
        elif module.bias is not None:
            selection.kept[fqn] = "has a bias"
        elif in_features % multiple or out_features % multiple:
            selection.kept[fqn] = (f"{out_features}x{in_features} not a multiple of {BLOCK}"
                                   + (f" x TP {tp}" if tp > 1 else ""))
        else:
            selection.converted.append(fqn)
    return selection


def convert_to_blockwise(model: nn.Module, config: Float8Config, tp: int, emulated: bool
                         ) -> BlockwiseSelection:
    """Swap the selected linears in place (on meta) and log, in one line, what stayed."""
    selection = select_blockwise(model, config.filter_fqns, tp)
    make = EmulatedBlockwiseLinear.from_linear if emulated else _gpu_linear
    for fqn in selection.converted:
        parent, _, name = fqn.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, name, make(getattr(owner, name)))
    mode = "emulated" if emulated else "torchao Float8BlockwiseLinear"
    logger.info(f"float8 (blockwise 1x128/128x128 e4m3, {mode}): "
                f"{len(selection.converted)} linears converted")
    if not selection.converted:
        logger.warning("float8: no linear qualifies for blockwise float8, the model trains in "
                       "high precision")
    if selection.kept:
        logger.info("float8 blockwise: kept in high precision: " + "; ".join(
            f"{fqn} ({reason})" for fqn, reason in selection.kept.items()))
    if any(isinstance(m, GroupedExperts) for m in model.modules()):
        logger.info("float8 blockwise: the routed experts' grouped GEMMs are not converted "
                    "(no blockwise grouped-GEMM recipe; [float8] moe_grouped_mm is their switch)")
    return selection


# ---------------------------------------------------------------------------- start-up checks


def runs_emulated(config: Float8Config, device_type: str) -> bool:
    """The emulated path runs: on CPU always, elsewhere with ``emulate``."""
    return config.emulate or device_type != "cuda"


def gpu_unsupported_reason(gpu: str, capability: tuple[int, int]) -> str | None:
    """Why this GPU cannot run the blockwise recipe's kernels, or None (pure: tests pass any)."""
    if capability[0] == HOPPER:
        return None
    return (f"blockwise float8 runs torchao's Float8BlockwiseLinear, built for compute "
            f"capability 9.x (Hopper: H100, H200) and checked nowhere else, but {gpu} has "
            f"{capability[0]}.{capability[1]}")


def tokens_per_gemm(config: JobConfig, parallel_dims: ParallelDims) -> int:
    """Rows of the smallest activation a converted linear multiplies: a (pipeline) microbatch
    of one rank, whose sequence CP splits, and sequence-local TP regions split again."""
    t, p = config.training, config.parallelism
    sequences = p.pipeline_parallel_microbatch_size if parallel_dims.pp > 1 else t.local_batch_size
    return sequences * t.seq_len // (parallel_dims.cp * parallel_dims.tp)


def validate(config: JobConfig, parallel_dims: ParallelDims, device_type: str) -> None:
    """ConfigError for what the blockwise recipe cannot run (after ``float8.validate``)."""
    f8 = config.float8
    if not float8_enabled(config) or f8.recipe_name != "blockwise":
        return
    tokens = tokens_per_gemm(config, parallel_dims)
    if tokens % BLOCK:
        raise ConfigError(
            f'[float8] recipe_name = "blockwise" tiles the tokens of each microbatch in blocks '
            f"of {BLOCK} (the weight gradient's 128x1 scales), but a rank's GEMMs see {tokens} "
            f"(sequences x [training] seq_len / (CP x TP)); make it a multiple of {BLOCK}")
    if device_type == "cuda" and not f8.emulate:
        index = int(os.environ.get("LOCAL_RANK", 0))
        reason = ("torchao's blockwise kernels are CUDA (e4m3fn) kernels; this GPU runs ROCm"
                  if torch.version.hip else
                  gpu_unsupported_reason(torch.cuda.get_device_name(index),
                                         torch.cuda.get_device_capability(index)))
        if reason:
            raise ConfigError(f'[float8] recipe_name = "blockwise": {reason}; set [float8] '
                              "emulate = true to check its numerics (no speed-up)")
