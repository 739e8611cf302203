"""Loss and metric hooks: a model adds loss terms and reports scalars for a training step.

A module that contributes declares ``self.step_hooks = None`` in ``__init__``; after
parallelization the trainer gives every such module its ``StepHooks`` (``attach_step_hooks``).
In forward:

    if self.step_hooks is not None:
        h = self.step_hooks.add_loss("z_loss", h, coef * (logsumexp(h) ** 2).sum())
        self.step_hooks.record_metric("max_logit", h.detach().amax(), reduce="max")

With no hooks attached (plain use of the model) the module behaves as a plain module.

Why a carrier. The step's training objective is L = (1/T) sum (ce + aux) over every token of the
step (T: the step's labelled tokens, protocols/loss.py). The cross-entropy reaches L through
the logits; an auxiliary term computed inside a block may sit on another pipeline stage than
the loss, inside a checkpointed or a compiled region. ``add_loss`` therefore does not add the
term to any value: it returns the block's hidden state (the *carrier*) through an autograd
function that is the identity forward and, in backward, also sends the gradient 1/T into the
term. Whenever the carrier's gradient is computed (the term's block lies on the path to the
loss), the term's parameters receive exactly d(term_sum / T)/d(theta), which is the gradient of
adding term_sum / T to the loss. Activation checkpointing recomputes the forward only to
rebuild saved tensors, so the term still enters backward once; its logged value is not counted
again (see ``recomputing``). The logged ``loss`` stays the cross-entropy; each term is logged as
``aux_loss/<name>``, sum over microbatches and ranks of term_sum / T, so both are
layout-independent.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

REDUCTIONS = ("sum", "max", "mean")


class _AddLossGradient(torch.autograd.Function):
    """Identity on ``carrier``; backward also gives ``term_sum`` the gradient ``scale``."""

    @staticmethod
    def forward(ctx, carrier: torch.Tensor, term_sum: torch.Tensor,
                scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(scale)
        ctx.term_shape = term_sum.shape
        return carrier.view_as(carrier)

    @staticmethod
    def backward(ctx, grad_carrier: torch.Tensor):
        (scale,) = ctx.saved_tensors
        return grad_carrier, scale.expand(ctx.term_shape), None


def recomputing() -> bool:
    """True while autograd runs a backward pass, i.e. while activation checkpointing recomputes
    a forward. Compiled code replays only tensor ops in its recomputation, never this Python,
    so under torch.compile the answer is False (and the call is not traced)."""
    if torch.compiler.is_compiling():
        return False
    return torch._C._current_graph_task_id() != -1


@dataclass
class _Metric:
    reduce: str
    total: torch.Tensor
    count: int = 1
    derive: Callable[[torch.Tensor], float] | None = None
    console: bool = True


@dataclass
class StepHooks:
    """One per Trainer. Lets model modules add loss terms and report metrics for a step.

    The trainer opens a step with ``begin_step(global_tokens)``, runs the forward of each
    microbatch inside ``recording()``, closes the step with ``end_step()``, and at log steps
    calls ``reduce`` for the values to log. Loss terms take effect in every forward of an open
    step; values are recorded only inside ``recording()`` and outside recomputation, so a
    pipeline's metadata-inference forward and activation checkpointing's recomputation are not
    counted. Outside a step (validation, plain inference) both hooks do nothing.
    """

    _scale: torch.Tensor | None = None
    _recording: bool = False
    _aux: dict[str, torch.Tensor] = field(default_factory=dict)
    _metrics: dict[str, _Metric] = field(default_factory=dict)
    _loss_copies: int = 1
    _sequence_meshes: tuple[DeviceMesh, ...] = ()
    _unreduced_meshes: tuple[DeviceMesh, ...] = ()

    def begin_step(self, global_tokens: torch.Tensor) -> None:
        """Start a step whose loss is normalised by ``global_tokens``; forget the last step."""
        self._scale = 1.0 / global_tokens.double()
        self._aux, self._metrics = {}, {}

    def end_step(self) -> None:
        self._scale = None

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """The forward of one real microbatch: its loss terms and metrics are recorded."""
        self._recording = True
        try:
            yield
        finally:
            self._recording = False

    def _records(self) -> bool:
        return self._scale is not None and self._recording and not recomputing()

    @property
    def records_now(self) -> bool:
        """True in the forward of a real training microbatch, the forwards whose values are
        recorded (not validation, a pipeline's metadata-inference forward, or recomputation):
        for model state that must count exactly those forwards (MoE token counts)."""
        return self._records()

    def add_loss(self, name: str, carrier: torch.Tensor, term_sum: torch.Tensor) -> torch.Tensor:
        """Add ``term_sum`` (a scalar in the units of the microbatch's cross-entropy SUM) to
        this microbatch's training loss; returns ``carrier``, to be used in its place.

        The trainer divides the term by the step's global count of labelled tokens, like the
        cross-entropy sum, so layout parity holds (module docstring). ``term_sum`` is the value
        of this rank's tokens. Under tensor parallelism its gradient goes through TP's own
        collectives like any activation's: compute it from this rank's part of a
        sequence-sharded activation, or identically on every TP rank from replicated inputs;
        the logged value (reduced over dp/cp/pp only) is complete in the latter case. Inside a
        local TP region each rank adds 1/tp of the gradient (``share_loss_gradients``).
        """
        if self._scale is None:
            return carrier
        scale = (self._scale / self._loss_copies).to(term_sum.dtype)
        if self._records():
            value = self.sum_unreduced_splits(term_sum.detach().double() * self._scale)
            self._aux[name] = self._aux[name] + value if name in self._aux else value
        if not term_sum.requires_grad:
            return carrier
        return _AddLossGradient.apply(carrier, term_sum, scale)

    def share_loss_gradients(self, copies: int) -> None:
        """The loss terms added from now on are computed identically on ``copies`` ranks whose
        gradients are then summed (a local tensor-parallel region, distributed/local_tp.py,
        sets tp on entry and 1 on exit): each adds ``1/copies`` of its gradient.

        Why exact. In such a region every TP rank computes the term from the same all-gathered
        input and the same replicated weights (the router), and the region sums the gradients
        of that input (reduce-scatter) and of those weights (all-reduce) over the tp ranks,
        since its real output is a sum of per-rank partials. Each rank's term gradient
        ``s dterm/dtheta`` (s = 1/T) would so arrive tp times; with ``s/tp`` it arrives
        tp x s/tp = s times, once. In floating point s/tp is s with its exponent lowered when
        tp is a power of two (TP degrees are), so each rank contributes exactly 1/tp of the
        one-process gradient and only the order of the collective's sums differs (class (b)
        of tests/harness.py). The logged value is not divided: TP replicas are not summed in
        ``reduce``, so it stays the one-process value.
        """
        self._loss_copies = copies

    def split_sequences(self, mesh: DeviceMesh, reduced: bool = True) -> None:
        """Every sequence of a microbatch is (further) split over ``mesh``'s ranks: context
        parallelism for the whole job, a sequence-local tensor-parallel region
        (distributed/local_tp.py) while it runs. Statistics of whole sequences then need
        ``sequence_sum``. ``reduced``: the step's values are summed over ``mesh`` downstream
        (CP: part of dp_cp, over which ``reduce`` and the balancing bias sum); if not (TP), a
        rank's share of a recorded value needs ``sum_unreduced_splits``."""
        if mesh.size() > 1:
            self._sequence_meshes += (mesh,)
            if not reduced:
                self._unreduced_meshes += (mesh,)

    def unsplit_sequences(self, mesh: DeviceMesh) -> None:
        """Undo the last ``split_sequences(mesh, ...)`` (a sequence-local region's exit)."""
        if mesh.size() > 1:
            assert self._sequence_meshes[-1] is mesh, "unbalanced split_sequences"
            self._sequence_meshes = self._sequence_meshes[:-1]
            self._unreduced_meshes = tuple(m for m in self._unreduced_meshes if m is not mesh)

    @property
    def sequence_shards(self) -> int:
        """How many ranks hold parts of each sequence (1 without any split)."""
        return math.prod(mesh.size() for mesh in self._sequence_meshes)

    def sequence_sum(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` (no gradient) summed over the ranks holding parts of the same sequences
        (over each split's mesh in turn: integer counts, so the order does not matter): a
        per-sequence count over whole sequences. Every rank of these groups runs the same
        forwards in the same order (CP and TP ranks share data, stage and microbatches),
        recomputation included, so the collectives always pair up."""
        value = value.detach()
        for mesh in self._sequence_meshes:
            value = funcol.all_reduce(value, "sum", mesh)
        return value

    def sum_unreduced_splits(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` (no gradient) summed over the splits that nothing downstream sums (the TP
        ranks of a sequence-local region): a rank's share of a logged loss term or of a MoE
        layer's token counts becomes the share of all the tokens its dp/cp rank stands for."""
        for mesh in self._unreduced_meshes:
            value = funcol.all_reduce(value.detach(), "sum", mesh)
        return value

    def record_metric(self, name: str, value: torch.Tensor, reduce: str = "sum",
                      derive: Callable[[torch.Tensor], float] | None = None,
                      console: bool = True) -> None:
        """Record a model scalar or vector for this step.

        Accumulated over the step's microbatches with ``reduce`` ("sum" | "max" | "mean"),
        ignored while activation checkpointing recomputes a forward, and at log steps reduced
        over the ranks that hold it (data/context-parallel ranks and pipeline stages; tensor-
        parallel replicas hold identical values and are not summed again). Then ``derive``
        (if given) turns the reduced tensor into a float. Written to metrics.jsonl and
        TensorBoard under ``name``; shown on the console unless ``console=False``.
        """
        if reduce not in REDUCTIONS:
            raise ValueError(f"record_metric({name!r}): reduce must be one of {REDUCTIONS}, "
                             f"got {reduce!r}")
        if not self._records():
            return
        value = value.detach().double()
        old = self._metrics.get(name)
        if old is None:
            self._metrics[name] = _Metric(reduce, value, 1, derive, console)
        elif reduce == "max":
            old.total = torch.maximum(old.total, value)
        else:
            old.total, old.count = old.total + value, old.count + 1

    def reduce(self, dp_cp: DeviceMesh, pp: DeviceMesh) -> tuple[dict[str, float | list],
                                                                   list[str]]:
        """This step's ``aux_loss/<name>`` values and metrics, reduced over ``dp_cp`` and then
        ``pp`` (every rank calls this; ranks lacking a name contribute the neutral element).
        Returns (values by name, the scalar names to show on the console)."""
        local = {f"aux_loss/{k}": _Metric("sum", v) for k, v in self._aux.items()}
        local.update(self._metrics)
        values: dict[str, float | list] = {}
        console = []
        for name, spec in _agreed_specs(local).items():
            metric = local.get(name)
            total, count = _reduced(metric, spec, (dp_cp, pp))
            result = total / count if spec.reduce == "mean" else total
            if spec.derived:
                values[name] = _derived(metric.derive if metric else None, result, pp)
            else:
                values[name] = float(result) if result.dim() == 0 else result.tolist()
            if spec.console and isinstance(values[name], float):
                console.append(name)
        return values, console


@dataclass(frozen=True)
class _Spec:
    """What every rank must agree on to reduce one metric."""

    reduce: str
    shape: tuple[int, ...]
    console: bool
    derived: bool


def _agreed_specs(local: dict[str, _Metric]) -> dict[str, _Spec]:
    """name -> spec over all ranks (a pipeline stage may lack a name), in one sorted order."""
    mine = {name: _Spec(m.reduce, tuple(m.total.shape), m.console, m.derive is not None)
            for name, m in local.items()}
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return dict(sorted(mine.items()))
    gathered: list[dict[str, _Spec]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, mine)
    merged: dict[str, _Spec] = {}
    for rank_specs in gathered:
        for name, spec in rank_specs.items():
            seen = merged.setdefault(name, spec)
            if (seen.reduce, seen.shape) != (spec.reduce, spec.shape):
                raise ValueError(f"metric {name!r} is recorded with reduce/shape "
                                 f"{spec.reduce}/{spec.shape} on one rank and "
                                 f"{seen.reduce}/{seen.shape} on another")
    return dict(sorted(merged.items()))


def _reduced(metric: _Metric | None, spec: _Spec,
             meshes: tuple[DeviceMesh, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The metric's total (and count of contributions, for "mean") over the meshes."""
    device, reduce = meshes[0].device_type, spec.reduce
    neutral = -math.inf if reduce == "max" else 0.0
    total = (metric.total.to(device) if metric is not None
             else torch.full(spec.shape, neutral, dtype=torch.float64, device=device))
    count = torch.tensor(float(metric.count if metric is not None else 0), dtype=torch.float64,
                         device=device)
    op = dist.ReduceOp.MAX if reduce == "max" else dist.ReduceOp.SUM
    for mesh in meshes:
        if mesh.size() > 1:
            dist.all_reduce(total, op=op, group=mesh.get_group())
            if reduce == "mean":
                dist.all_reduce(count, group=mesh.get_group())
    return total, count


def _derived(derive: Callable[[torch.Tensor], float] | None, result: torch.Tensor,
             pp: DeviceMesh) -> float:
    """``derive(result)`` brought to every pipeline stage: only the stages whose modules
    recorded the metric know ``derive``; the reduced ``result`` is the same on all of them."""
    value = torch.tensor(float(derive(result)) if derive is not None else -math.inf,
                         dtype=torch.float64, device=result.device)
    if pp.size() > 1:
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=pp.get_group())
    return float(value)


def attach_step_hooks(model: nn.Module, hooks: StepHooks) -> int:
    """Give ``hooks`` to every submodule that declares a ``step_hooks`` attribute (set to None
    in its __init__). The trainer calls this on each model part after parallelization.
    Returns how many modules received them (wrappers that forward attribute lookups to the
    module they wrap, like activation checkpointing's, are not counted)."""
    attached = 0
    for module in model.modules():
        if "step_hooks" in vars(module):
            module.step_hooks = hooks
            attached += 1
    return attached
