"""torchrun entry of test_expert_parallel_style.py: ExpertParallel on GroupedExperts.

Every rank also builds the one-process reference (the same seed gives the same full weights)
and runs it on the tokens of all ranks, in the order expert parallelism hands them to each
expert (by expert, then by source rank), so every expert multiplies the same rows in the
same order; only kernel blocking and FSDP's sum order differ (see ``close``). Prints one
``CHECK name ok`` line per passed check on rank 0; raises on the first mismatch.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from torchtitan_like.distributed.expert_layout import expert_fsdp_mesh
from torchtitan_like.distributed.expert_parallel import apply_expert_fsdp, apply_expert_parallel
from torchtitan_like.distributed.fsdp import apply_fsdp
from torchtitan_like.distributed.lifecycle import exit_process
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.utils import clip_grad_norm_
from torchtitan_like.models.moe import GroupedExperts

EXPERTS, DIM, HIDDEN = 4, 8, 16


class ToyMoE(nn.Module):
    """A dense projection (FSDP-sharded) feeding the experts: two meshes in one model."""

    def __init__(self, use_grouped_mm: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(DIM, DIM)
        self.experts = GroupedExperts(DIM, HIDDEN, EXPERTS, use_grouped_mm)
        self.experts.init_weights(init_std=0.5)

    def forward(self, x: torch.Tensor, expert_of_token: torch.Tensor) -> torch.Tensor:
        order = torch.argsort(expert_of_token, stable=True)
        counts = torch.bincount(expert_of_token, minlength=EXPERTS)
        y = self.experts(self.proj(x)[order], counts)
        return torch.empty_like(y).index_copy(0, order, y)


def rank_batches(step: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's tokens and experts; step 1: rank 0 routes only to experts 0-1 (it sends
    nothing to rank 1) and expert 3 gets no token at all."""
    g = torch.Generator().manual_seed(100 + step)
    batches = []
    for rank in range(world):
        n = 7 if rank == 0 else 5
        choices = [0, 1] if (step == 1 and rank == 0) else [0, 1, 2]
        experts = torch.tensor(choices)[torch.randint(len(choices), (n,), generator=g)]
        batches.append((torch.randn(n, DIM, generator=g), experts))
    return batches


def reference_step(ref: ToyMoE, batches, targets) -> list[torch.Tensor]:
    """One process: all ranks' tokens, ordered by (expert, rank) as EP delivers them."""
    x = torch.cat([b[0] for b in batches])
    experts = torch.cat([b[1] for b in batches])
    y = ref(x, experts)
    (y * torch.cat(targets)).sum().backward()
    return list(torch.split(y.detach(), [len(b[0]) for b in batches]))


def check(name: str, ok: bool) -> None:
    if not ok:
        raise AssertionError(f"CHECK {name} FAILED on rank {dist.get_rank()}")
    if dist.get_rank() == 0:
        print(f"CHECK {name} ok", flush=True)


def close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal up to summation order: matmul kernels block their sums by the number of rows
    (here 5-12 per rank vs 12 in one process) and FSDP adds the ranks' dense gradients in
    another order. Each value is a sum of at most 12 fp32 products of O(1) terms, so the
    difference is at most ~12 x 2^-24 x (sum of |terms|) < 1e-5 relative; 1e-6 absolute
    covers values near zero. A misrouted token or lost gradient is off by O(0.1)."""
    return torch.allclose(actual, expected, rtol=1e-5, atol=1e-6)


def full(grad: torch.Tensor) -> torch.Tensor:
    return grad.full_tensor() if isinstance(grad, DTensor) else grad


def check_layout(use_grouped_mm: bool, meshes) -> None:
    """Two steps of the EP model against the one-process one (module docstring)."""
    kind = "grouped_mm" if use_grouped_mm else "loop"
    torch.manual_seed(0)
    ref = ToyMoE(use_grouped_mm)
    model = ToyMoE(use_grouped_mm)
    model.load_state_dict(ref.state_dict())
    apply_expert_parallel([model.experts], meshes.expert["ep"])
    ignored = apply_expert_fsdp([model.experts], expert_fsdp_mesh(meshes.expert),
                                param_dtype=torch.float32, reduce_dtype=torch.float32,
                                reshard=True)
    apply_fsdp(model, meshes.fsdp, [[model.proj]], param_dtype=torch.float32,
               reduce_dtype=torch.float32, reshard=True, ignored_params=ignored)
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(2):
        batches = rank_batches(step, world)
        targets = [torch.randn(len(b[0]), DIM, generator=torch.Generator().manual_seed(step))
                   for b in batches]
        expected = reference_step(ref, batches, targets)
        y = model(*batches[rank])
        check(f"{kind} step {step} output", close(y.detach(), expected[rank]))
        (y * targets[rank]).sum().backward()
        for name, param in model.named_parameters():
            want = dict(ref.named_parameters())[name].grad
            check(f"{kind} step {step} grad {name}", close(full(param.grad), want))
        norm = clip_grad_norm_(model.parameters(), max_norm=0.5)
        want = clip_grad_norm_(ref.parameters(), max_norm=0.5)
        check(f"{kind} step {step} grad norm over two meshes",
              torch.allclose(norm, want, rtol=1e-6))
        check(f"{kind} step {step} clipped grads", all(
            close(full(p.grad), q.grad)
            for p, q in zip(model.parameters(), ref.parameters(), strict=True)))
        ref.zero_grad()
        model.zero_grad()


def main() -> None:
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    meshes = ParallelDims.resolve(dist.get_world_size(), ep=2).build_meshes("cpu")
    for use_grouped_mm in (False, True):
        check_layout(use_grouped_mm, meshes)
    exit_process(0)

if __name__ == "__main__":
    main()
