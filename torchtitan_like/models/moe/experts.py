"""Routed experts as stacked SwiGLU weights, computed over tokens already sorted by expert.

``GroupedExperts.forward(x, num_tokens_per_expert)`` is the seam expert parallelism wraps: it
shards the expert dimension of the weights and exchanges ``x`` (all-to-all) in front of this
forward, so routing, sorting and combining stay outside, in the MoE layer (moe.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor


class GroupedExperts(nn.Module):
    """``num_experts`` SwiGLUs stored as w1, w3: (E, hidden, dim) and w2: (E, dim, hidden)."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int, use_grouped_mm: bool = True):
        super().__init__()
        if use_grouped_mm and (dim % 8 or hidden_dim % 8):
            raise ValueError(f"grouped GEMM needs dim ({dim}) and the expert hidden size "
                             f"({hidden_dim}) to be multiples of 8 (16-byte aligned rows in "
                             "bf16); change them or set use_grouped_mm = False")
        self.num_experts = num_experts
        self.use_grouped_mm = use_grouped_mm
        # Each expert's rows are padded with zero rows to a multiple of this before the grouped
        # GEMMs (low-precision ones need it: components/moe_low_precision.py).
        self.token_group_multiple = 1
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        """x (tokens, dim), rows grouped by expert in expert order; num_tokens_per_expert
        (local experts,) integer counts summing to ``tokens``. Returns (tokens, dim)."""
        # Under expert parallelism the weights are DTensors sharded over experts; the local
        # shard holds exactly the experts whose tokens ``x`` carries.
        w1, w2, w3 = (w.to_local() if isinstance(w, DTensor) else w
                      for w in (self.w1, self.w2, self.w3))
        if not self.use_grouped_mm:
            return _looped_swiglu(x, num_tokens_per_expert, w1, w2, w3)
        if self.token_group_multiple == 1:
            return _grouped_swiglu(x, num_tokens_per_expert, w1, w2, w3)
        rows, padded_counts, total = _padded_rows(num_tokens_per_expert,
                                                  self.token_group_multiple, x.shape[0])
        padded = x.new_zeros(total, x.shape[1]).index_copy(0, rows, x)
        return _grouped_swiglu(padded, padded_counts, w1, w2, w3)[rows]

    def init_weights(self, init_std: float) -> None:
        nn.init.trunc_normal_(self.w1, mean=0.0, std=0.02)
        for w in (self.w2, self.w3):
            nn.init.trunc_normal_(w, mean=0.0, std=init_std)


def _grouped_swiglu(x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor,
                    w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """Three grouped GEMMs; group g is rows offs[g-1]:offs[g] (offs = cumsum of counts), an
    empty group contributes nothing and gets a zero gradient."""
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    x = x.to(w1.dtype)
    h = F.silu(torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs))
    h = h * torch._grouped_mm(x, w3.transpose(-2, -1), offs=offs)
    return torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs).type_as(x)


def _padded_rows(counts: torch.Tensor, multiple: int, tokens: int
                 ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Where each of the ``tokens`` rows goes when every expert's group is followed by zero rows
    up to a multiple of ``multiple`` rows, the padded counts, and their total. Zero rows give
    zero outputs and add nothing to the weight gradients.

    The total is fixed by ``tokens`` alone, ``tokens + E (multiple - 1)`` rounded up to a
    multiple (the most the padding can take), the last expert taking the rows left over: the
    padded GEMMs then have one shape every step. torchao's float8 grouped-GEMM kernels key their
    Triton autotuning on the total token count (the per-group column scales of the weight
    gradient), so a total that moved with the routing re-ran their autotuning (dozens of
    configurations) at nearly every step and layer. The extra rows are whole blocks of zeros
    after the last group's own padding: no scale block changes, so neither does any number.
    Nothing here reads a count on the host."""
    padded = (counts + multiple - 1) // multiple * multiple
    total = -(-(tokens + counts.numel() * (multiple - 1)) // multiple) * multiple
    padded[-1] += total - padded.sum()
    padding_before = torch.cumsum(padded - counts, 0) - (padded - counts)
    rows = torch.arange(tokens, device=counts.device)
    return rows + torch.repeat_interleave(padding_before, counts, output_size=tokens), padded, total


def _looped_swiglu(x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor,
                   w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """The reference: one SwiGLU per expert over its slice of rows."""
    outputs = []
    for e, rows in enumerate(torch.split(x, counts.tolist(), dim=0)):
        h = F.silu(rows @ w1[e].transpose(0, 1)) * (rows @ w3[e].transpose(0, 1))
        outputs.append(h @ w2[e].transpose(0, 1))
    return torch.cat(outputs, dim=0)
