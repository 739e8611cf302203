"""The states a checkpoint holds, each a Stateful with a flat state dict (so DCP keys are
``<state>.<key>``): model, optimizer, JSON-encoded small states, and the train state with RNGs."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
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


def _to_first_names(state: dict[str, Any], aliases: Mapping[str, str]) -> dict[str, Any]:
    """Keys naming a tied weight's further names renamed to its first (a stage's copy saves
    and loads under that name; where one part holds both names they are one tensor)."""
    return {_first_name(key, aliases): value for key, value in state.items()}


def _first_name(key: str, aliases: Mapping[str, str]) -> str:
    """``key`` with a further name of a tied weight replaced by its first: the key itself, or
    inside a flattened optimizer key (``state.<fqn>.<field>``, ``param_groups.<fqn>.<field>``)."""
    if key in aliases:
        return aliases[key]
    section, _, rest = key.partition(".")
    for alias, first in aliases.items():
        if rest.startswith(alias + "."):
            return f"{section}.{first}{rest[len(alias):]}"
    return key


def _with_further_names(state: dict[str, Any], part_keys: list[str],
                        aliases: Mapping[str, str]) -> dict[str, Any]:
    """``state`` (first names) plus the entries a part names by further names."""
    extra = {key: state[_first_name(key, aliases)] for key in part_keys
             if key not in state and _first_name(key, aliases) in state}
    return {**state, **extra}


class ModelState:
    """The model parts as one state dict of plain-model FQNs (optionally cast on save); a
    weight tied across pipeline stages appears once, under its first name (``aliases``:
    further name -> first, distributed/tied_weights.py)."""

    def __init__(self, parts: list[nn.Module], dtype: torch.dtype | None = None,
                 aliases: Mapping[str, str] | None = None):
        self.parts = parts
        self.dtype = dtype
        self.aliases = dict(aliases or {})

    def state_dict(self) -> dict[str, Any]:
        merged = _to_first_names({k: v for part in self.parts
                                  for k, v in get_model_state_dict(part).items()}, self.aliases)
        if self.dtype is not None:
            merged = {k: v.to(self.dtype) for k, v in merged.items()}
        return merged

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Each part takes its own keys (a pipeline stage has only its modules).
        for part in self.parts:
            own = _with_further_names(state_dict, list(get_model_state_dict(part)), self.aliases)
            set_model_state_dict(part, own, options=StateDictOptions(strict=False))


class OptimizerState:
    """One flattened optimizer state dict over all parts: keys name parameters by FQN (a
    tied weight's copies by its first name, as in ``ModelState``)."""

    _OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

    def __init__(self, parts: list[nn.Module], optimizers: OptimizersContainer,
                 aliases: Mapping[str, str] | None = None):
        self.pairs = list(zip(parts, optimizers.optimizers, strict=True))
        self.aliases = dict(aliases or {})

    def state_dict(self) -> dict[str, Any]:
        return _to_first_names({k: v for part, opt in self.pairs for k, v in
                                get_optimizer_state_dict(part, opt, options=self._OPTIONS).items()},
                               self.aliases)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part, opt in self.pairs:
            keys = list(get_optimizer_state_dict(part, opt, options=self._OPTIONS))
            own = _with_further_names(state_dict, keys, self.aliases)
            set_optimizer_state_dict(part, opt, own, options=self._OPTIONS)


class JSONState:
    """A small Python state (scheduler, dataloader position) stored as one JSON string."""

    def __init__(self, get: Callable[[], Any], put: Callable[[Any], None]):
        self.get, self.put = get, put

    def state_dict(self) -> dict[str, Any]:
        return {"json": json.dumps(self.get())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.put(json.loads(state_dict["json"]))


def lr_scheduler_state(schedulers: LRSchedulersContainer) -> JSONState:
    """The schedule's position, saved once (every part's scheduler is at the same step). Each
    scheduler keeps its own base lrs on load: one per parameter group of its part, and parts
    may hold different groups (a pipeline stage without embedding or head has no such group,
    components/optim/param_groups.py)."""

    def put(state: dict[str, Any]) -> None:
        for scheduler in schedulers.schedulers:
            scheduler.load_state_dict({**state, "base_lrs": scheduler.base_lrs})

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
