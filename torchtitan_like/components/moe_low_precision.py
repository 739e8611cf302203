"""Low-precision grouped GEMMs for the routed experts, with torchao's MoE training prototype.

``[float8] moe_grouped_mm = "float8_rowwise" | "mxfp8"`` (the converter "moe_grouped_mm",
components/converters.py) wraps the stacked weights of every ``GroupedExperts`` module
(models/moe/experts.py: w1, w3 ``(E, hidden, dim)``, w2 ``(E, dim, hidden)``) in torchao's
training weight-wrapper tensor subclass, through the public ``torchao.quantization.quantize_``
with torchao's ``Float8TrainingOpConfig`` / ``MXFP8TrainingOpConfig`` and a filter that selects
the routed experts and nothing else. The wrapper intercepts
``torch._grouped_mm(x, w.transpose(-2, -1), offs=...)`` and runs torchao's autograd function:
both operands quantized on the fly, a scaled grouped GEMM, and the backward's two GEMMs (input
and weight gradient) the same way. Every other op sees the high-precision weight: the init,
the optimizer, EP's sharding (slices and copies keep the subclass), FSDP (the wrapper
all-gathers the high-precision shard cast to the mixed-precision dtype and re-wraps it),
checkpoints. Dense linears, the shared experts (plain ``nn.Linear``) included, are
``[float8] enable``'s (components/float8.py), independent of this switch; the router stays in
fp32 (gating runs in fp32 whatever the compute dtype).

Recipes and where they run:

- ``float8_rowwise``: e4m3, one power-of-two scale per token row of the activations and per
  output column of each expert's weight; the weight gradient scales per expert group.
  torch's float8 row-wise grouped GEMM (``torch._scaled_grouped_mm``) is built for Hopper only
  (torch's own gate, PLATFORM_SUPPORTS_FP8_GROUPED_GEMM: SM 9.x, not 10.x) and torchao casts
  with Triton kernels; torchao has no emulated variant. So: CUDA SM 9.0, refused elsewhere.
- ``mxfp8``: OCP microscaling, e4m3 elements with one e8m0 (power-of-two) scale per block of 32
  consecutive elements along each GEMM's reduction dim, rounded up (RCEIL: the block's amax
  lands in (224, 448], nothing saturates). torchao's kernels are SM 10.x (B200/GB200) CUDA
  kernels of its CUDA 12.8+ builds. With ``[float8] emulate = true`` torchao's EMULATED kernel
  preference runs instead on any device: ``to_mx`` in PyTorch, dequantized to bf16 (exactly:
  3 mantissa bits times a power of two), then ``torch._grouped_mm``: the same numbers as the
  real kernels up to the order of the fp32 sums, no speed-up.

Token groups are padded. Dropless routing gives an expert any number of tokens, but the
weight-gradient GEMM reduces over the tokens: MXFP8 quantizes them in blocks of 32 (``to_mx``
asserts the count divisible by 32), and float8's reads each group of tokens as its float8
reduction dim, which TorchTitan aligns to 16 rows (16 bytes). So ``GroupedExperts`` pads each
expert's rows with zero rows to a multiple of ``TOKEN_GROUP_MULTIPLE`` (its
``token_group_multiple``, set here): zero rows give zero outputs, add nothing to any gradient
and are dropped again (torchao's ``pad_token_groups_for_grouped_mm`` does the same for MXFP8
inside each GEMM, twice in its backward, and is not built for float8). No scale block then
straddles two experts: every scale is a function of one expert's weight, of one token row, or
of one expert's tokens in order, none of which depends on which rank holds the expert or the
token, so expert parallelism computes the numbers of one process
(tests/parallel/test_expert_parallel.py).

Output dtype. torch's scaled grouped GEMMs emit bf16 only ("Only bf16 high precision output
types are supported for grouped gemm"), so torchao's ``out_dtype`` is bf16 for both recipes,
emulation included (it reproduces the GPU's numbers rather than a more precise variant). The
SwiGLU between the GEMMs then runs in bf16 (silu and the product: one bf16 rounding each,
2^-9 relative), as under bf16 mixed precision, and ``GroupedExperts`` casts its output back to
its input's dtype. So with fp32 parameters and no mixed precision (``mixed_precision_param =
"float32"``) the routed experts compute in low precision and bf16 (the quantization, 2^-4
relative per operand element, dominates) while everything around them, the combine over the
top-k experts included, stays fp32; with bf16 mixed precision (FSDP's all-gather dtype or
autocast) nothing changes dtype. The switch never changes the parameters' dtype.

Checkpoints hold the high-precision weights as plain tensors (a state-dict hook unwraps them,
sharing their storage, so loading writes into the parameters): a checkpoint moves between jobs
with and without this switch, and reads without torchao's classes.

Not built: tensor parallelism inside the experts (TP > 1 on MoE models, ETP = TP) with this
switch; refused at start-up. Per-block compile leaves the routed experts eager
(distributed/compile.py), so torchao's eager kernels run under compile too.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.logging import logger
from torchtitan_like.models.moe.experts import GroupedExperts

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import Float8 as Float8Config
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import ParallelDims

FIELD = "[float8] moe_grouped_mm"

TOKEN_GROUP_MULTIPLE = {"float8_rowwise": 16, "mxfp8": 32}
"""Rows each expert's token group is padded to (module docstring)."""

DIM_MULTIPLE = {"float8_rowwise": 16, "mxfp8": 32}
"""What each recipe needs of the experts' dim and hidden size: torchao's float8 grouped GEMM
asserts both GEMM dims of each weight % 16 (the scaled GEMM's 16-byte rows); MXFP8 quantizes
1x32 blocks along the reduction dim, which is dim (w1, w3) or hidden (w2) in the forward and
the other one in the input gradient."""

GPU_NEEDED = {
    "float8_rowwise": "a CUDA GPU of compute capability 9.0 (Hopper: H100, H200; torch's "
                      "float8 row-wise grouped GEMM exists for no other), and torchao has no "
                      "emulated version",
    "mxfp8": "a CUDA GPU of compute capability 10.x (Blackwell: B200, GB200) and a CUDA 12.8+ "
             "torchao build with its MXFP8 kernels",
}
FALLBACK = {
    "float8_rowwise": 'use moe_grouped_mm = "mxfp8" with [float8] emulate = true to check '
                      'low-precision expert numerics here, or "none"',
    "mxfp8": 'set [float8] emulate = true for torchao\'s emulated MXFP8 (any device, numerics '
             'only, no speed-up), or moe_grouped_mm = "none"',
}


def device_unsupported_reason(recipe: str, emulate: bool, device_type: str, gpu: str = "",
                              capability: tuple[int, int] = (0, 0),
                              mxfp8_kernels: bool = False) -> str | None:
    """Why ``recipe`` cannot run on this device, or None if it can (pure: tests pass any GPU).
    ``mxfp8_kernels``: torchao's SM 10.x MXFP8 kernels are importable."""
    if recipe == "mxfp8" and emulate:
        return None
    if recipe == "float8_rowwise" and emulate:
        return (f"{FIELD} = \"float8_rowwise\" with [float8] emulate = true: torchao has no "
                "emulated float8 row-wise grouped GEMM")
    if device_type != "cuda" or torch.version.hip:
        where = "ROCm" if device_type == "cuda" else device_type
        return f"{FIELD} = \"{recipe}\" needs {GPU_NEEDED[recipe]}; this job runs on {where}"
    major = capability[0]
    if (recipe == "float8_rowwise" and major == 9) or (
            recipe == "mxfp8" and major == 10 and mxfp8_kernels):
        return None
    found = f"{gpu} has compute capability {capability[0]}.{capability[1]}"
    if recipe == "mxfp8" and major == 10:
        found = "this torchao build lacks its MXFP8 CUDA kernels"
    return f"{FIELD} = \"{recipe}\" needs {GPU_NEEDED[recipe]}, but {found}"


def check_device(config: Float8Config, device_type: str) -> None:
    """ConfigError when the recipe cannot run on this job's device (module docstring)."""
    recipe, gpu, capability, kernels = config.moe_grouped_mm, "", (0, 0), False
    if device_type == "cuda" and not torch.version.hip and not config.emulate:
        index = int(os.environ.get("LOCAL_RANK", 0))
        gpu, capability = torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index)
        if recipe == "mxfp8":
            from torchao.prototype.moe_training.mxfp8_grouped_mm import _SM100_KERNELS_AVAILABLE

            kernels = _SM100_KERNELS_AVAILABLE
    reason = device_unsupported_reason(recipe, config.emulate, device_type, gpu, capability,
                                       kernels)
    if reason:
        raise ConfigError(f"{reason}; {FALLBACK[recipe]}")


def check_experts(recipe: str, experts: list[GroupedExperts], tp: int, model: str) -> None:
    """ConfigError unless the model has routed experts computed by grouped GEMM whose dims the
    recipe can quantize, outside tensor parallelism."""
    if not experts:
        raise ConfigError(f"{FIELD} = \"{recipe}\": {model} has no routed experts "
                          "(GroupedExperts modules); set it to \"none\" (dense linears are "
                          "[float8] enable's)")
    if not all(e.use_grouped_mm for e in experts):
        raise ConfigError(f"{FIELD} = \"{recipe}\": {model} computes its experts with the "
                          "per-expert loop (use_grouped_mm = False), which the low-precision "
                          "grouped GEMM does not replace; use a grouped-GEMM flavor or \"none\"")
    if tp > 1:
        raise ConfigError(f"{FIELD} = \"{recipe}\" with [parallelism] tensor_parallel_degree = "
                          f"{tp} is not supported (experts split by hidden features inside a "
                          "local TP region: not built); set one of them off")
    multiple = DIM_MULTIPLE[recipe]
    for hidden, dim in sorted({tuple(e.w1.shape[1:]) for e in experts}):
        if hidden % multiple or dim % multiple:
            raise ConfigError(
                f"{FIELD} = \"{recipe}\" needs the routed experts' dim and hidden size to be "
                f"multiples of {multiple} ({_why(recipe)}); {model} "
                f"has dim {dim} and expert hidden size {hidden}")


def _why(recipe: str) -> str:
    return ("float8 scaled GEMMs take rows of 16-byte multiples" if recipe == "float8_rowwise"
            else "MXFP8 scales blocks of 32 along the forward's and the input gradient's "
                 "reduction dims")


def validate(config: JobConfig, device_type: str, parallel_dims: ParallelDims,
             build_model: Callable[[], nn.Module]) -> None:
    """Every start-up check of the switch; ``build_model`` builds the job's model (called on
    meta, only when the switch is on) so the checks read the experts' real shapes."""
    recipe = config.float8.moe_grouped_mm
    if recipe == "none":
        return
    check_device(config.float8, device_type)
    with torch.device("meta"):
        model = build_model()
    experts = [m for m in model.modules() if isinstance(m, GroupedExperts)]
    check_experts(recipe, experts, parallel_dims.tp,
                  f"[model] {config.model.name} flavor {config.model.flavor}")


def torchao_config(recipe: str, emulate: bool):
    """torchao's op config for ``recipe``: bf16 output (module docstring); mxfp8 with RCEIL
    scales, through the emulated kernels when ``emulate``; groups come padded."""
    from torchao.prototype.moe_training.config import (
        Float8TrainingOpConfig,
        MXFP8TrainingOpConfig,
        MXFP8TrainingRecipe,
    )

    if recipe == "float8_rowwise":
        return Float8TrainingOpConfig(out_dtype=torch.bfloat16)
    mx = (MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL if emulate
          else MXFP8TrainingRecipe.MXFP8_RCEIL)
    return dataclasses.replace(MXFP8TrainingOpConfig.from_recipe(mx), out_dtype=torch.bfloat16,
                               pad_token_groups_for_grouped_mm=False)


class MoEGroupedMMConverter:
    """Model converter (components/converters.py): low-precision routed-expert GEMMs."""

    def __init__(self, config: Float8Config):
        self.recipe, self.emulate = config.moe_grouped_mm, config.emulate
        self.torchao_config = torchao_config(self.recipe, self.emulate)

    def convert(self, model: nn.Module) -> None:
        """Wrap every ``GroupedExperts``'s weights in torchao's weight wrapper (on meta) and
        have it pad its token groups."""
        from torchao.quantization import quantize_

        experts = [m for m in model.modules() if isinstance(m, GroupedExperts)]
        for module in experts:
            module.token_group_multiple = TOKEN_GROUP_MULTIPLE[self.recipe]
            module.register_state_dict_post_hook(_save_plain_weights)
        quantize_(model, self.torchao_config,
                  filter_fn=lambda module, _fqn: isinstance(module, GroupedExperts))
        mode = "emulated" if self.emulate else "torchao kernels"
        logger.info(f"moe_grouped_mm ({self.recipe}, {mode}, bf16 GEMM outputs): the weights "
                    f"of {len(experts)} routed-expert modules wrapped")

    def post_optimizer_step(self, model: nn.Module) -> None:
        """Nothing: the scales are dynamic, computed from the current weights in each GEMM."""


def unwrapped(t: torch.Tensor) -> torch.Tensor:
    """The high-precision tensor inside torchao's weight wrapper, sharing its storage (also
    as the local tensor of a DTensor); any other tensor as it is."""
    from torchao.prototype.moe_training.tensor import TrainingWeightWrapperBaseTensor

    if isinstance(t, DTensor) and isinstance(t.to_local(), TrainingWeightWrapperBaseTensor):
        return DTensor.from_local(t.to_local()._data, t.device_mesh, t.placements,
                                  run_check=False, shape=t.shape, stride=t.stride())
    return t._data if isinstance(t, TrainingWeightWrapperBaseTensor) else t


def _save_plain_weights(module: nn.Module, state_dict: dict, prefix: str, _metadata) -> None:
    """State-dict post-hook of a converted ``GroupedExperts``: plain weights (module docstring)."""
    for name, _ in module.named_parameters(recurse=False):
        state_dict[prefix + name] = unwrapped(state_dict[prefix + name])
