"""HuggingFace stores routed experts one tensor per expert (``mlp.experts.<j>.gate_proj``);
GroupedExperts stacks them (``moe.experts.w1`` of shape [E, ...]). The two directions, shared by
every model family's HF adapter."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch.distributed.tensor import DTensor

STACKED_TO_HF = {"moe.experts.w1": "gate_proj", "moe.experts.w2": "down_proj",
                 "moe.experts.w3": "up_proj"}
_HF_TO_STACKED = {v: k for k, v in STACKED_TO_HF.items()}
_HF_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate_proj|down_proj|up_proj)\.weight")


def split_experts(layer: str, name: str, stacked: Any, sharded_hint: str) -> dict[str, Any]:
    """``layers.<layer>.<name>`` (a stacked experts weight) -> one HF tensor per expert (views,
    so loading into them fills the stacked tensor in place). A sharded (DTensor) weight cannot
    be split by expert here: ValueError with ``sharded_hint``."""
    if isinstance(stacked, DTensor):
        raise ValueError(f"layers.{layer}.{name} is sharded; {sharded_hint}")
    return {f"model.layers.{layer}.mlp.experts.{j}.{STACKED_TO_HF[name]}.weight": stacked[j]
            for j in range(stacked.shape[0])}


def collect_expert(layer: str, hf_name: str, value: Any,
                   experts: dict[str, dict[int, Any]]) -> bool:
    """If ``hf_name`` (inside ``model.layers.<layer>.``) is one expert's weight, file it under
    our stacked name in ``experts`` and return True."""
    m = _HF_EXPERT.fullmatch(hf_name)
    if m is None:
        return False
    experts.setdefault(f"layers.{layer}.{_HF_TO_STACKED[m.group(2)]}", {})[int(m.group(1))] = value
    return True


def stack_experts(experts: dict[str, dict[int, Any]]) -> dict[str, torch.Tensor]:
    """The collected per-expert tensors stacked in expert order (0..E-1, none missing)."""
    out = {}
    for ours, per_expert in experts.items():
        if sorted(per_expert) != list(range(len(per_expert))):
            raise ValueError(f"{ours}: HF experts {sorted(per_expert)} are not 0..E-1")
        out[ours] = torch.stack([per_expert[j] for j in range(len(per_expert))])
    return out
