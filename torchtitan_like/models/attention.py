"""Scaled-dot-product attention with the kernel choice that is fastest on each device (the
causal and the dense-mask calls of models/attention_masks.py both come here).

On a GPU this is ``F.scaled_dot_product_attention`` unchanged. On a CPU,
16-bit queries, keys and values are computed in fp32 and the output cast back: torch's CPU
flash-attention kernel is 1.9x (head dim 16) to 1.4x (head dim 64) faster in fp32 than in
bf16, forward + backward (docs/performance.md, "Attention on a CPU"). The cast is not an
approximation: bf16 values are exact in fp32, and the bf16 kernel already accumulates in fp32
but rounds the softmax probabilities to bf16 before multiplying them with the values; the fp32
kernel skips that rounding, so its output is at least as accurate and differs from the bf16
kernel's by about one bf16 rounding of the output. CPU autocast is switched off around the
call (it would cast the inputs back to bf16). fp32 inputs take the same kernel as before, bit
for bit (every parity test runs in fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_SIXTEEN_BIT = (torch.bfloat16, torch.float16)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
         attn_mask: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """SDPA of (bs, heads, seq, head_dim) tensors; fp32 compute for 16-bit on a CPU."""
    if q.device.type == "cpu" and q.dtype in _SIXTEEN_BIT:
        with torch.autocast("cpu", enabled=False):  # CPU autocast would cast back to 16-bit
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                 attn_mask=attn_mask, is_causal=is_causal,
                                                 scale=scale)
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                          scale=scale)
