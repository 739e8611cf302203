"""The tensor-parallel table of the shared block (models/block.py): what each of its modules
is split as; ``apply_tp`` (distributed/tensor_parallel.py) applies it.

Its norms run sequence parallel on the rank's sequence shard; attention is the family's own
entries (heads split over the TP ranks); the feed-forward is Megatron's SwiGLU pair
(column-wise gate and up, row-wise down) or, in a MoE block, the MoE layer as one local TP
region (distributed/local_tp.py): router and shared experts as the region says, the routed
experts split by hidden features, or left to expert parallelism when it is on; under ETP = 1
(expert parallelism borrowing the TP ranks) the layer runs on each rank's own sequence shard.
"""

from __future__ import annotations

from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel

from torchtitan_like.distributed.local_tp import moe_tp_plan
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.tp_styles import swiglu_plan
from torchtitan_like.models.block import PreNormBlock


def prenorm_tp_plan(block: PreNormBlock, device_type: str, attention: dict[str, ParallelStyle],
                    *, expert_parallel: bool = False, experts_over_tp: bool = True
                    ) -> dict[str, ParallelStyle]:
    """One block's table around the family's ``attention`` entries (module docstring);
    ``experts_over_tp=False``: ETP = 1."""
    ffn = (moe_tp_plan(block, expert_parallel=expert_parallel, experts_over_tp=experts_over_tp)
           if block.moe_enabled else swiglu_plan(block, device_type))
    return {"attention_norm": SequenceParallel(), **attention,
            "ffn_norm": SequenceParallel(), **ffn}


def expert_options(parallel_dims: ParallelDims) -> dict[str, bool]:
    """``prenorm_tp_plan``'s MoE keywords for this layout."""
    return {"expert_parallel": parallel_dims.ep_enabled, "experts_over_tp": parallel_dims.etp > 1}
