"""torch.compile, applied per transformer block (and optionally to the loss).

Compiling each block rather than the whole model keeps compile time flat in depth (all blocks
share one graph and its cache entry) and leaves the FSDP/PP boundaries between blocks in eager
code, where their hooks run. ``Module.compile`` compiles a block in place, so parameter names
do not change. ``fullgraph=True`` turns any graph break into an error instead of a silent
slowdown.

Blocks with a mixture-of-experts layer are compiled around it, as TorchTitan does: the MoE
layer's own forward counts tokens per expert, sorts them by expert (shapes that depend on the
data) and records load metrics, and under expert parallelism its experts' forward is wrapped
with the token all-to-alls (whose split sizes are read on the host) and, with expert FSDP,
with FSDP's hooks; none of that traces into one graph. So every submodule of such a block
that holds no routed experts (attention, the router, the shared experts) is compiled whole,
and the glue in between (residual adds, routing sort, dispatch, the routed experts) stays
eager. The routed experts' grouped GEMMs stay eager too: torch 2.13's fake (meta) kernel of
``torch._grouped_mm`` accepts only bf16 inputs, so fp32 experts cannot be traced (TorchTitan,
bf16 on GPU, compiles them apart from the hooks); they are single ATen calls per weight
either way. Compiling pieces instead of the block changes no arithmetic: each compiled piece
computes the same ops as in eager, possibly summed in another order.

Under tensor parallelism MLA and the MoE layer run as local TP regions
(distributed/local_tp.py), whose forward hooks gather the sequence, swap each parameter for its
local shard in the owner's ``_parameters`` and reduce-scatter the output. Dynamo would trace
that swap (a mutation of module state) and the eager DTensor collectives around it, so a block
holding a region is compiled around it too, and the region *inside*: its own ``forward``, which
computes on the plain local tensors the hooks swapped in, is compiled, while the hooks stay
eager. The compiled forward reads the local shards as ordinary tensor inputs (new ones each
step, with the same shapes: no recompilation), and gets their gradients back through the
swapped views' own autograd (the reduce of a replicated weight's gradient included), as in
eager. A MoE region, holding routed experts, is compiled around them as above.

Side effects under activation checkpointing: a block's Python side effects (the loss and
metric hooks of protocols/step_hooks.py record values) run once per forward. Eager
checkpointing would replay them while recomputing in backward, which is why the hooks ignore
recomputation; dynamo refuses them inside a checkpointed region unless told not to replay them,
which is exactly the hooks' semantics, so apply_compile sets
``torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence

import torch
from torch import nn

from torchtitan_like.config.job_config import Compile
from torchtitan_like.distributed.local_tp import is_local_tp_region
from torchtitan_like.distributed.parallel_dims import Meshes


def apply_compile(blocks: nn.ModuleDict, config: Compile,
                  routed_experts: Sequence[nn.Module] = ()) -> None:
    """Compile each block in place (after activation checkpointing wrapped it, before FSDP);
    a block holding any of ``routed_experts`` (GroupedExperts) or a local TP region is
    compiled around them (module docstring)."""
    if not config.compiles_blocks:
        return
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    experts = set(routed_experts)
    for block in blocks.values():
        if _holds_eager_part(block, experts):
            _compile_around(block, experts)
        else:
            block.compile(fullgraph=True)


def _holds_experts(module: nn.Module, experts: Collection[nn.Module]) -> bool:
    return any(m in experts for m in module.modules())


def _holds_eager_part(module: nn.Module, experts: Collection[nn.Module]) -> bool:
    """Whether compiling ``module`` whole would trace what must stay eager: routed experts,
    or the hooks of a local TP region."""
    return any(m in experts or is_local_tp_region(m) for m in module.modules())


def _compile_around(module: nn.Module, experts: Collection[nn.Module]) -> None:
    """Compile each child of ``module`` (whose own forward stays eager) that is not one of
    ``experts``: a local TP region without experts inside its hooks, others whole if they
    hold no eager part, else around it in turn. A torch.nn layer stays eager: dynamo does not
    start a frame inside torch's own files, and ``fullgraph`` would refuse the empty result;
    so does an RMSNorm (models/norm.py: one fused kernel, nothing to fuse), which compiled
    alone would add one recompilation per instance (dynamo guards on the module)."""
    for child in module.children():
        if child in experts:
            continue
        if is_local_tp_region(child) and not _holds_experts(child, experts):
            child.forward = torch.compile(child.forward, fullgraph=True)
        elif _holds_eager_part(child, experts):
            _compile_around(child, experts)
        elif not (type(child).forward.__module__.startswith("torch.")
                  or isinstance(child, nn.RMSNorm)):
            child.compile(fullgraph=True)


def maybe_compile_loss(loss_fn: Callable, config: Compile) -> Callable:
    if config.enable and "loss" in config.components:
        return torch.compile(loss_fn)
    return loss_fn


def set_inductor_cache(config: Compile, meshes: Meshes) -> None:
    """Point inductor and Triton at persistent cache folders, keep Triton's autotuning results
    there, and keep one rank from loading code compiled for another rank's process groups.

    Folders: ``[compile] cache_dir`` holds inductor's cache and ``<cache_dir>/triton`` Triton's
    (torchao's blockwise and grouped-GEMM kernels compile there too); empty keeps torch's and
    Triton's defaults (``kernel_cache_dirs``). They are assigned, not defaulted: importing
    inductor already set its variable, and both libraries read them again at each access.
    This runs whether or not ``[compile]`` is on: the fused bf16-moment step and torchao's
    Triton kernels compile without it (components/first_step.py announces them).

    ``TRITON_CACHE_AUTOTUNING=1`` (unless set) makes Triton's autotuner store its choice per
    kernel and shape in its cache, so a rerun benchmarks nothing: torchao's blockwise FP8
    kernels try up to 45 configurations for every kernel and shape (132 s at step 1 of the
    debug model on an H200). Triton reads it when a kernel is defined, i.e. when torchao's
    kernel modules are imported, which happens after this (the converters import them).

    Compiled code bakes in the names of the process groups its collectives use (e.g. the loss
    on vocab-sharded DTensor logits under loss parallel). torch 2.13 keys the AOTAutograd cache
    of a DTensor input by its mesh, which all ranks describe identically, not by the rank's own
    groups (pytorch/pytorch#188390): with two TP groups, a rank of one loads the other's code
    and fails ("Could not resolve the process group registered under the name N"). Tagging
    the cache key with this rank's group names keeps entries apart exactly when those differ;
    the names are assigned in creation order, so a rerun of the same layout still hits.
    """
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    if config.cache_dir:
        root = os.path.abspath(config.cache_dir)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = root
        os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    if not config.enable:
        return
    groups = ",".join(group.group_name for group in meshes.dense.get_all_groups())
    user_tag = os.environ.get("TORCH_COMPILE_CACHE_KEY_TAG", "")
    torch.compiler.config.cache_key_tag = f"{user_tag}|process_groups={groups}"


def kernel_cache_dirs() -> tuple[str, str]:
    """(inductor's, Triton's) cache folder as this process will use them."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    triton = os.environ.get("TRITON_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".triton", "cache")
    return cache_dir(), triton
