"""Adam/AdamW with bf16 moments: DeepSeek-V3's optimizer states (``[optimizer] state_dtype =
"bfloat16"``).

DeepSeek-V3 (technical report, section 3.3.1) keeps the master weights and the gradients in
fp32 but stores AdamW's first and second moments in bf16: 2 + 2 bytes per parameter instead of
4 + 4. Each step reads the stored moments, computes the new ones and the update in fp32, and
rounds only what it stores:

    m32, v32 = fp32(m), fp32(v)
    m32 = beta1 m32 + (1 - beta1) g ;  v32 = beta2 v32 + (1 - beta2) g^2      (fp32)
    p -= lr (m32 / (1 - beta1^t)) / (sqrt(v32 / (1 - beta2^t)) + eps)       (+ weight decay)
    m, v = bf16(m32), bf16(v32)          nearest, or stochastic (unbiased) rounding

Two implementations of that step.

- ``Bf16MomentsAdam`` (any device; ``implementation = "foreach"`` or ``"for-loop"``): runs
  torch's own Adam/AdamW arithmetic (``torch.optim.adam.adam``, the functional form of
  ``torch.optim.Adam``/``AdamW``) on fp32 copies of the moments, a bounded chunk of parameters
  at a time (``CHUNK_ELEMENTS``), so the fp32 copies never hold more than one chunk: the
  persistent states are halved and the step adds at most 8 bytes x CHUNK_ELEMENTS.
- torch's fused AdamW on CUDA (``implementation = "fused"`` or TorchTitan's
  ``"fused_opt_states_bf16"``): its CUDA kernel has a mixed-precision path for fp32 params with
  bf16 moments, taken when the states exist in bf16 before its first step; a step pre-hook
  creates them (``_create_bf16_states``). It rounds to nearest. **Not run yet**: no GPU was lent
  to this project's sessions.

Checkpoints: both keep the moments as bf16 tensors, so DCP saves bf16. torch's
``Optimizer.load_state_dict`` casts every floating state to its parameter's dtype (fp32 here);
a load post-hook casts ``exp_avg``/``exp_avg_sq`` back to bf16, exactly (the values are bf16
numbers), so a resumed run continues bitwise (the load briefly holds fp32 copies).

Stochastic rounding (``state_stochastic_rounding``, foreach only) adds 16 uniformly random low
bits to each fp32 value's bit pattern and truncates to bf16: E[bf16(x)] = x, so moments that
change by less than half a bf16 ulp per step still move on average (nearest rounding would
keep them). Its random bits come from torch's default generator of the parameter's device,
which checkpoints save and restore, so resumption stays bitwise; they depend on the layout
(each rank draws for its own shard), so runs under different layouts differ by the rounding.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.distributed.tensor import DTensor
from torch.optim.adam import adam as adam_arithmetic

MOMENTS = ("exp_avg", "exp_avg_sq")
CHUNK_ELEMENTS = 1 << 24
"""Parameter elements per fp32 working copy of the moments (16 Mi: 128 MiB of copies)."""


def round_to_bf16(x: torch.Tensor, stochastic: bool) -> torch.Tensor:
    """fp32 ``x`` -> bf16: to nearest (even), or stochastically: P(round up) = the remainder's
    share of the ulp, so the rounding is unbiased."""
    if not stochastic:
        return x.to(torch.bfloat16)
    if isinstance(x, DTensor):
        local = round_to_bf16(x.to_local(), stochastic)
        return DTensor.from_local(local, x.device_mesh, x.placements, run_check=False,
                                  shape=x.shape, stride=x.stride())
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint_like(bits, 0, 1 << 16)
    return ((bits + noise) & -(1 << 16)).view(torch.float32).to(torch.bfloat16)


def _chunks(params: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    chunk: list[torch.Tensor] = []
    size = 0
    for p in params:
        if chunk and size + p.numel() > CHUNK_ELEMENTS:
            yield chunk
            chunk, size = [], 0
        chunk.append(p)
        size += p.numel()
    if chunk:
        yield chunk


class Bf16MomentsAdam(torch.optim.Optimizer):
    """Adam (``decoupled_weight_decay=False``) or AdamW with bf16 moments (module docstring)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float],
                 eps: float, weight_decay: float, decoupled_weight_decay: bool, foreach: bool,
                 stochastic_rounding: bool = False):
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "decoupled_weight_decay": decoupled_weight_decay, "foreach": foreach,
                    "stochastic_rounding": stochastic_rounding}
        super().__init__(params, defaults)
        keep_bf16_moments(self)

    def _state(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            for name in MOMENTS:
                state[name] = torch.zeros_like(p, dtype=torch.bfloat16,
                                               memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for chunk in _chunks([p for p in group["params"] if p.grad is not None]):
                self._step_chunk(group, chunk)
        return loss

    def _step_chunk(self, group: dict, params: list[torch.Tensor]) -> None:
        states = [self._state(p) for p in params]
        moments = {name: [s[name].float() for s in states] for name in MOMENTS}
        beta1, beta2 = group["betas"]
        adam_arithmetic(
            params, [p.grad for p in params], moments["exp_avg"], moments["exp_avg_sq"], [],
            [s["step"] for s in states], foreach=group["foreach"],
            decoupled_weight_decay=group["decoupled_weight_decay"], amsgrad=False,
            beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
            eps=group["eps"], maximize=False)
        for name in MOMENTS:
            for state, value in zip(states, moments[name], strict=True):
                state[name].copy_(round_to_bf16(value, group["stochastic_rounding"]))


def _cast_moments_to_bf16(optimizer: torch.optim.Optimizer) -> None:
    """Load post-hook: ``load_state_dict`` cast the moments to the params' dtype; undo it."""
    for state in optimizer.state.values():
        for name in MOMENTS:
            if name in state and state[name].dtype != torch.bfloat16:
                state[name] = state[name].to(torch.bfloat16)


def keep_bf16_moments(optimizer: torch.optim.Optimizer) -> None:
    """Loading a state dict into ``optimizer`` keeps its moments bf16 (module docstring)."""
    optimizer.register_load_state_dict_post_hook(_cast_moments_to_bf16)


def _create_bf16_states(optimizer: torch.optim.Optimizer, _args, _kwargs) -> None:
    """Step pre-hook of torch's fused AdamW: the states its first step would create in fp32,
    created in bf16 (the step counter as fused keeps it: fp32 on the parameter's device)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None and not optimizer.state[p]:
                optimizer.state[p]["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                for name in MOMENTS:
                    optimizer.state[p][name] = torch.zeros_like(
                        p, dtype=torch.bfloat16, memory_format=torch.preserve_format)


def fused_with_bf16_moments(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """torch's fused Adam/AdamW (CUDA) keeping its moments in bf16 (module docstring)."""
    optimizer.register_step_pre_hook(_create_bf16_states)
    keep_bf16_moments(optimizer)
    return optimizer
