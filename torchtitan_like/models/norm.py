"""RMSNorm on torch's fused kernel under every dtype mix the trainer produces.

torch's ``rms_norm`` runs its fused kernel (``_fused_rms_norm``: one pass on CUDA) only when the
weight has the input's dtype; otherwise it warns "Mismatch dtype between input and weight ...
Cannot dispatch to fused implementation" (once per process) and runs the composite of five ops
in fp32 (aten/src/ATen/native/layer_norm.cpp, ``rms_norm_symint``). Under 1-GPU mixed precision
(bf16 autocast, fp32 parameters) every norm whose input comes out of a linear (Qwen3's per-head
q/k norms, MLA's q/kv low-rank norms) gets a bf16 input and an fp32 weight: the slow path on
every step.

``RMSNorm`` casts the weight to the input's dtype when they differ. For a 16-bit input that
rounds the weight to bf16 as FSDP's bf16 all-gather does (so 1-GPU autocast now computes what
the sharded bf16 layout computes); the kernel still normalises in fp32 and rounds the output to
the input's dtype, as the composite did. The cast's backward returns the weight's gradient in
fp32. With matching dtypes (fp32 everywhere: every parity test) the call is
``nn.RMSNorm.forward``'s own ``F.rms_norm(x, shape, weight, eps)``, bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` whose weight follows the input's dtype (module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight is not None and weight.dtype != x.dtype:
            weight = weight.to(x.dtype)
        return F.rms_norm(x, self.normalized_shape, weight, self.eps)
