"""Which tensor-parallel styles a module's linears take once Float8 has converted them
(components/float8.py converts; the TP plan, distributed/plan_toolkit.py, asks here)."""

from __future__ import annotations

from typing import NamedTuple

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel


class TPStyles(NamedTuple):
    """The tensor-parallel style classes for the linears of one module."""

    colwise: type[ColwiseParallel]
    rowwise: type[RowwiseParallel]
    prepare_input: type[PrepareModuleInput]


def tp_styles(module: nn.Module, device_type: str) -> TPStyles:
    """TP styles for ``module`` (e.g. a block's attention or feed-forward), after conversion.

    When every linear inside ``module`` is a tensorwise float8 linear and the TP mesh is on
    CUDA, torchao's float8 styles: the sequence-parallel input is cast to float8 *before* TP's
    all-gather (half the bytes) and the output gradient before its reduce-scatter. Otherwise
    the plain styles, and converted linears run float8 on their local shards: with no float8,
    a row-wise recipe, a linear kept in high precision, or on CPU, where gloo cannot move
    float8 tensors ("Invalid scalar type"). Use ``prepare_input`` on the module and
    ``colwise`` / ``rowwise`` on its linears, with the usual arguments.
    """
    from torchao.float8.config import ScalingGranularity, ScalingType
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    def tensorwise_dynamic(linear: nn.Module) -> bool:
        if not isinstance(linear, Float8Linear):
            return False
        c = linear.config
        casts = (c.cast_config_input, c.cast_config_weight, c.cast_config_grad_output)
        return all(cast.scaling_type is ScalingType.DYNAMIC
                   and cast.scaling_granularity is ScalingGranularity.TENSORWISE
                   for cast in casts)

    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    if device_type == "cuda" and linears and all(tensorwise_dynamic(m) for m in linears):
        return TPStyles(Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput)
    return TPStyles(ColwiseParallel, RowwiseParallel, PrepareModuleInput)
