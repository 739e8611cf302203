"""Expert parallelism's layout: which ranks share experts, and the checks of EP and ETP (the
expert mesh view itself is built with the others, distributed/parallel_dims.py).

EP does not add ranks: like TorchTitan, it borrows them from the ranks that already split the
data. Dense parameters keep the mesh ``[pp, dp_replicate, dp_shard, cp, tp]``; routed-expert
parameters see the same ranks as ``[pp, dp_replicate, efsdp, ep, etp]``:

- ``etp``: tensor parallel inside each expert, either ``tp`` (experts split like the dense
  feed-forward) or 1 (then the TP ranks, which hold different tokens under sequence parallel,
  join the borrowed ranks);
- ``ep``: ranks holding different experts, exchanging tokens with all-to-alls;
- ``efsdp``: the rest of the borrowed ranks, ``dp_shard x cp x (tp / etp) / ep``: they hold the
  same experts, so FSDP shards the expert weights over them (and HSDP replicates them over
  ``dp_replicate``, as the dense weights).

Both views unflatten one 1-D world mesh, so rank ``r`` sits in both (docs/expert-parallel.md
works an example through).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed.parallel_dims import ParallelDims, borrowed_ranks, efsdp_degree

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def validate_expert_layout(dims: ParallelDims, num_experts: int) -> None:
    """One ConfigError per impossible EP/ETP setting; ``num_experts`` = 0 for a dense model."""
    fields = "[parallelism] expert_parallel_degree"
    for name, degree in (("expert_parallel_degree", dims.ep),
                         ("expert_tensor_parallel_degree", dims.etp)):
        if degree < 1:
            raise ConfigError(f"[parallelism] {name} = {degree}: must be >= 1")
    if dims.etp not in (1, dims.tp):
        raise ConfigError(
            f"[parallelism] expert_tensor_parallel_degree = {dims.etp} must be 1 or "
            f"tensor_parallel_degree = {dims.tp}: experts are either split like the dense "
            "layers or not at all"
        )
    if num_experts == 0 and (dims.ep > 1 or dims.etp > 1):
        raise ConfigError(
            f"{fields} = {dims.ep}, expert_tensor_parallel_degree = {dims.etp}: the model has "
            "no mixture-of-experts layers; set both to 1"
        )
    borrowed = borrowed_ranks(dims)
    source = "dp_shard x cp" + (" x tp" if dims.etp == 1 and dims.tp > 1 else "")
    if borrowed % dims.ep:
        raise ConfigError(
            f"{fields} = {dims.ep} must divide the ranks it borrows, {source} = {borrowed} "
            f"({dims}); EP adds no ranks, it splits the experts over data-parallel ones"
        )
    if num_experts and num_experts % dims.ep:
        raise ConfigError(
            f"{fields} = {dims.ep} must divide the model's {num_experts} routed experts "
            "(each EP rank holds the same number of experts)"
        )
    if num_experts and dims.tp > 1:
        _check_experts_under_tp(dims)


def _check_experts_under_tp(dims: ParallelDims) -> None:
    """Under TP the experts either split over the TP ranks like the dense feed-forward (ETP =
    TP, distributed/local_tp.py), with EP on top over dp_shard x cp ranks, or stay whole
    (ETP = 1) on the EP ranks, EP borrowing the TP ranks, each of which routes its own sequence
    shard. What is not built is refused."""
    tp = f"tensor_parallel_degree = {dims.tp}"
    sharing = efsdp_degree(dims) * dims.dp_replicate
    if dims.etp == 1 and dims.ep == 1:
        raise ConfigError(
            f"[parallelism] expert_tensor_parallel_degree = 1 with {tp} and "
            "expert_parallel_degree = 1: experts replicated on every TP rank are not "
            f"implemented; set expert_tensor_parallel_degree = {dims.tp} (every expert split "
            "over the TP ranks like the dense feed-forward), or expert_parallel_degree > 1 "
            "(EP then borrows the TP ranks)"
        )
    if dims.etp == 1 and sharing > 1 and dims.dp_replicate * dims.dp_shard * dims.cp == 1:
        raise ConfigError(
            f"[parallelism] expert_parallel_degree = {dims.ep} with {tp} and "
            f"expert_tensor_parallel_degree = 1 leaves {sharing} TP ranks holding the same "
            "experts, and without data or context parallelism no FSDP sums their gradients; "
            f"set expert_parallel_degree = {borrowed_ranks(dims)}"
        )
    if dims.etp > 1 and dims.ep > 1 and sharing > 1:
        raise ConfigError(
            f"[parallelism] expert_parallel_degree = {dims.ep} with {tp} and "
            f"expert_tensor_parallel_degree = {dims.etp}: FSDP of the expert weights over the "
            f"{sharing} ranks that would share them is not tested yet with ETP = TP; set "
            "expert_parallel_degree = data_parallel_shard x context_parallel degree (no "
            "data_parallel_replicate), or expert_tensor_parallel_degree = 1 (EP borrowing the "
            "TP ranks too, expert FSDP tested)"
        )


def expert_fsdp_mesh(experts: DeviceMesh) -> DeviceMesh:
    """FSDP's mesh for expert weights: efsdp, or (dp_replicate, efsdp) for HSDP."""
    if experts["dp_replicate"].size() > 1:
        return experts["dp_replicate", "efsdp"]
    return experts["efsdp"]
