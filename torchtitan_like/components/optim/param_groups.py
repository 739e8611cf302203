"""Parameter groups by rule, the same for every optimizer and every layout.

Each parameter of a model part falls in one kind (registry.GROUP_KINDS), decided by where it
sits and its rank, never by its name:

- ``matrix``: a weight of two or more dims inside a block group (each top-level
  ``nn.ModuleDict`` keyed "0", "1", ...: the trunk, a multi-token-prediction group;
  distributed/plan_check.py). These are the hidden layers Muon orthogonalizes (Keller Jordan:
  "Muon should only be used for hidden weight layers"); a 3-D routed-expert stack is a batch
  of such matrices, one per expert.
- ``other``: every other weight of two or more dims: token and position embeddings, the output
  head (outside the blocks; AdamW in Muon's split, as in Moonlight), and a weight the blocks
  share with a module outside them (an embedding a multi-token-prediction block reuses).
- ``no_decay``: one-dim parameters, the norm gains and biases (no weight decay: GPT-3,
  Llama).

The rule reads module structure that pipeline splitting, TP, EP and FSDP keep (stages keep
the group's name and their blocks' keys; sharded parameters keep their global shape), so a
parameter has one kind under every layout. The optimizer's ``group_options`` give each kind its
options; kinds with equal options share one group, in kind order. Groups are never empty (DCP
cannot load one), so pipeline stages may hold different groups: each stage's LR scheduler keeps
its own base lrs (components/checkpoint/states.py).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from torchtitan_like.components.optim.registry import (
    GROUP_KINDS,
    MATRIX,
    NO_DECAY,
    OTHER,
    GroupOptions,
)
from torchtitan_like.distributed.plan_check import block_groups


def parameter_kinds(part: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Each kind's parameters of ``part``, in model order (a tied weight once)."""
    groups = block_groups(part)
    in_blocks = {id(p) for group in groups.values() for p in group.parameters()}
    in_blocks -= {id(p) for name, child in part.named_children() if name not in groups
                  for p in child.parameters()}
    in_blocks -= {id(p) for p in part.parameters(recurse=False)}
    kinds: dict[str, list[nn.Parameter]] = {kind: [] for kind in GROUP_KINDS}
    for p in part.parameters():
        kind = NO_DECAY if p.ndim < 2 else MATRIX if id(p) in in_blocks else OTHER
        kinds[kind].append(p)
    return kinds


def param_groups(part: nn.Module, options: GroupOptions) -> list[dict[str, Any]]:
    """The parameter groups of ``part``: one per distinct options, kinds in GROUP_KINDS order,
    each ``{"params": [...], **options}``, none empty."""
    groups: list[dict[str, Any]] = []
    for kind, params in parameter_kinds(part).items():
        if not params:
            continue
        same = next((g for g in groups
                     if {k: v for k, v in g.items() if k != "params"} == dict(options[kind])),
                    None)
        if same is None:
            groups.append({"params": params, **options[kind]})
        else:
            same["params"] = [*same["params"], *params]
    return groups
