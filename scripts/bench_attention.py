"""Causal attention forward + backward on this CPU: the bf16 kernel against bf16 computed in fp32.

    python scripts/bench_attention.py [--threads 1] [--repeats 5] [--shape B,S,H,D ...]

For each (batch, seq, heads, head_dim) shape, times ``F.scaled_dot_product_attention`` with
bf16 queries, keys and values (torch's CPU flash kernel in bf16) and ``models.attention.sdpa`` of
models/attention.py (the same inputs computed in fp32, the output cast back to bf16), both
forward and backward, alternating the two ``--repeats`` times; prints the fastest of each
(a busy machine only slows a run down), their ratio, the largest differences of output and
input gradients, and the 1-minute load average. Defaults: the debug model per rank of the
throughput job (4 x 512 tokens, 16 heads of 16) and the 100M flavor (1 x 1024, 12 heads of 64).
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import torch
import torch.nn.functional as F

from torchtitan_like.models.attention import sdpa


def forward_backward(attention, inputs: list[torch.Tensor], grad: torch.Tensor):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = attention(*(x.transpose(1, 2) for x in leaves))  # (bs, seq, heads, dim) as the model
    out.backward(grad)
    return out.detach(), [x.grad for x in leaves]


def bf16_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def measure(shape: tuple[int, ...], repeats: int) -> None:
    batch, seq, heads, head_dim = shape
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(batch, seq, heads, head_dim, generator=generator).bfloat16()
              for _ in range(3)]
    grad = torch.randn(batch, heads, seq, head_dim, generator=generator).bfloat16()
    variants = {"bf16 kernel": bf16_kernel,
                "fp32 compute": functools.partial(sdpa, is_causal=True)}
    results = {name: forward_backward(fn, inputs, grad) for name, fn in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            forward_backward(fn, inputs, grad)
            times[name].append(time.perf_counter() - start)
    (out_a, grads_a), (out_b, grads_b) = results.values()
    grad_diff = max((a.float() - b.float()).abs().max() for a, b in zip(grads_a, grads_b,
                                                                           strict=True))
    best = {name: min(t) for name, t in times.items()}
    print(f"| {batch}x{seq}, {heads} heads of {head_dim} | {1e3 * best['bf16 kernel']:.0f} | "
          f"{1e3 * best['fp32 compute']:.0f} | {best['bf16 kernel'] / best['fp32 compute']:.2f} | "
          f"{(out_a.float() - out_b.float()).abs().max():.3g} | "
          f"{grad_diff:.3g} | "
          f"{os.getloadavg()[0]:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each variant")
    parser.add_argument("--shape", action="append", metavar="B,S,H,D",
                        help="batch, seq, heads, head_dim (repeatable)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [tuple(int(n) for n in s.split(",")) for s in args.shape or
              ["4,512,16,16", "1,1024,12,64"]]
    print(f"forward + backward, fastest of {args.repeats}, {args.threads} thread(s), "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}\n")
    print("| shape | bf16 kernel ms | fp32 compute ms | speed-up | max abs diff out | "
          "max abs diff grads | load |")
    print("|---|---|---|---|---|---|---|")
    for shape in shapes:
        measure(shape, args.repeats)


if __name__ == "__main__":
    main()
