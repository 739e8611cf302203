"""models/attention.py: fp32 inputs take SDPA unchanged; 16-bit inputs on a CPU are computed in
fp32 (also under CPU autocast, which would otherwise cast them back) and rounded once."""

import torch
import torch.nn.functional as F

from torchtitan_like.models.attention import sdpa


def _qkv(dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, 32, 16, generator=generator).to(dtype) for _ in range(3)]


def test_fp32_is_plain_causal_sdpa_bit_for_bit():
    q, k, v = _qkv(torch.float32)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    assert torch.equal(sdpa(q, k, v, is_causal=True, scale=0.3), expected)


def test_bf16_on_cpu_is_the_fp32_result_rounded_once_even_under_autocast():
    q, k, v = _qkv(torch.bfloat16)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sdpa(q, k, v, is_causal=True)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected.to(torch.bfloat16))
