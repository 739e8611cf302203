"""Parallel degrees -> one named DeviceMesh.

Mesh dims, outermost to innermost: ``[pp, dp_replicate, dp_shard, cp, tp]``. Inner dims hold
ranks with consecutive numbers, i.e. ranks of one node, so TP (the chattiest: collectives in
every layer's forward and backward) gets the fastest links and PP (point-to-point activations
only) the slowest. Flattened views name what each consumer needs:

- ``dp``          = dp_replicate x dp_shard: ranks that read different data;
- ``dp_shard_cp`` = dp_shard x cp: ranks FSDP shards parameters over (CP ranks hold the same
  parameters, so they share the sharding);
- ``dp_cp``       = dp_replicate x dp_shard x cp: ranks whose losses add up to the global loss;
- ``expert``      = ``[pp, dp_replicate, efsdp, ep, etp]``: the same ranks as routed experts see
  them (expert parallelism borrows data-parallel ranks, distributed/expert_layout.py).

Every view is unflattened from one 1-D world mesh (slicing flattened dims out of a root mesh
is deprecated), size-1 dims included so that each name always resolves.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed.utils import PROCESS_GROUP_TIMEOUT_S, follow_world_timeout

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
EXPERT_MESH_DIMS = ("pp", "dp_replicate", "efsdp", "ep", "etp")


@dataclasses.dataclass(frozen=True)
class ParallelDims:
    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    world_size: int
    enable_loss_parallel: bool = True
    """Under TP, compute the loss on vocab-sharded logits (see distributed/tensor_parallel.py)."""
    ep: int = 1
    """Expert parallel: borrows dp_shard x cp ranks (distributed/expert_layout.py)."""
    etp: int = 1
    """Tensor parallel inside experts: 1 or tp."""

    def __str__(self) -> str:
        """e.g. ``pp 1 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2 = 4 ranks``."""
        dims = " x ".join(f"{d} {getattr(self, d)}" for d in MESH_DIMS)
        return f"{dims} = {self.world_size} ranks"

    @classmethod
    def resolve(
        cls,
        world_size: int,
        *,
        dp_replicate: int = 1,
        dp_shard: int = -1,
        cp: int = 1,
        tp: int = 1,
        pp: int = 1,
        enable_loss_parallel: bool = True,
        ep: int = 1,
        etp: int = 1,
    ) -> ParallelDims:
        """Fill in ``dp_shard = -1`` and check that the degrees multiply to the world size."""
        named = {"pp": pp, "dp_replicate": dp_replicate, "cp": cp, "tp": tp}
        for name, degree in {**named, "dp_shard": dp_shard}.items():
            if degree < 1 and not (name == "dp_shard" and degree == -1):
                raise ConfigError(f"parallel degree {name} = {degree}: must be >= 1"
                                  + (" (or -1 to fill the rest)" if name == "dp_shard" else ""))
        others = math.prod(named.values())
        product = " x ".join(f"{n}({d})" for n, d in named.items())
        if dp_shard == -1:
            if world_size % others:
                raise ConfigError(
                    f"data_parallel_shard_degree = -1 takes what the other degrees leave, but the "
                    f"world size {world_size} is not divisible by {product} = {others}"
                )
            dp_shard = world_size // others
        if others * dp_shard != world_size:
            raise ConfigError(
                f"parallel degrees do not multiply to the world size: {product} x "
                f"dp_shard({dp_shard}) = {others * dp_shard}, but {world_size} processes run "
                "(set NPROC, or a degree to -1 / other values)"
            )
        return cls(pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp,
                   world_size=world_size, enable_loss_parallel=enable_loss_parallel,
                   ep=ep, etp=etp)

    @classmethod
    def from_config(cls, config: JobConfig, world_size: int) -> ParallelDims:
        """The degrees of ``[parallelism]`` on ``world_size`` ranks."""
        p = config.parallelism
        return cls.resolve(
            world_size,
            dp_replicate=p.data_parallel_replicate_degree,
            dp_shard=p.data_parallel_shard_degree,
            cp=p.context_parallel_degree,
            tp=p.tensor_parallel_degree,
            enable_loss_parallel=not p.disable_loss_parallel,
            pp=p.pipeline_parallel_degree,
            ep=p.expert_parallel_degree,
            etp=p.expert_tensor_parallel_degree,
        )

    @property
    def dp(self) -> int:
        """Data-parallel degree: model replicas reading different data."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_enabled(self) -> bool:
        """FSDP/HSDP wraps the model whenever parameters or gradients must be shared."""
        return self.dp_replicate * self.dp_shard * self.cp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def loss_parallel_enabled(self) -> bool:
        """Cross-entropy on vocab-sharded logits: on by default whenever TP is."""
        return self.tp_enabled and self.enable_loss_parallel

    @property
    def non_data_parallel_size(self) -> int:
        """Devices that together hold one model replica and consume one data stream."""
        return self.pp * self.cp * self.tp

    def build_meshes(self, device_type: str,
                     timeout_s: int = PROCESS_GROUP_TIMEOUT_S) -> Meshes:
        """Every view of the world the trainer uses, all unflattened from one 1-D world mesh
        so that they share a root (FSDP and TP then compose on DTensors); their process groups
        time out after ``timeout_s``."""
        world = init_device_mesh(device_type, (self.world_size,), mesh_dim_names=("world",))
        dense = world._unflatten(0, tuple(getattr(self, d) for d in MESH_DIMS), MESH_DIMS)
        pp, tp = self.pp, self.tp
        fsdp = world._unflatten(0, (pp, self.dp_replicate, self.dp_shard * self.cp, tp),
                                ("pp", "dp_replicate", "dp_shard_cp", "tp"))
        meshes = Meshes(
            dense=dense,
            dp=world._unflatten(0, (pp, self.dp, self.cp, tp), ("pp", "dp", "cp", "tp"))["dp"],
            dp_cp=world._unflatten(0, (pp, self.dp * self.cp, tp), ("pp", "dp_cp", "tp"))["dp_cp"],
            fsdp=fsdp["dp_replicate", "dp_shard_cp"] if self.dp_replicate > 1
            else fsdp["dp_shard_cp"],
            expert=expert_mesh(world, self),
        )
        follow_world_timeout(meshes.all(), timeout_s)
        return meshes


@dataclasses.dataclass(frozen=True)
class Meshes:
    """Named views of the world mesh (see the module docstring)."""

    dense: DeviceMesh
    """All five dims ``[pp, dp_replicate, dp_shard, cp, tp]``; ``dense["tp"]`` etc."""
    dp: DeviceMesh
    """Ranks reading different data (dp_replicate x dp_shard)."""
    dp_cp: DeviceMesh
    """Ranks whose loss shares sum to the global loss (dp x cp)."""
    fsdp: DeviceMesh
    """FSDP's mesh: 1-D dp_shard_cp, or 2-D (dp_replicate, dp_shard_cp) for HSDP."""
    expert: DeviceMesh
    """Routed experts' view ``[pp, dp_replicate, efsdp, ep, etp]`` (see expert_layout.py)."""

    def all(self) -> list[DeviceMesh]:
        """Every view, for what applies to all their process groups (timeouts)."""
        return [self.dense, self.dp, self.dp_cp, self.fsdp, self.expert]

    @property
    def pp(self) -> DeviceMesh:
        return self.dense["pp"]

    @property
    def cp(self) -> DeviceMesh:
        return self.dense["cp"]

    @property
    def tp(self) -> DeviceMesh:
        return self.dense["tp"]


def borrowed_ranks(dims: ParallelDims) -> int:
    """Ranks of one pipeline stage and one replica that EP and expert-FSDP split between them."""
    return dims.dp_shard * dims.cp * (dims.tp if dims.etp == 1 else 1)


def efsdp_degree(dims: ParallelDims) -> int:
    """Ranks holding the same experts inside one replica (FSDP shards expert weights over them)."""
    return borrowed_ranks(dims) // dims.ep


def expert_mesh(world: DeviceMesh, dims: ParallelDims) -> DeviceMesh:
    """``[pp, dp_replicate, efsdp, ep, etp]`` unflattened from the same 1-D world mesh as the
    dense view, so both share a root (FSDP then composes with EP's DTensors)."""
    shape = (dims.pp, dims.dp_replicate, efsdp_degree(dims), dims.ep, dims.etp)
    assert math.prod(shape) == dims.world_size, (shape, dims)
    return world._unflatten(0, shape, EXPERT_MESH_DIMS)
