"""``ModelSpec``: everything model-specific the trainer needs, bundled (models/registry.py
registers and finds them; nothing else in the trainer knows a model by name)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from torchtitan_like.protocols.hf_adapter import HFAdapter
from torchtitan_like.protocols.model_args import BaseModelArgs

if TYPE_CHECKING:
    from torchtitan_like.components.optimizer import OptimizersContainer
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims


PARALLEL_DIMS = {"tp": "tensor_parallel_degree", "cp": "context_parallel_degree",
                 "pp": "pipeline_parallel_degree", "ep": "expert_parallel_degree"}
"""Model-specific parallel dimensions and their [parallelism] degree fields."""

ParallelizeFn = Callable[["nn.Module", "ParallelDims", "Meshes", "JobConfig"], "nn.Module"]
OptimizerHooksFn = Callable[
    [list["nn.Module"], "OptimizersContainer", "ParallelDims", "Meshes"], None]
"""(model parts, their optimizers, dims, meshes) -> registers per-step state updates as
optimizer step post-hooks (e.g. MoE bias balancing, models/moe/balancing.py)."""
PipeliningFn = Callable[["nn.Module", list[int], "JobConfig"], list["nn.Module"]]
"""(model on meta, this rank's stage indices, job) -> one module per stage, each the model with
the other stages' modules removed and parameter names unchanged (distributed/pipeline.py)."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    """Registry key, the value of [model] name."""

    model_cls: Callable[[Any], nn.Module]
    """Builds the plain model from an args instance; must offer ``init_weights()``."""

    flavors: Mapping[str, BaseModelArgs]
    """Size presets, the values of [model] flavor."""

    parallelize_fn: ParallelizeFn
    """Applies TP/CP/AC/compile/FSDP to one model part, in the documented order."""

    pipelining_fn: PipeliningFn | None = None
    """Splits the model into pipeline stages; None = this model cannot be pipelined."""

    hf_adapter: Callable[[Any], HFAdapter] | None = None
    """Builds the HuggingFace converter for a flavor's args; None = no HF interop."""

    register_optimizer_hooks: OptimizerHooksFn | None = None
    """Called once the optimizers exist, to hook model state updated after each optimizer
    step; None = nothing to hook."""

    context_parallel_buffers: Callable[[nn.Module], list[tuple[torch.Tensor, int]]] | None = None
    """A model part's buffers laid out along the sequence, as (buffer, its sequence dim), that
    context parallelism shards beside the tokens (e.g. the RoPE table); None = this model
    cannot run under context parallelism (its attention is not causal SDPA, or its positions
    are not such a buffer)."""

    supported_dims: frozenset[str] = frozenset(PARALLEL_DIMS)
    """The parallel dimensions beyond data parallelism (FSDP/HSDP, always supported) that
    ``parallelize_fn`` implements, among "tp", "cp", "pp", "ep"; a job asking for another is
    refused at start-up, before any process group exists."""

    attn_mask_types: frozenset[str] = frozenset({"causal"})
    """The ``[model] attn_mask_type`` values the model implements: "causal", and
    "block_causal" when its forward takes ``document_ids`` (models/attention_masks.py); a job
    asking for another is refused at start-up."""

    stage_inputs: frozenset[str] = frozenset()
    """Keyword inputs the model's forward takes from the step's batch, handed to every
    pipeline stage (and to the whole model without PP): among "token_ids", "labels" and
    "document_ids" (models/stage_inputs.py; the document ids come with block-causal attention
    anyway). Checked at start-up against the forward's keywords."""

    loss_parallel: bool = True
    """Whether the plan hands the loss vocab-sharded logits under TP when
    ``parallel_dims.loss_parallel_enabled``. False: it gathers whole logits (e.g. a loss term
    needs whole rows), and a TP job records loss parallel as off ([parallelism]
    disable_loss_parallel = true) at start-up; the logits the loss receives are checked either
    way (distributed/plan_check.py)."""
