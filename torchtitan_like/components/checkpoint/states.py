"""The states a checkpoint holds, each a Stateful with a flat state dict (so DCP keys are
``<state>.<key>``): model, optimizer, JSON-encoded small states, and the train state with RNGs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from torchtitan_like.components.lr_scheduler import LRSchedulersContainer
from torchtitan_like.components.optimizer import OptimizersContainer


class ModelState:
    """The model parts as one state dict of plain-model FQNs (optionally cast on save)."""

    def __init__(self, parts: list[nn.Module], dtype: torch.dtype | None = None):
        self.parts = parts
        self.dtype = dtype

    def state_dict(self) -> dict[str, Any]:
        merged = {k: v for part in self.parts for k, v in get_model_state_dict(part).items()}
        if self.dtype is not None:
            merged = {k: v.to(self.dtype) for k, v in merged.items()}
        return merged

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Each part takes its own keys (a pipeline stage has only its modules).
        for part in self.parts:
            set_model_state_dict(part, state_dict, options=StateDictOptions(strict=False))


class OptimizerState:
    """One flattened optimizer state dict over all parts: keys name parameters by FQN."""

    _OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

    def __init__(self, parts: list[nn.Module], optimizers: OptimizersContainer):
        self.pairs = list(zip(parts, optimizers.optimizers, strict=True))

    def state_dict(self) -> dict[str, Any]:
        return {k: v for part, opt in self.pairs
                for k, v in get_optimizer_state_dict(part, opt, options=self._OPTIONS).items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part, opt in self.pairs:
            set_optimizer_state_dict(part, opt, state_dict, options=self._OPTIONS)


class JSONState:
    """A small Python state (scheduler, dataloader position) stored as one JSON string."""

    def __init__(self, get: Callable[[], Any], put: Callable[[Any], None]):
        self.get, self.put = get, put

    def state_dict(self) -> dict[str, Any]:
        return {"json": json.dumps(self.get())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.put(json.loads(state_dict["json"]))


def lr_scheduler_state(schedulers: LRSchedulersContainer) -> JSONState:
    def put(state: dict[str, Any]) -> None:
        for scheduler in schedulers.schedulers:
            scheduler.load_state_dict(dict(state))

    return JSONState(lambda: schedulers.schedulers[0].state_dict(), put)


class TrainState:
    """The owner's ``state_dict`` (step, tokens seen) plus this rank's RNG states."""

    def __init__(self, owner: Any, rank: int, device: torch.device):
        self.owner, self.rank, self.device = owner, rank, device
        # Set by the loader: whose RNG states to load, and whether the checkpoint has CUDA's
        # (not when it was saved on CPU).
        self.rng_source = rank
        self.device_rng = device.type == "cuda"

    def state_dict(self) -> dict[str, Any]:
        state = {**self.owner.state_dict(), f"rng_cpu.rank{self.rng_source}": torch.get_rng_state()}
        if self.device_rng:
            state[f"rng_cuda.rank{self.rng_source}"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        rng = {k: state_dict.pop(k) for k in list(state_dict) if k.startswith("rng_")}
        self.owner.load_state_dict(state_dict)
        torch.set_rng_state(rng[f"rng_cpu.rank{self.rng_source}"])
        if self.device_rng:
            torch.cuda.set_rng_state(rng[f"rng_cuda.rank{self.rng_source}"], self.device)
