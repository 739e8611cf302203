"""Weights tied across pipeline stages: one parameter of the model, a copy on each stage using it.

A model ties two modules to one weight by sharing a module (a multi-token-prediction head keeps
a reference to the trunk's embedding, ``self.embed = embedding``): the unsplit model reaches one
Parameter under two names, e.g. ``tok_emb.weight`` and ``mtp.0.embed.weight``, and autograd sums
both uses into its gradient. The pipeline split (``pipeline.prune_to_stage``, a deep copy per
stage) gives every stage that keeps one of the modules a copy of its own, as Megatron-LM keeps
the word embeddings on its first and last stages (its "embedding group"). The copies stay one
weight:

- they start equal: the layout-independent init (``utils.init_weights``) fills every name from
  one reference state dict on CPU; on GPUs, where stages initialise with their own seeds, the
  lowest holding stage's copy is broadcast to the others (``sync_weights``);
- after each step's backward, before clipping, their gradients are summed over the stages that
  hold a copy (``reduce_gradients``: an all-reduce over the holders' ranks of each pipeline
  line, plus a local sum where one rank holds two, as V-shaped schedules place the first and the
  last stage together). Every copy then gets the one-process gradient, and the optimizer, whose
  update is element-wise, moves equal copies with equal states identically: they stay bitwise
  equal by construction;
- the gradient norm counts the weight once (``copies``: the copies off the lowest holding stage
  are clipped but not counted), and checkpoints store it once, under its first name
  (``aliases``, components/checkpoint/states.py), so a checkpoint moves between layouts.

Every copy must be parallelized alike (the same placements over meshes of the same dims): the
same local shard then holds the same elements on every holding stage; otherwise the job is
refused at the build.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from torchtitan_like.config.errors import ConfigError

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """Every further name of a parameter the model reaches under several, mapped to its first
    name (registration order): ``{"mtp.0.embed.weight": "tok_emb.weight"}``."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return {alias: first for first, *rest in names.values() for alias in rest}


def plain_name(name: str) -> str:
    """A parameter's name in the unwrapped model (activation checkpointing and compile wrap
    modules in place and add a prefix to the names below them)."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


@dataclasses.dataclass
class _Tied:
    """One tied weight as this rank sees it."""

    name: str
    """Its first name (the checkpoint key)."""
    local: list[nn.Parameter]
    """This rank's copies (one per model part holding it), the lowest stage's first."""
    holders: list[int]
    """Pipeline ranks holding a copy."""
    group: dist.ProcessGroup | None = None
    """The holders of this rank's pipeline line; None when this rank is the only holder."""
    source: int = 0
    """Global rank, on this line, of the lowest holding stage (the broadcast's source)."""
    copies: list[nn.Parameter] = dataclasses.field(default_factory=list)
    """The local copies not on the lowest holding stage."""


def _layout(parameter: nn.Parameter) -> tuple:
    """What must agree between copies: shape, mesh dims, placements."""
    if isinstance(parameter, DTensor):
        return (tuple(parameter.shape), parameter.device_mesh.mesh_dim_names,
                tuple(str(p) for p in parameter.placements))
    return (tuple(parameter.shape), None, None)


class TiedWeights:
    """This rank's copies of weights tied across pipeline stages (module docstring)."""

    def __init__(self, model_name: str, aliases: dict[str, str], parts: list[nn.Module],
                 stage_ids: list[int], pp: DeviceMesh, dense: DeviceMesh):
        self.aliases = aliases
        self.tied: list[_Tied] = []
        if not aliases or pp.size() == 1:
            return
        mine = self._local_copies(parts, stage_ids)
        gathered: list[dict] = [{} for _ in range(pp.size())]
        dist.all_gather_object(gathered, {name: [(s, _layout(p)) for s, p in held]
                                          for name, held in mine.items()},
                               group=pp.get_group())
        for name in sorted({n for held in gathered for n in held}):
            stages = sorted((s, layout, rank) for rank, held in enumerate(gathered)
                            for s, layout in held.get(name, []))
            if len({s for s, _, _ in stages}) < 2:
                continue  # tied inside one stage: one Parameter already
            if len({layout for _, layout, _ in stages}) > 1:
                raise ConfigError(
                    f"model {model_name!r}: the weight {name} is tied across pipeline stages "
                    f"{[s for s, _, _ in stages]} but parallelized differently there "
                    f"({'; '.join(sorted({str(layout) for _, layout, _ in stages}))}); give "
                    "every module sharing it the same plan")
            local = [p for _, p in mine.get(name, [])]
            tied = _Tied(name, local, sorted({rank for _, _, rank in stages}))
            tied.source = pp.mesh.tolist()[stages[0][2]]
            tied.copies = [p for s, p in mine.get(name, []) if s != stages[0][0]]
            self.tied.append(tied)
        self._build_groups(pp, dense)

    def _local_copies(self, parts: list[nn.Module], stage_ids: list[int]
                      ) -> dict[str, list[tuple[int, nn.Parameter]]]:
        """first name -> [(stage, this part's Parameter)] for the tied weights parts hold."""
        held: dict[str, list[tuple[int, nn.Parameter]]] = {}
        firsts = set(self.aliases.values())
        for stage, part in zip(stage_ids, parts, strict=True):
            seen: set[int] = set()
            for name, parameter in part.named_parameters(remove_duplicate=False):
                first = self.aliases.get(plain_name(name), plain_name(name))
                if first in firsts and id(parameter) not in seen:
                    seen.add(id(parameter))
                    held.setdefault(first, []).append((stage, parameter))
        return held

    def _build_groups(self, pp: DeviceMesh, dense: DeviceMesh) -> None:
        """One process group per pipeline line and holder set (every process creates every
        group, in the same order, as ``dist.new_group`` requires); the pp group itself when
        every pipeline rank holds a copy."""
        lines = dense.mesh.reshape(pp.size(), -1).T.tolist()  # dense dims: pp outermost
        made: dict[tuple[int, ...], dist.ProcessGroup | None] = {}
        for tied in self.tied:
            key = tuple(tied.holders)
            if key not in made:
                if len(key) == 1:
                    made[key] = None
                elif len(key) == pp.size():
                    made[key] = pp.get_group()
                else:
                    me = dist.get_rank()
                    for line in lines:
                        group = dist.new_group([line[r] for r in key])
                        if me in [line[r] for r in key]:
                            made[key] = group
            tied.group = made.get(key)

    @property
    def copies(self) -> set[nn.Parameter]:
        """This rank's copies the gradient norm must not count again."""
        return {p for tied in self.tied for p in tied.copies}

    @staticmethod
    def _local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Sum every tied weight's gradient over its copies (after backward, before clipping)."""
        for tied in self.tied:
            if not tied.local:
                continue
            for p in tied.local:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            grads = [self._local(p.grad) for p in tied.local]
            total = grads[0] if len(grads) == 1 else torch.stack(grads).sum(0)
            if tied.group is not None:
                total = total.clone()
                dist.all_reduce(total, group=tied.group)
            for grad in grads:
                grad.copy_(total)

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Give every copy the lowest holding stage's values (after the initialisation)."""
        for tied in self.tied:
            if not tied.local:
                continue
            first = self._local(tied.local[0])
            if tied.group is not None:
                dist.broadcast(first, src=tied.source, group=tied.group)
            for other in tied.local[1:]:
                self._local(other).copy_(first)
