"""Measured and modelled activation memory, for the benchmarks and the planner.

``measure_step_memory`` runs one forward/backward (optionally the optimizer step) under
``torch.distributed._tools.mem_tracker.MemTracker``, a dispatch mode that sees every tensor
storage and files it as Parameter, Buffer, Gradient, Activation, Temp (backward scratch),
Optstate or Other. That works on CPU, where neither RSS nor tracemalloc see torch's
allocations, and on CUDA alike. It reports the step's peak per category, the memory held when
forward returns, and what each transformer block's forward leaves allocated: the tensors it
saved for backward plus its output (the next block's input), which is what Korthikanti et al.
count per layer.

``korthikanti_activation_bytes`` is their per-layer model ("Reducing Activation Recomputation
in Large Transformer Models", 2022, Table 2, no tensor/sequence parallelism), for sequence s,
micro-batch b, hidden h and a heads, in bytes of 16-bit activations (plus 1-byte dropout masks):

    none       sbh (34 + 5as/h)   (5as^2b: attention scores, softmax, dropout of a*s*s each)
    selective  34 sbh             (the attention core is recomputed)
    full       2 sbh              (only the layer's input is kept)

Checkpointing every N-th layer averages ``full`` and ``none`` with weights 1/N and 1 - 1/N.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from enum import Enum

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

TOTAL = "Total"
"""The key of the sum over categories in a MemTracker snapshot."""


@dataclasses.dataclass
class StepMemory:
    """Bytes of one training step on one device, by MemTracker category (and ``Total``)."""

    peak: dict[str, int]
    """Every category at the moment the step's total was highest."""

    after_forward: dict[str, int]
    """Every category when forward (including the loss) has returned, before backward."""

    per_block: list[int]
    """Per block: activation bytes its forward left allocated (saved tensors + its output)."""

    @property
    def peak_total(self) -> int:
        return self.peak.get(TOTAL, 0)

    @property
    def peak_activations(self) -> int:
        """Activations and backward scratch at the peak: what checkpointing trades away."""
        return self.peak.get("Activation", 0) + self.peak.get("Temp", 0)


def by_category(snapshot: dict[torch.device, dict], device: torch.device) -> dict[str, int]:
    """One device's bytes by MemTracker category name, from a tracker snapshot."""
    categories = snapshot.get(torch.device(device), {})
    return {(k.value if isinstance(k, Enum) else str(k)): v for k, v in categories.items()}


def measure_step_memory(
    model: nn.Module,
    forward: Callable[[], torch.Tensor],
    *,
    device: torch.device,
    blocks: Sequence[nn.Module] = (),
    optimizer: torch.optim.Optimizer | None = None,
) -> StepMemory:
    """Run ``forward()`` (it returns the loss), its backward and ``optimizer.step()`` if given,
    under MemTracker; ``blocks`` are the modules whose forward footprint is reported.

    Gradients are set to None first, so the figures are those of a step in a training loop.
    One call measures one step (MemTracker follows a single iteration).
    """
    model.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    before: dict[int, int] = {}
    footprints = [0] * len(blocks)

    def activations() -> int:
        return by_category(tracker.get_tracker_snapshot(), device).get("Activation", 0)

    def pre_hook(index: int) -> Callable:
        return lambda _module, _args: before.__setitem__(index, activations())

    def post_hook(index: int) -> Callable:
        def hook(_module, _args, _output) -> None:
            footprints[index] = activations() - before[index]
        return hook

    handles = [h for i, block in enumerate(blocks)
               for h in (block.register_forward_pre_hook(pre_hook(i)),
                         block.register_forward_hook(post_hook(i)))]
    try:
        with tracker:
            loss = forward()
            for handle in handles:  # recomputation in backward must not overwrite the figures
                handle.remove()
            after_forward = by_category(tracker.get_tracker_snapshot(), device)
            loss.backward()
            if optimizer is not None:
                optimizer.step()
    finally:
        for handle in handles:
            handle.remove()
    return StepMemory(
        peak=by_category(tracker.get_tracker_snapshot("peak"), device),
        after_forward=after_forward,
        per_block=footprints,
    )


def korthikanti_activation_bytes(
    mode: str,
    *,
    seq_len: int,
    batch: int,
    dim: int,
    n_heads: int,
    every: int = 1,
    bytes_per_element: int = 2,
) -> float:
    """Activation bytes per layer for ``mode`` none | selective | full (``every`` N-th layer
    checkpointed for full), per the model above. The paper's figures are for 2-byte elements;
    other element sizes scale the whole expression (dropout masks included, an upper bound
    for models without dropout)."""
    sbh = seq_len * batch * dim
    none = sbh * (34 + 5 * n_heads * seq_len / dim)
    per_layer = {"none": none, "selective": 34 * sbh,
                 "full": 2 * sbh / every + none * (1 - 1 / every)}[mode]
    return per_layer * bytes_per_element / 2
