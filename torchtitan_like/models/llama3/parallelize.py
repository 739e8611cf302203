"""The Llama 3 parallelization plan: one model part in, the same part parallelized out.

The order is fixed and each step lives in its own file under distributed/:
tensor parallel (``apply_tp`` with this model's ``TPPlan``, distributed/tensor_parallel.py) ->
(expert parallel) -> activation checkpointing -> torch.compile -> FSDP2 (the last four through
distributed/plan_toolkit.py's ``apply_block_tail``); context parallel is no step of the plan,
it is entered per step (docs/design.md, "Where each dimension is applied"). Every step skips
the modules a pipeline stage dropped (``None``), so each stage of a pipeline goes through this
same plan.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims
from torchtitan_like.distributed.plan_toolkit import apply_block_tail
from torchtitan_like.distributed.tensor_parallel import BlockPlanFn, TPPlan, apply_tp
from torchtitan_like.distributed.tp_styles import attention_plan
from torchtitan_like.models.block_plan import prenorm_tp_plan
from torchtitan_like.models.llama3.model import Transformer


def parallelize_llama(
    model: Transformer, parallel_dims: ParallelDims, meshes: Meshes, config: JobConfig,
    block_plan: BlockPlanFn | None = None, routed_experts: Sequence[nn.Module] = (),
) -> Transformer:
    """``block_plan`` is one block's TP table (default: llama's ``block_tp_plan``); a family
    on the same skeleton with more modules in a block passes its own, and one with MoE blocks
    passes their ``routed_experts`` for expert parallelism (plan_toolkit.apply_block_tail)."""
    apply_tp(model, tp_plan(model, block_plan or block_tp_plan), parallel_dims, meshes, config)
    # Context parallel changes no module: the trainer's train_context shards each microbatch
    # and the RoPE table (context_parallel_buffers) and swaps SDPA for ring attention.
    # A tied embedding and head share one weight, so they must share one FSDP unit: the root.
    tied = model.args.tie_word_embeddings
    apply_block_tail(model, model.layers, parallel_dims, meshes, config,
                     before=[] if tied else [[model.tok_embeddings]],
                     after=[] if tied else [[model.norm, model.output]],
                     routed_experts=routed_experts)
    return model


def tp_plan(model: Transformer, block_plan: BlockPlanFn) -> TPPlan:
    """What the llama skeleton (Qwen3's too) shards under TP: the token embedding by
    vocabulary rows, the final norm, the head by vocabulary columns (or tied to the
    embedding), and every block as ``block_plan`` says."""
    return TPPlan(blocks={"layers": block_plan}, embeddings=("tok_embeddings",), norm="norm",
                  head="output", tied_head=model.args.tie_word_embeddings)


def block_tp_plan(block: nn.Module, device_type: str) -> dict[str, ParallelStyle]:
    """The shared block's table (models/block_plan.py) with grouped-query attention split by
    heads: all-gather -> column-wise q/k/v -> row-wise wo -> reduce-scatter."""
    return prenorm_tp_plan(block, device_type, attention_plan(block, device_type))


def context_parallel_buffers(model: Transformer) -> list[tuple[torch.Tensor, int]]:
    """What CP shards beside the tokens: the RoPE table, (seq_len, 2 * head_dim), by rows, so
    each rank rotates its tokens by their global positions (distributed/context_parallel.py)."""
    return [(model.rope_cache, 0)]
