"""The Llama 3 parallelization plan: one model part in, the same part parallelized out.

The order is fixed and each step lives in its own file under distributed/:
tensor parallel -> (expert parallel) -> activation checkpointing -> torch.compile -> FSDP2 (the
last four through distributed/plan_toolkit.py's ``apply_block_tail``); context parallel is no
step of the plan, it is entered per step (docs/design.md, "Where each dimension is applied").
Every step skips the modules a pipeline stage dropped (``None``), so each stage of a pipeline
goes through this same plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims
from torchtitan_like.distributed.plan_toolkit import apply_block_tail, attention_plan, swiglu_plan
from torchtitan_like.distributed.tensor_parallel import materialise_output, maybe_enable_async_tp
from torchtitan_like.models.llama3.model import Transformer

BlockPlanFn = Callable[[nn.Module, str], dict[str, ParallelStyle]]
"""(a transformer block, device type) -> its TP plan, module name -> style."""


def parallelize_llama(
    model: Transformer, parallel_dims: ParallelDims, meshes: Meshes, config: JobConfig,
    block_plan: BlockPlanFn | None = None, routed_experts: Sequence[nn.Module] = (),
) -> Transformer:
    """``block_plan`` is one block's TP plan (default: llama's ``block_tp_plan``); a family
    on the same skeleton with more modules in a block passes its own, and one with MoE blocks
    passes their ``routed_experts`` for expert parallelism (plan_toolkit.apply_block_tail)."""
    if parallel_dims.tp_enabled:
        apply_tp(model, meshes.tp, loss_parallel=parallel_dims.loss_parallel_enabled,
                 block_plan=block_plan or block_tp_plan)
        maybe_enable_async_tp(config, meshes.tp)
    # Context parallel changes no module: the trainer's train_context shards each microbatch
    # and the RoPE table (context_parallel_buffers) and swaps SDPA for ring attention.
    # A tied embedding and head share one weight, so they must share one FSDP unit: the root.
    tied = model.args.tie_word_embeddings
    apply_block_tail(model, model.layers, parallel_dims, meshes, config,
                     before=[] if tied else [[model.tok_embeddings]],
                     after=[] if tied else [[model.norm, model.output]],
                     routed_experts=routed_experts)
    return model


def context_parallel_buffers(model: Transformer) -> list[tuple[torch.Tensor, int]]:
    """What CP shards beside the tokens: the RoPE table, (seq_len, 2 * head_dim), by rows, so
    each rank rotates its tokens by their global positions (distributed/context_parallel.py)."""
    return [(model.rope_cache, 0)]


def embedding_tp_style() -> ParallelStyle:
    """The token embedding under TP: split by vocabulary rows, its partial lookups
    reduce-scattered into sequence shards (Shard(1))."""
    return RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, *, loss_parallel: bool,
             block_plan: BlockPlanFn) -> None:
    """Megatron TP with sequence parallel (distributed/tensor_parallel.py) on a model part.

    Between blocks the hidden states are sequence-sharded local tensors (Shard(1)); that is
    also what a pipeline stage sends to the next one. The logits are a vocab-sharded DTensor
    under loss parallel, else a plain tensor.
    """
    edges: dict[str, ParallelStyle] = {}
    if model.tok_embeddings is not None:
        edges["tok_embeddings"] = embedding_tp_style()
    if model.norm is not None:
        edges["norm"] = SequenceParallel()
    if model.output is not None:  # vocab columns; kept sharded for loss parallel
        edges["output"] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    parallelize_module(model, tp_mesh, edges)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan(block, tp_mesh.device_type))
    if model.tok_embeddings is not None:
        materialise_output(model.tok_embeddings)  # before it reaches a compiled block
        if model.norm is not None and model.args.tie_word_embeddings:
            _shard_tied_head(model, tp_mesh, loss_parallel)


def _shard_tied_head(model: Transformer, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """A tied head is ``F.linear(h, embedding table)``, and the table is already split by
    vocabulary rows (Shard(0)), exactly as a column-wise head's weight: only the head's input
    must become a DTensor, all-gathered along the sequence, for DTensor to compute the
    vocab-sharded logits; without loss parallel they are then gathered."""
    parallelize_module(model.norm, tp_mesh, PrepareModuleOutput(
        output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=False))
    if not loss_parallel:
        model.register_forward_hook(lambda _module, _args, logits: logits.full_tensor())


def block_tp_plan(block: nn.Module, device_type: str) -> dict[str, ParallelStyle]:
    """One transformer block: SP norms, then all-gather -> column-wise -> row-wise ->
    reduce-scatter around attention and around the feed-forward (distributed/plan_toolkit.py)."""
    return {
        "attention_norm": SequenceParallel(),
        **attention_plan(block, device_type),  # (x, rope)
        "ffn_norm": SequenceParallel(),
        **swiglu_plan(block, device_type),
    }
