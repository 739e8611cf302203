"""Float8 training of the transformer blocks' linears, with torchao.

A converted linear computes ``y = x W^T`` as

    y = (s_x x)_fp8 (s_W W)_fp8^T / (s_x s_W),    s_t = fp8_max / amax(|t|)

i.e. each operand is scaled into float8's range, rounded to float8, multiplied by
``torch._scaled_mm`` with fp32 accumulation, and un-scaled; the backward's two matmuls do the
same with the output gradient (Micikevicius et al., "FP8 Formats for Deep Learning", 2022).
The scales are dynamic (from the current tensor) and come per tensor (``tensorwise``, the
fastest), per row (``rowwise``, more accurate, e4m3 throughout, power-of-two scales), or per
row with the weight-gradient matmul kept in high precision (``rowwise_with_gw_hp``), or per
1x128 activation tile and 128x128 weight block (``blockwise``, DeepSeek-V3's recipe: its own
module, components/blockwise_fp8.py, whose scope and checks differ from the below). The
master weights, the optimizer and everything outside the converted matmuls stay as they were.

Scope. Only linears inside the model's blocks (the ``nn.ModuleList``/``nn.ModuleDict``
children of the root, ``layers`` in Llama) are converted: the output head, the embeddings and
the norms keep full precision, as in DeepSeek-V3's recipe, because the loss is most sensitive
to them and they carry a small share of the FLOPs. Also kept: linears whose name contains an
entry of ``filter_fqns``, and linears whose *local* dimensions are not multiples of 16 (what
``_scaled_mm`` accepts); each skip is logged. Under TP of degree t a linear's local weight is
(out/t, in) column-wise or (out, in/t) row-wise; which one is the model's plan's choice, so both
dimensions must be multiples of 16 t (uneven shards are refused along with it).

Row-wise recipes. torch's per-row ``_scaled_mm`` kernels exist for SM 8.9 (CUTLASS), 9.0 and
10.x; elsewhere they fail at the first matmul (e.g. cuBLASLt's NOT_SUPPORTED on SM 12.0,
pytorch/pytorch#192707), so they are refused at start-up. With compile, inductor's fused casts
must round like eager (``torch._inductor.config.emulate_precision_casts``, as TorchTitan sets
for row-wise float8), or the compiled and recomputed (AC) casts differ from eager's.

FSDP. With ``enable_fsdp_float8_all_gather`` each rank casts its weight shard to float8
*before* the all-gather, halving its bytes against bf16; the one scale of the whole weight
needs amax over all shards, which ``precompute_float8_dynamic_scale_for_fsdp`` computes for
every weight in a single all-reduce right after the optimizer step (``post_optimizer_step``)
instead of one small all-reduce per weight in the next forward.

Hardware. Float8 matmuls need CUDA compute capability 8.9 or newer (Ada, Hopper, Blackwell);
``emulate = true`` replaces them by high-precision matmuls of the float8-rounded operands and
runs anywhere, for numerics tests. On a CPU both modes run: torch's CPU ``_scaled_mm`` takes
real float8 operands, at the speed of emulation with per-row scales (neither is faster than
bf16); with one scale per tensor it is oneDNN's reference kernel, ~700x slower, which the
row-wise recipes avoid here (``cpu_row_wise_gradient_gemms``) and the tensorwise recipe
cannot (use ``emulate = true`` on a CPU).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

import torch
from torch import nn

from torchtitan_like.components import blockwise_fp8
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Float8 as Float8Config
from torchtitan_like.logging import logger

if TYPE_CHECKING:
    from torchtitan_like.distributed.parallel_dims import ParallelDims

MIN_CUDA_CAPABILITY = (8, 9)
"""Float8 tensor cores: Ada (8.9), Hopper (9.0) and newer."""

FP8_DIM_MULTIPLE = 16
"""``torch._scaled_mm`` needs both dimensions of the weight to be multiples of this."""

ROWWISE_CAPABILITIES = ((8, 9), (9, 0), (10, 0), (10, 3))
"""CUDA capabilities with per-row ``_scaled_mm`` kernels (Ada, Hopper, datacenter Blackwell)."""


def rowwise_unsupported_reason(capability: tuple[int, int]) -> str | None:
    """Why this GPU cannot run the row-wise float8 recipes, or None if it can."""
    if tuple(capability) in ROWWISE_CAPABILITIES:
        return None
    have = ", ".join(f"{a}.{b}" for a, b in ROWWISE_CAPABILITIES)
    return (f"row-wise float8 needs per-row _scaled_mm kernels, which exist for compute "
            f"capability {have}, not {capability[0]}.{capability[1]}")


def validate(config: Float8Config, enabled: bool, device_type: str) -> None:
    """Refuse flag combinations torchao cannot run, and GPUs without float8 matmuls, when float8
    is ``enabled`` (config/derived.py, ``float8_enabled``)."""
    if not enabled:
        return
    if config.enable_fsdp_float8_all_gather and config.recipe_name != "tensorwise":
        raise ConfigError(
            f'[float8] enable_fsdp_float8_all_gather needs recipe_name = "tensorwise", not '
            f'"{config.recipe_name}": torchao casts each weight shard with one scale for the '
            "whole weight before the all-gather, which row-wise scales do not allow. Set "
            "enable_fsdp_float8_all_gather = false or use the tensorwise recipe"
        )
    if device_type == "cuda" and not torch.version.hip:  # ROCm: _scaled_mm checks the GPU itself
        index = int(os.environ.get("LOCAL_RANK", 0))
        check_cuda_capability(
            config, torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index)
        )


def check_cuda_capability(config: Float8Config, gpu: str, capability: tuple[int, int]) -> None:
    """ConfigError when real float8 matmuls (float8 on) are asked of a GPU older than SM 8.9."""
    if not config.emulate and tuple(capability) < MIN_CUDA_CAPABILITY:
        need = ".".join(map(str, MIN_CUDA_CAPABILITY))
        raise ConfigError(
            f"[float8] enable: float8 matmuls need CUDA compute capability >= {need} (Ada, "
            f"Hopper or newer), but this GPU, {gpu}, has {capability[0]}.{capability[1]}. "
            "Set [float8] emulate = true to check float8 numerics here (no speed-up), or "
            "[float8] enable = false"
        )
    if not config.emulate and config.recipe_name.startswith("rowwise") and (
            reason := rowwise_unsupported_reason(capability)):
        raise ConfigError(f'[float8] recipe_name = "{config.recipe_name}": {reason} ({gpu}); '
                          'use recipe_name = "tensorwise" or emulate = true')


@dataclasses.dataclass
class Float8Selection:
    """Which linears of a model get float8, and why the others do not."""

    converted: list[str]
    skipped: dict[str, str]  # fqn -> reason


def select_linears(model: nn.Module, filter_fqns: list[str], tp: int = 1) -> Float8Selection:
    """Split the model's ``nn.Linear`` modules into those to convert and the skipped ones
    (``tp``: the tensor-parallel degree the local shapes are checked under)."""
    multiple = FP8_DIM_MULTIPLE * tp
    block_containers = {
        name for name, child in model.named_children()
        if isinstance(child, (nn.ModuleList, nn.ModuleDict))
    }
    selection = Float8Selection(converted=[], skipped={})
    for fqn, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        out_features, in_features = module.weight.shape
        if fqn.split(".")[0] not in block_containers:
            selection.skipped[fqn] = "outside the transformer blocks"
        elif matched := [f for f in filter_fqns if f in fqn]:
            selection.skipped[fqn] = f"filter_fqns {matched}"
        elif in_features % multiple or out_features % multiple:
            selection.skipped[fqn] = (
                f"shape {out_features}x{in_features} is not a multiple of {FP8_DIM_MULTIPLE}"
                + (f" x TP {tp} (its local shard must be a multiple of {FP8_DIM_MULTIPLE})"
                   if tp > 1 else ""))
        else:
            selection.converted.append(fqn)
    return selection


def cpu_row_wise_gradient_gemms(config: Float8Config, device_type: str) -> dict:
    """On a CPU, torch's per-row ``_scaled_mm`` for the row-wise recipes' gradient GEMMs too.

    torchao runs a row-wise GEMM without fast accumulation (its gradient GEMMs) as a
    per-tensor ``_scaled_mm`` with unit scales, then multiplies by the row scales: on CUDA
    because the per-row CUTLASS kernel is slow without fast accumulation. On a CPU the
    per-tensor float8 GEMM is oneDNN's reference kernel (``ref:any``, 0.06 GFLOP/s on a
    2-core Xeon; the per-row one 47), so a row-wise step took 16 s instead of 0.3. Asking
    for fast accumulation routes these GEMMs to the per-row kernel, which ignores the flag on
    a CPU (measured bitwise equal either way); the numbers stay those of the post-scaled
    product up to the order of the fp32 sums, because the row-wise scales are powers of two
    (multiplying a bf16 value by one is exact)."""
    if device_type != "cpu" or not config.recipe_name.startswith("rowwise"):
        return {}
    from torchao.float8.config import Float8GemmConfig

    fast = Float8GemmConfig(use_fast_accum=True)
    return {"gemm_config_grad_input": fast, "gemm_config_grad_weight": fast}


class Float8Converter:
    """Model converter (components/converters.py): float8 linears, FSDP scale precompute."""

    def __init__(self, config: Float8Config, parallel_dims: ParallelDims, device_type: str,
                 compile_enabled: bool):
        from torchao.float8 import Float8LinearConfig

        fsdp = parallel_dims.fsdp_enabled  # without: the all-gather is a setting without effect
        if device_type == "cuda" and not compile_enabled and not config.emulate:
            logger.warning("[float8] without [compile] enable the float8 casts run unfused and "
                           "float8 is usually slower than bf16; enable torch.compile")
        if compile_enabled and config.recipe_name != "tensorwise":
            import torch._inductor.config

            torch._inductor.config.emulate_precision_casts = True  # see the module docstring
        self.config = config
        self.tp = parallel_dims.tp
        self.all_gather = config.enable_fsdp_float8_all_gather and fsdp
        self.precompute = config.precompute_float8_dynamic_scale_for_fsdp and self.all_gather
        self.blockwise_emulated = blockwise_fp8.runs_emulated(config, device_type)
        self.torchao_config = None if config.recipe_name == "blockwise" else dataclasses.replace(
            Float8LinearConfig.from_recipe_name(config.recipe_name),
            emulate=config.emulate,
            enable_fsdp_float8_all_gather=self.all_gather,
            **cpu_row_wise_gradient_gemms(config, device_type),
        )

    def convert(self, model: nn.Module) -> None:
        """Swap the selected ``nn.Linear`` for torchao ``Float8Linear`` in place (on meta), or
        for blockwise float8 linears (components/blockwise_fp8.py)."""
        from torchao.float8 import convert_to_float8_training

        if self.torchao_config is None:
            blockwise_fp8.convert_to_blockwise(model, self.config, self.tp,
                                               self.blockwise_emulated)
            return
        selection = select_linears(model, self.config.filter_fqns, self.tp)
        chosen = set(selection.converted)
        convert_to_float8_training(model, config=self.torchao_config,
                                   module_filter_fn=lambda _module, fqn: fqn in chosen)
        mode = "emulated" if self.config.emulate else "torch._scaled_mm"
        logger.info(
            f"float8 ({self.config.recipe_name}, {mode}, FSDP float8 all-gather "
            f"{'on' if self.all_gather else 'off'}): {len(chosen)} linears converted"
        )
        if not chosen:
            logger.warning("float8: no linear qualifies, the model trains in high precision")
        for fqn, reason in selection.skipped.items():
            logger.info(f"float8: kept {fqn} in high precision ({reason})")

    def post_optimizer_step(self, model: nn.Module) -> None:
        """Recompute the float8 all-gather scales of the updated weights in one all-reduce."""
        if self.precompute:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            precompute_float8_dynamic_scale_for_fsdp(model)
