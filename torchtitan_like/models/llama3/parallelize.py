"""The Llama 3 parallelization plan: one model part in, the same part parallelized out.

The order is fixed and each step lives in its own file under distributed/ or components/:
tensor parallel -> context parallel -> activation checkpointing -> torch.compile -> FSDP2.
"""

from __future__ import annotations

from torchtitan_like.components.activation_checkpoint import apply_ac
from torchtitan_like.components.compile import apply_compile
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.fsdp import apply_fsdp, reshard_after_forward
from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims
from torchtitan_like.distributed.utils import DTYPES
from torchtitan_like.models.llama3.model import Transformer


def parallelize_llama(
    model: Transformer, parallel_dims: ParallelDims, meshes: Meshes, config: JobConfig
) -> Transformer:
    apply_ac(model.layers, config.activation_checkpoint)
    apply_compile(model.layers, config.compile)
    if parallel_dims.fsdp_enabled:
        blocks = [[block] for block in model.layers.values()]
        # A tied embedding and head share one weight, so they must share one FSDP unit: the root.
        edges = [] if model.args.tie_word_embeddings else [[model.tok_embeddings]]
        head = [] if model.args.tie_word_embeddings else [[model.norm, model.output]]
        apply_fsdp(
            model,
            meshes.fsdp,
            [*edges, *blocks, *head],
            param_dtype=DTYPES[config.training.mixed_precision_param],
            reduce_dtype=DTYPES[config.training.mixed_precision_reduce],
            reshard=reshard_after_forward(
                config.parallelism.fsdp_reshard_after_forward, parallel_dims.pp > 1
            ),
        )
    return model
