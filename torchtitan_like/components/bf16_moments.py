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

Three implementations of that step.

- ``Bf16MomentsAdam`` (any device; ``implementation = "foreach"`` or ``"for-loop"``): runs
  torch's own Adam/AdamW arithmetic (``torch.optim.adam.adam``, the functional form of
  ``torch.optim.Adam``/``AdamW``) on fp32 copies of the moments, a bounded chunk of parameters
  at a time (``CHUNK_ELEMENTS``), so the fp32 copies never hold more than one chunk: the
  persistent states are halved and the step adds at most 8 bytes x CHUNK_ELEMENTS.
- ``implementation = "fused"`` (or TorchTitan's ``"fused_opt_states_bf16"``) takes one of two
  fused paths, by torch version and device (``fused_path``):

  * **torch >= 2.13 on CUDA: torch's fused AdamW.** Its CUDA kernel has a mixed-precision
    functor (``FusedAdamMathFunctorMP``: fp32 params and grads, bf16 states, fp32 arithmetic),
    reached when the states exist in bf16 before its first step (a step pre-hook creates them,
    ``_create_bf16_states``) and ``_group_tensors_by_device_and_dtype`` groups by the
    parameters' dtype alone, as 2.13's does (checked on its CPU build; its headers hold the
    functor). It rounds to nearest. torch 2.11 refuses at that grouping ("Tensors of the same
    index must be on the same device and the same dtype except step tensors", seen on an
    H200); 2.12 is not checked and takes the compiled path. torch's CPU fused kernel has no
    mixed path ("expected scalar type Float but found BFloat16").
  * **Every other torch version and device: ``CompiledBf16MomentsAdam``**, the step above
    written once as a pointwise function over one parameter (``_adam_update``: read m, v, g,
    p; fp32 arithmetic; write p and the rounded m, v) and ``torch.compile``d with dynamic
    shapes over the flattened tensors: inductor fuses it into one kernel per parameter (a
    Triton kernel on CUDA, a C++ loop on CPU), with no fp32 copy of the moments in memory.
    One graph serves every parameter (the hyperparameters are graph inputs, not constants);
    its first compile takes seconds and is announced and cached (components/first_step.py).
    Its arithmetic is the foreach step's in another order, so the two differ by a few fp32
    ulps before rounding, and a stored moment may land on the other bf16 neighbour: each is
    within ``moment_deviation_bound`` of fp32 moments (the derivation below), so the two are
    within twice that of each other.

The deviation bound (``moment_deviation_bound``). Against fp32 moments on the same gradient
sequence (fixed, so no feedback through the parameters), the bf16 run's step t uses
m'_t = beta1 m~_{t-1} + (1 - beta1) g_t, where the stored m~_{t-1} is m'_{t-1} rounded to bf16
(half an ulp: <= 2^-8 |m'|); so e_t = m'_t - m_t obeys |e_t| <= beta1 (|e_{t-1}| + 2^-8
|m'_{t-1}|), |m'| <= |m| + |e|, and the same for v with beta2. The update u = lr (m/c1) /
(sqrt(v/c2) + eps) then moves by at most lr/c1 (|e_m| / D' + |m| |D - D'| / (D D')), with
D = sqrt(v/c2) + eps and D' its value at the worst v' in v +- |e_v|. Summed over the steps
(weight decay multiplies earlier differences by 1 - lr wd < 1, and both runs round their fp32
arithmetic, a few ulps of p per step: 8 x 2^-24 |p| each) this bounds |p_bf16 - p_fp32| per
element.

Checkpoints: every path keeps the moments as bf16 tensors, so DCP saves bf16. torch's
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

import functools
import shutil
from collections.abc import Iterable, Iterator

import torch
from torch.distributed.tensor import DTensor
from torch.optim.adam import adam as adam_arithmetic

from torchtitan_like.components.versions import torch_version

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


class CompiledBf16MomentsAdam(Bf16MomentsAdam):
    """The bf16-moment step as one compiled kernel per parameter (module docstring); the same
    states as ``Bf16MomentsAdam`` (bf16 moments, a CPU step counter), so checkpoints move
    between the two. Nearest rounding only."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float],
                 eps: float, weight_decay: float, decoupled_weight_decay: bool):
        super().__init__(params, lr, betas, eps, weight_decay, decoupled_weight_decay,
                         foreach=False)

    def _step_chunk(self, group: dict, params: list[torch.Tensor]) -> None:
        update = _compiled_update()
        beta1, beta2 = group["betas"]
        for p in params:
            state = self._state(p)
            state["step"] += 1
            t = state["step"].item()  # a CPU tensor: no device sync
            update(*(_flat(x) for x in (p, p.grad, state["exp_avg"], state["exp_avg_sq"])),
                   lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                   weight_decay=group["weight_decay"], step_size=group["lr"] / (1 - beta1**t),
                   bias_correction2_sqrt=(1 - beta2**t) ** 0.5,
                   decoupled=group["decoupled_weight_decay"])


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The local tensor (Adam is elementwise: any DTensor placement), flattened when it is
    contiguous so that one dynamic-shape graph serves every parameter."""
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.view(-1) if t.is_contiguous() else t


def _adam_update(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *,
                 lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                 step_size: float, bias_correction2_sqrt: float, decoupled: bool) -> None:
    """One Adam/AdamW step of one parameter from bf16 moments, in fp32, in place. Written
    without ``value=`` scalars (``addcdiv_``'s would pin each float into the graph)."""
    m32, v32 = m.float(), v.float()
    if decoupled:
        p.mul_(1 - lr * weight_decay)
    else:
        g = g + p * weight_decay
    m32 = m32 + (g - m32) * (1 - beta1)
    v32 = v32 * beta2 + g * g * (1 - beta2)
    p.sub_(m32 / (v32.sqrt() / bias_correction2_sqrt + eps) * step_size)
    m.copy_(m32.to(torch.bfloat16))
    v.copy_(v32.to(torch.bfloat16))


@functools.cache
def _compiled_update():
    """``_adam_update`` compiled once per process (dynamic shapes: one graph for all sizes)."""
    return torch.compile(_adam_update, dynamic=True, fullgraph=True)


FUSED_MIXED_PRECISION_TORCH = (2, 13)
"""The first torch whose CUDA fused Adam takes fp32 params with bf16 states (docstring)."""


def fused_path(device_type: str, torch_version: tuple[int, int]) -> str:
    """Which fused bf16-moment step runs: ``"torch"`` (torch's fused AdamW) or ``"compiled"``
    (``CompiledBf16MomentsAdam``), by device and torch (major, minor) (module docstring)."""
    if device_type == "cuda" and torch_version >= FUSED_MIXED_PRECISION_TORCH:
        return "torch"
    return "compiled"


def compiled_unsupported_reason(device_type: str, have_triton: bool,
                                have_compiler: bool) -> str | None:
    """Why torch.compile cannot build the compiled step here, or None (pure: tests pass any)."""
    if device_type == "cuda" and not have_triton:
        return "torch.compile needs Triton for CUDA kernels, and it is not installed"
    if device_type == "cpu" and not have_compiler:
        return "torch.compile's CPU backend needs a C++ compiler (g++ or clang++) on PATH"
    return None


def check_fused(device_type: str) -> str | None:
    """Why ``implementation = "fused"`` with bf16 moments cannot run on this machine."""
    if fused_path(device_type, torch_version()) == "torch":
        return None
    from torch.utils._triton import has_triton

    return compiled_unsupported_reason(
        device_type, device_type == "cuda" and has_triton(),
        any(shutil.which(cc) for cc in ("g++", "c++", "clang++")))


def moment_deviation_bound(grads: list[torch.Tensor], p0: torch.Tensor, lr: float,
                           betas: tuple[float, float], eps: float) -> torch.Tensor:
    """The module docstring's per-element bound on |p_bf16 - p_fp32| after ``grads``, in fp64."""
    b1, b2 = betas
    m = v = e_m = e_v = torch.zeros_like(p0, dtype=torch.float64)
    bound = torch.zeros_like(m)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        e_m = b1 * (e_m + 2**-8 * (m.abs() + e_m))
        e_v = b2 * (e_v + 2**-8 * (v + e_v))
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        c1, c2 = 1 - b1**t, 1 - b2**t
        d = (v / c2).sqrt() + eps
        d_worst = ((v - e_v).clamp(min=0) / c2).sqrt() + eps
        spread = ((v + e_v) / c2).sqrt() + eps - d_worst
        bound += lr / c1 * (e_m / d_worst + m.abs() * spread / (d * d_worst))
        bound += 8 * 2.0**-24 * p0.abs().double()
    return bound


def build_bf16_moments_adam(params: list[torch.Tensor] | list[dict], common: dict, name: str,
                            implementation: str, stochastic_rounding: bool
                            ) -> torch.optim.Optimizer:
    """Adam/AdamW (``name``) with bf16 moments in the configured implementation (validated):
    foreach/for-loop chunked, or a fused path (``fused_path``); ``params`` may be groups."""
    decoupled = name == "AdamW"
    if implementation not in ("fused", "fused_opt_states_bf16"):
        return Bf16MomentsAdam(params, **common, decoupled_weight_decay=decoupled,
                               foreach=implementation == "foreach",
                               stochastic_rounding=stochastic_rounding)
    first = next((p for g in params for p in (g["params"] if isinstance(g, dict) else [g])),
                 None)
    device = first.device.type if first is not None else "cpu"
    if fused_path(device, torch_version()) == "compiled":
        return CompiledBf16MomentsAdam(params, **common, decoupled_weight_decay=decoupled)
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    return fused_with_bf16_moments(cls(params, **common, fused=True))


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
