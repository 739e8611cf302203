"""Tensor parallelism (TP) with sequence parallelism (SP), loss parallelism and async TP.

**Tensor parallel MLP and attention** (Shoeybi et al., "Megatron-LM", 2019). Split the MLP
``Y = W2 f(W1 X)`` over t ranks by splitting W1 by *columns* (output features) and W2 by *rows*
(input features): ``W1 = [W1_1 .. W1_t]``, ``W2 = [W2_1; ..; W2_t]``. Rank i computes
``Y_i = W2_i f(W1_i X)`` from the full input X with no communication (f is element-wise, and
SwiGLU's W3 is split like W1), and ``Y = sum_i Y_i``: **one all-reduce** per MLP in forward (and
one, on dX, in backward). Attention splits the same way by heads: wq/wk/wv column-wise (rank i
owns n_heads/t query heads and n_kv_heads/t key/value heads, so each query head still meets its
own KV head), softmax(QK^T)V per head is local, wo row-wise, one all-reduce. A transformer
block therefore costs two all-reduces in forward and two in backward, and each rank holds 1/t
of the block's weights, gradients and optimizer states.

**Sequence parallel** (Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models", 2022). Outside the TP regions (RMSNorms, residual adds, dropout) every
rank would repeat the same work on the same (b, s, h) activations. An all-reduce equals a
reduce-scatter followed by an all-gather, so: the row-wise output is *reduce-scattered* along
the sequence (each rank keeps s/t tokens: Shard(1)), the norms and residual adds run on that
shard, and the next TP region's input is *all-gathered* (Replicate) just before its column-wise
matmuls. Same bytes on the wire as the all-reduce, but the activations between TP regions
(about 10 sbh bytes per layer) are stored once over the t ranks instead of t times.

**Embedding and head.** The embedding table is split by vocabulary rows: each rank looks up
the tokens it owns (zeros elsewhere) and the reduce-scatter both sums the partial lookups and
shards the sequence. The head is column-wise over the vocabulary: rank i gets logits
``z_i = h W_i^T`` for V/t classes.

**Loss parallel.** Cross-entropy on vocab-sharded logits without gathering them (b x s x V
floats, the largest activation of a small model): with ``m = max_j z_j`` (an all-reduce max of
the local maxima) and ``S = sum_j exp(z_j - m)`` (an all-reduce sum of local sums),
``ce = m + log S - z_y``, where the target logit z_y is found on the rank owning class y and
summed in. The gradient ``softmax(z) - onehot(y)`` stays sharded. Backward must run under the
same context (``torch.distributed.tensor.parallel.loss_parallel``), see ``train_context`` in
distributed/utils.py.

**Async TP** (Wang et al., "Overlap Communication with Dependent Computation via Decomposition
in Large Deep Learning Models", 2023). Inductor's micro-pipeline pass rewrites all-gather ->
matmul and matmul -> reduce-scatter into chunked loops over symmetric memory, so that chunk k's
transfer overlaps chunk k-1's matmul. It needs CUDA (symmetric memory) and ``torch.compile``;
on CPU the pass silently does nothing, so the config refuses it there.

TP lives on the innermost mesh dim (NVLink within a node): it communicates activations in
every layer, forward and backward.

**Where it is applied.** Here, for every model: a model's plan declares *what* it shards, a
``TPPlan`` of module names (its embeddings, final norm, head, and one plan table per block
group, built from the styles of distributed/tp_styles.py and distributed/local_tp.py), and
``apply_tp`` applies it, then turns on async TP when asked.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleOutput,
    SequenceParallel,
    parallelize_module,
)

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed.layout_rules import check_sequence_parallel
from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims
from torchtitan_like.distributed.tp_styles import embedding_style
from torchtitan_like.logging import logger

BlockPlanFn = Callable[[nn.Module, str], dict[str, ParallelStyle]]
"""(one block, the TP mesh's device type) -> its plan table, module name -> style."""


@dataclasses.dataclass(frozen=True)
class TPPlan:
    """What a model part shards under tensor parallelism, by module name (dotted paths from
    the part); how each is split is ``apply_tp``'s. A name whose module a pipeline stage
    dropped (None) is skipped; a module reached by two names (an embedding shared with an
    extra head) is split once."""

    blocks: Mapping[str, BlockPlanFn]
    """Each block group (an ``nn.ModuleDict`` of blocks) -> the plan table of one block."""
    embeddings: tuple[str, ...] = ()
    """Embedding tables: split by vocabulary rows, their lookups come out sequence-sharded."""
    norm: str | None = None
    """The final norm: sequence parallel."""
    head: str | None = None
    """The output projection: split by vocabulary columns, its logits kept vocab-sharded under
    loss parallel, else gathered."""
    tied_head: bool = False
    """No head module: the logits are ``F.linear(norm's output, the first embedding's
    table)``, already split by vocabulary rows as a column-wise head's weight."""


def apply_tp(model: nn.Module, plan: TPPlan, parallel_dims: ParallelDims, meshes: Meshes,
             config: JobConfig) -> None:
    """Megatron TP with sequence parallel on one model part, as ``plan`` names it, then async
    TP when asked: every model's TP goes through here (a no-op without TP).

    Between blocks the hidden states are sequence-sharded local tensors (Shard(1)); that is
    also what a pipeline stage sends to the next one. The logits are a vocab-sharded DTensor
    under loss parallel, else a plain tensor.
    """
    if not parallel_dims.tp_enabled:
        return
    mesh, loss_parallel = meshes.tp, parallel_dims.loss_parallel_enabled
    embeddings = _present(model, plan.embeddings)
    norm, head = _present(model, (plan.norm,)), _present(model, (plan.head,))
    for embedding in embeddings:
        parallelize_module(embedding, mesh, embedding_style())
        materialise_output(embedding)  # before it reaches a compiled block
    for module in norm:
        parallelize_module(module, mesh, SequenceParallel())
    for module in head:  # vocab columns; kept sharded for loss parallel
        parallelize_module(module, mesh, ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel))
    for group, block_plan in plan.blocks.items():
        for block in (blocks.values() if (blocks := _find(model, group)) is not None else ()):
            parallelize_module(block, mesh, block_plan(block, mesh.device_type))
    if plan.tied_head and embeddings and norm:
        _shard_tied_head(model, norm[0], mesh, loss_parallel)
    maybe_enable_async_tp(config, mesh)


def _find(model: nn.Module, name: str) -> nn.Module | None:
    """The submodule at dotted path ``name``; None where a pipeline stage dropped it."""
    module: nn.Module | None = model
    for part in name.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def _present(model: nn.Module, names: tuple[str | None, ...]) -> list[nn.Module]:
    """The modules ``names`` name that this part holds, each once."""
    found: dict[int, nn.Module] = {}
    for name in filter(None, names):
        if (module := _find(model, name)) is not None:
            found.setdefault(id(module), module)
    return list(found.values())


def _shard_tied_head(model: nn.Module, norm: nn.Module, tp_mesh: DeviceMesh,
                     loss_parallel: bool) -> None:
    """A tied head is ``F.linear(h, embedding table)``, and the table is already split by
    vocabulary rows (Shard(0)), exactly as a column-wise head's weight: only the head's input
    must become a DTensor, all-gathered along the sequence, for DTensor to compute the
    vocab-sharded logits; without loss parallel they are then gathered."""
    parallelize_module(norm, tp_mesh, PrepareModuleOutput(
        output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=False))
    if not loss_parallel:
        model.register_forward_hook(lambda _module, _args, logits: logits.full_tensor())


def validate(config: JobConfig, parallel_dims: ParallelDims) -> None:
    """Layout checks that do not depend on the model (the model checks its heads/vocab)."""
    tp = parallel_dims.tp
    seq_len = config.training.seq_len
    check_sequence_parallel(tp, seq_len)
    if tp > 1 and async_tp_on(config):  # else a setting without effect (config/switches.py)
        _validate_async_tp()
    local_world = _devices_per_node()
    if local_world is not None and tp > local_world:
        logger.warning(
            f"[parallelism] tensor_parallel_degree = {tp} is larger than the {local_world} "
            "devices of one node: TP's per-layer collectives would cross the inter-node "
            "network. Keep TP within a node (NVLink) and use FSDP/PP across nodes."
        )


def record_loss_parallel(config: JobConfig, parallel_dims: ParallelDims, model_name: str,
                         plan_shards_logits: bool) -> None:
    """Record loss parallel as off when the model's plan gathers the logits under TP
    (``ModelSpec.loss_parallel = False``), so that the config, the layout in checkpoint.json
    and the train context all say what runs: a plain cross-entropy on whole logits."""
    p = config.parallelism
    if parallel_dims.tp_enabled and not plan_shards_logits and not p.disable_loss_parallel:
        p.disable_loss_parallel = True
        logger.info(f"loss parallel: off, recorded as [parallelism] disable_loss_parallel = "
                    f"true: model {model_name!r} gathers whole logits under TP "
                    "(ModelSpec.loss_parallel = False)")


def async_tp_on(config: JobConfig) -> bool:
    """Async TP is asked for and can act under TP: inductor's micro-pipeline pass runs on
    compiled blocks only."""
    return config.parallelism.enable_async_tensor_parallel and config.compile.compiles_blocks


def _validate_async_tp() -> None:
    if not torch.cuda.is_available():
        raise ConfigError(
            "[parallelism] enable_async_tensor_parallel needs CUDA GPUs: it overlaps TP's "
            "collectives with matmuls through symmetric memory, which exists only on CUDA, and "
            "on CPU inductor's micro-pipeline pass silently does nothing; set it to false"
        )


def _devices_per_node() -> int | None:
    """Processes torchrun starts on this node, else the GPUs here; None on a plain CPU run."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    return torch.cuda.device_count() if torch.cuda.is_available() else None


def maybe_enable_async_tp(config: JobConfig, tp_mesh: DeviceMesh) -> None:
    """Turn on inductor's micro-pipeline TP for the TP group when ``async_tp_on`` (validated:
    CUDA)."""
    if not async_tp_on(config):
        return
    import torch._inductor.config
    from torch.distributed._symmetric_memory import (
        enable_symm_mem_for_group,
        is_symm_mem_enabled_for_group,
    )

    torch._inductor.config._micro_pipeline_tp = True
    group_name = tp_mesh.get_group().group_name
    # torch 2.13 deprecates this call as unneeded, yet the micro-pipeline pass still skips
    # groups it was not made for (pytorch/pytorch#193027); the check keeps later torch clean.
    if not is_symm_mem_enabled_for_group(group_name):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable_symm_mem_for_group(group_name)
    logger.info(f"async TP: micro-pipelined collectives on TP group {group_name}")


def materialise_output(module: nn.Module) -> None:
    """Make ``module`` return a plain tensor where its TP output hook leaves an
    ``AsyncCollectiveTensor`` (a collective not yet waited on).

    In eager mode the wrapper waits on first use, but a ``torch.compile``d block that receives
    it fails in backward (``'Tensor' object has no attribute '_local_tensor'``). Cloning
    waits for the collective and leaves a plain, autograd-tracked tensor; it costs one copy of
    a sequence-sharded activation per step.
    """

    def hook(_module: nn.Module, _args: object, output: torch.Tensor) -> torch.Tensor:
        return output.clone() if isinstance(output, AsyncCollectiveTensor) else output

    module.register_forward_hook(hook)
