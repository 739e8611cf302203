"""RMSNorm on torch's fused path (models/norm.py) in every model family under bf16 autocast.

torch dispatches ``rms_norm`` to its fused kernel exactly when the weight's dtype is the input's
(aten/src/ATen/native/layer_norm.cpp); otherwise it warns once per process and runs the
composite. The CPU build has no fused kernel to observe (its ``_fused_rms_norm`` is the
composite), and the warning fires once per process, so the check is torch's own condition,
recorded at every ``rms_norm`` call by a function mode (the fake): it fails on ``nn.RMSNorm``,
which these models used, and passes on ours. fp32 numerics are unchanged bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from torchtitan_like.models.norm import RMSNorm
from torchtitan_like.models.registry import get_model_spec


class RecordRMSNorm(TorchFunctionMode):
    """Every rms_norm call's (input dtype, weight dtype)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[torch.dtype, torch.dtype | None]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (F.rms_norm, torch.rms_norm):
            weight = args[2] if len(args) > 2 else kwargs.get("weight")
            self.calls.append((args[0].dtype, None if weight is None else weight.dtype))
        return func(*args, **kwargs)


def slow_path_calls(module: nn.Module, *inputs) -> tuple[int, int]:
    """(calls torch would send to the composite, calls) of a bf16-autocast forward."""
    with RecordRMSNorm() as record, torch.autocast("cpu", dtype=torch.bfloat16):
        module(*inputs)
    slow = sum(w is not None and w != x for x, w in record.calls)
    return slow, len(record.calls)


def test_the_recorder_sees_the_slow_path_of_a_plain_torch_norm():
    slow, calls = slow_path_calls(nn.RMSNorm(16), torch.randn(2, 16, dtype=torch.bfloat16))
    assert (slow, calls) == (1, 1)


@pytest.mark.parametrize("name", ["llama3", "qwen3", "deepseek_v3"])
def test_every_norm_of_every_family_takes_the_fused_path_under_autocast(name):
    spec = get_model_spec(name)
    torch.manual_seed(0)
    model = spec.model_cls(spec.flavors["debugmodel"])
    model.init_weights()
    tokens = torch.randint(0, 64, (1, 32))
    slow, calls = slow_path_calls(model, tokens)
    assert calls > 0 and slow == 0, f"{name}: {slow} of {calls} rms_norm calls mismatched"


def test_bf16_inputs_were_the_slow_case_and_fp32_is_bit_for_bit_unchanged():
    torch.manual_seed(0)
    ours, theirs = RMSNorm(64, eps=1e-5), nn.RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        theirs.weight.copy_(ours.weight)
    x = torch.randn(4, 64)
    assert torch.equal(ours(x), theirs(x))
    x16 = x.bfloat16()
    assert slow_path_calls(theirs, x16)[0] == 1 and slow_path_calls(ours, x16)[0] == 0
    out = ours(x16)
    assert out.dtype == torch.bfloat16
    # y = x_hat w exactly; ours rounds w to bf16 (relative u = 2^-8) and the product, the
    # composite only the product: |ours - y| <= |y| (u + u (1 + u)), |theirs - y| <= u |y|,
    # and |y| <= |theirs| / (1 - u).
    u = 2**-8
    reference = theirs(x16).float()
    bound = (3 * u + u * u) * reference.abs() / (1 - u)
    assert ((out.float() - reference).abs() <= bound).all()
