"""Muon on the hidden matrices and AdamW on the rest, as ONE torch optimizer.

Muon (Keller Jordan, 2024; at scale: Liu et al., 2025, "Muon is Scalable for LLM Training",
Moonlight) replaces a matrix's update by the nearest semi-orthogonal matrix of its momentum.
Per matrix W (m x n) with gradient G, torch.optim.Muon's step, whose functions are called here:

    B <- B + (1 - mu)(G - B)                       momentum (torch: buf.lerp_(grad, 1 - mu))
    U  = G + mu (B - G)  if nesterov, else B       (torch: grad.lerp(buf, mu))
    O  = NS_k(U)                                   k Newton-Schulz steps (newton_schulz.py)
    W <- W (1 - lr wd) - lr s(m, n) O              s = torch's _adjust_lr rule:
                                                   match_rms_adamw: 0.2 sqrt(max(m, n))
                                                   original: sqrt(max(1, m / n))

``match_rms_adamw`` (Moonlight's) scales O, whose RMS is about 1/sqrt(max(m, n)), to AdamW's
typical update RMS of 0.2, so AdamW's lr and weight decay transfer (``[muon] lr = 0`` takes
``[optimizer] lr``). A routed-expert stack [E, m, n] is E matrices, each its own step (s from
its m x n). Under a layout the update of a matrix sharded over ranks is orthogonalized whole,
by one owner rank (newton_schulz.py): the step is the one-process step on the same gradients.

The rest of the parameters (embeddings, output head: the ``other`` groups; norms and biases:
``no_decay``; components/optim/param_groups.py) is stepped by the platform's AdamW built from
``[optimizer]`` (components/optimizer.py: foreach, fused, bf16 moments), with its own lr. It
shares this optimizer's group dicts and state: the LR schedule scales every group, the state
dict and DCP hold both sides' states (``momentum_buffer``; ``exp_avg``, ``exp_avg_sq``,
``step``), torchft's commit gates the one ``step()``, step hooks see one optimizer. After a
load (which replaces the group dicts and the state) the AdamW side is linked to the new ones
and its own load hooks run (bf16 moments cast back to bf16).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.optim._muon import _adjust_lr

from torchtitan_like.components.optim.newton_schulz import Iteration, orthogonalize
from torchtitan_like.components.optim.registry import (
    MATRIX,
    NO_DECAY,
    OTHER,
    GroupOptions,
    OptimizerSpec,
    StateFootprint,
)
from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.optimization import Muon as MuonConfig
from torchtitan_like.config.optimization import Optimizer as OptimizerConfig

BuildAdamW = Callable[[list[dict[str, Any]]], torch.optim.Optimizer]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``tensor`` (the tensor itself when it is not a DTensor)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class Muon(torch.optim.Optimizer):
    """Groups with ``muon = True`` take Muon's step, the others AdamW's (module docstring).

    ``orthogonalized`` counts the matrices this rank has run the iteration on."""

    def __init__(self, groups: list[dict[str, Any]], *, lr: float, momentum: float,
                 nesterov: bool, weight_decay: float, adjust_lr_fn: str, iteration: Iteration,
                 adamw: BuildAdamW):
        defaults = {"lr": lr, "momentum": momentum, "nesterov": nesterov,
                    "weight_decay": weight_decay, "adjust_lr_fn": adjust_lr_fn, "muon": False}
        super().__init__(groups, defaults)
        self.iteration = iteration
        self.orthogonalized = 0
        others = [group for group in self.param_groups if not group["muon"]]
        self.adamw = adamw(others) if others else None
        self._link_adamw()
        self.register_load_state_dict_post_hook(Muon._after_load)

    def _link_adamw(self) -> None:
        """The AdamW side steps this optimizer's own group dicts and state."""
        if self.adamw is not None:
            self.adamw.param_groups = [g for g in self.param_groups if not g["muon"]]
            self.adamw.state = self.state

    def _after_load(self) -> None:
        self._link_adamw()
        if self.adamw is not None:  # what loading the AdamW side itself would have run
            for hook in self.adamw._optimizer_load_state_dict_post_hooks.values():
                hook(self.adamw)

    @torch.no_grad()
    def step(self, closure=None):
        with torch.enable_grad():
            loss = closure() if closure is not None else None
        for group in self.param_groups:
            if group["muon"]:
                self._muon_step(group)
        if self.adamw is not None:
            self.adamw.step()
        return loss

    def _muon_step(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        momentum, updates = group["momentum"], []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(
                    p.grad, memory_format=torch.preserve_format)
            buf, grad = _local(state["momentum_buffer"]), _local(p.grad)
            buf.lerp_(grad, 1 - momentum)
            updates.append(grad.lerp(buf, momentum) if group["nesterov"] else buf)
        orthogonal, count = orthogonalize(params, updates, self.iteration)
        self.orthogonalized += count
        lr, decay = group["lr"], group["weight_decay"]
        for p, update in zip(params, orthogonal, strict=True):
            weight = _local(p)
            weight.mul_(1 - lr * decay)
            weight.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape[-2:]))


def group_options(job: JobConfig) -> GroupOptions:
    """Muon on the matrices (``[muon]``), AdamW on the rest (``[optimizer]``), no weight
    decay on norms and biases."""
    adam, muon = job.optimizer, job.muon
    return {MATRIX: {"muon": True, "lr": muon.lr or adam.lr, "weight_decay": muon.weight_decay},
            OTHER: {"muon": False, "lr": adam.lr, "weight_decay": adam.weight_decay},
            NO_DECAY: {"muon": False, "lr": adam.lr, "weight_decay": 0.0}}


def footprint(job: JobConfig) -> StateFootprint:
    """One momentum per matrix element, in the parameters' dtype; AdamW's two moments on the
    rest; ``ns_steps`` iterations per matrix."""
    return StateFootprint(matrix_states=1, other_states=2,
                          matrix_state_bytes=DTYPES[job.training.dtype].itemsize,
                          newton_schulz_steps=job.muon.ns_steps,
                          newton_schulz_bytes=DTYPES[job.muon.ns_dtype].itemsize)


def muon_spec(build_adamw: Callable[[list[dict[str, Any]], OptimizerConfig],
                                    torch.optim.Optimizer]) -> OptimizerSpec:
    """The registry entry of Muon, its AdamW side built by ``build_adamw`` (components/
    optimizer.py's, from ``[optimizer]``)."""

    def build(groups: list[dict[str, Any]], job: JobConfig) -> Muon:
        muon, adamw = job.muon, dataclasses.replace(job.optimizer, name="AdamW")
        return Muon(groups, lr=muon.lr or job.optimizer.lr, momentum=muon.momentum,
                    nesterov=muon.nesterov, weight_decay=muon.weight_decay,
                    adjust_lr_fn=muon.adjust_lr_fn,
                    iteration=Iteration(muon.ns_steps, DTYPES[muon.ns_dtype]),
                    adamw=lambda others: build_adamw(others, adamw))

    return OptimizerSpec("Muon", build, group_options=group_options, section="muon",
                         config_cls=MuonConfig, footprint=footprint)
