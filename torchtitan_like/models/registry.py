"""The model registry: how the trainer finds a model, its sizes and its parallelization plan.

A ``ModelSpec`` bundles everything model-specific the trainer needs; nothing else in the
trainer knows a model by name. Research models register themselves from outside the package:
name a module in ``[job] custom_import`` that calls ``register_model`` (README, "Your own model").
"""

from __future__ import annotations

import abc
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import coerce, did_you_mean, type_name

if TYPE_CHECKING:
    from torchtitan_like.components.optimizer import OptimizersContainer
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import Meshes, ParallelDims


@dataclasses.dataclass
class BaseModelArgs(abc.ABC):
    """Hyper-parameters of one model family; a flavor is an instance of its subclass."""

    @abc.abstractmethod
    def update_from_config(self, job_config: JobConfig) -> None:
        """Adopt what the job decides, e.g. the RoPE table length from training.seq_len."""

    @abc.abstractmethod
    def num_params(self) -> int:
        """Parameter count (tied weights counted once)."""

    @abc.abstractmethod
    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs (forward + backward) per token."""

    def num_routed_experts(self) -> int:
        """Routed experts per MoE layer, which expert parallelism splits; 0 = a dense model."""
        return 0

    def validate(self, job_config: JobConfig, parallel_dims: ParallelDims) -> None:  # noqa: B027
        """Raise ConfigError if this model cannot run the job's layout; default: anything goes."""


def _field(args: Any, dotted: str) -> Any:
    """``args.a.b`` for ``"a.b"``; None where a group on the way is None (switched off)."""
    value = args
    for name in dotted.split("."):
        value = getattr(value, name) if value is not None else None
    return value


def _non_finite(args: Any, prefix: str = "") -> str | None:
    """The dotted name of the first float field that is not finite, nested groups included."""
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            return prefix + f.name
        if dataclasses.is_dataclass(value) and (inner := _non_finite(value, f"{f.name}.")):
            return prefix + inner
    return None


def check_arg_ranges(args: Any, where: str, *, positive: Iterable[str] = (),
                     non_negative: Iterable[str] = ()) -> None:
    """ConfigError naming the first hyper-parameter out of range: every float finite (nested
    groups included), the fields in ``positive`` > 0 and those in ``non_negative`` >= 0 (a
    dotted name reaches into a group, e.g. ``rope_scaling.factor``; None passes, it is the
    "off" of a field that allows it). A model's ``validate`` calls it first, so a flavor and
    ``[model] overrides`` meet the same bounds before anything divides by a head count."""
    if name := _non_finite(args):
        raise ConfigError(f"{where}: {name} = {_field(args, name)}: must be a finite number")
    for names, ok, bound in ((positive, lambda v: v > 0, "> 0"),
                             (non_negative, lambda v: v >= 0, ">= 0")):
        for name in names:
            value = _field(args, name)
            if value is not None and not ok(value):
                raise ConfigError(f"{where}: {name} = {value!r}: must be {bound}")


class HFAdapter(Protocol):
    """Maps one model shape to and from HuggingFace (models/llama3/hf_adapter.py is one)."""

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Our parameter FQNs -> HF names; the values are passed through."""

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        """HF names -> our FQNs."""

    def hf_config(self, dtype: torch.dtype) -> dict[str, Any]:
        """The config.json describing this shape, weights stored in ``dtype``."""

    def check_config(self, hf_config: dict[str, Any]) -> None:
        """Raise ValueError naming what differs if ``hf_config`` is not this shape."""


PARALLEL_DIMS = {"tp": "tensor_parallel_degree", "cp": "context_parallel_degree",
                 "pp": "pipeline_parallel_degree", "ep": "expert_parallel_degree"}
"""Model-specific parallel dimensions and their [parallelism] degree fields."""

ParallelizeFn = Callable[["nn.Module", "ParallelDims", "Meshes", "JobConfig"], "nn.Module"]
OptimizerHooksFn = Callable[
    [list["nn.Module"], "OptimizersContainer", "ParallelDims", "Meshes"], None]
"""(model parts, their optimizers, dims, meshes) -> registers per-step state updates as
optimizer step post-hooks (e.g. MoE bias balancing, models/moe/balancing.py)."""
PipeliningFn = Callable[["nn.Module", list[int], "JobConfig"], list["nn.Module"]]
"""(model on meta, this rank's stage indices, job) -> one module per stage, each the model with
the other stages' modules removed and parameter names unchanged (distributed/pipeline.py)."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    """Registry key, the value of [model] name."""

    model_cls: Callable[[Any], nn.Module]
    """Builds the plain model from an args instance; must offer ``init_weights()``."""

    flavors: Mapping[str, BaseModelArgs]
    """Size presets, the values of [model] flavor."""

    parallelize_fn: ParallelizeFn
    """Applies TP/CP/AC/compile/FSDP to one model part, in the documented order."""

    pipelining_fn: PipeliningFn | None = None
    """Splits the model into pipeline stages; None = this model cannot be pipelined."""

    hf_adapter: Callable[[Any], HFAdapter] | None = None
    """Builds the HuggingFace converter for a flavor's args; None = no HF interop."""

    register_optimizer_hooks: OptimizerHooksFn | None = None
    """Called once the optimizers exist, to hook model state updated after each optimizer
    step; None = nothing to hook."""

    context_parallel_buffers: Callable[[nn.Module], list[tuple[torch.Tensor, int]]] | None = None
    """A model part's buffers laid out along the sequence, as (buffer, its sequence dim), that
    context parallelism shards beside the tokens (e.g. the RoPE table); None = this model
    cannot run under context parallelism (its attention is not causal SDPA, or its positions
    are not such a buffer)."""

    supported_dims: frozenset[str] = frozenset(PARALLEL_DIMS)
    """The parallel dimensions beyond data parallelism (FSDP/HSDP, always supported) that
    ``parallelize_fn`` implements, among "tp", "cp", "pp", "ep"; a job asking for another is
    refused at start-up, before any process group exists."""

    attn_mask_types: frozenset[str] = frozenset({"causal"})
    """The ``[model] attn_mask_type`` values the model implements: "causal", and
    "block_causal" when its forward takes ``document_ids`` (models/attention_masks.py); a job
    asking for another is refused at start-up."""

    stage_inputs: frozenset[str] = frozenset()
    """Keyword inputs the model's forward takes from the step's batch, handed to every
    pipeline stage (and to the whole model without PP): among "token_ids", "labels" and
    "document_ids" (models/stage_inputs.py; the document ids come with block-causal attention
    anyway). Checked at start-up against the forward's keywords."""

    loss_parallel: bool = True
    """Whether the plan hands the loss vocab-sharded logits under TP when
    ``parallel_dims.loss_parallel_enabled``. False: it gathers whole logits (e.g. a loss term
    needs whole rows), and a TP job records loss parallel as off ([parallelism]
    disable_loss_parallel = true) at start-up; the logits the loss receives are checked either
    way (distributed/plan_check.py)."""


def check_supported_dims(spec: ModelSpec, job_config: JobConfig) -> None:
    """ConfigError if the job asks for a parallel dimension ``spec`` does not declare."""
    unknown = set(spec.supported_dims) - set(PARALLEL_DIMS)
    if unknown:
        raise ConfigError(f"model {spec.name!r}: ModelSpec.supported_dims has unknown "
                          f"{sorted(unknown)}; use some of {', '.join(PARALLEL_DIMS)}")
    for dim, field in PARALLEL_DIMS.items():
        degree = getattr(job_config.parallelism, field, 1)
        if degree > 1 and dim not in spec.supported_dims:
            supported = ", ".join(sorted(spec.supported_dims)) or "none"
            raise ConfigError(
                f"[parallelism] {field} = {degree}, but model {spec.name!r} supports only data "
                f"parallelism and [{supported}] (ModelSpec.supported_dims); set it to 1")


_REGISTRY: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec) -> None:
    """Make ``spec`` trainable as ``[model] name = spec.name``."""
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"a model named {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec


def registered_models() -> list[ModelSpec]:
    """Every registered model, in registration order (the built-in ones first)."""
    return list(_REGISTRY.values())


def get_model_spec(name: str) -> ModelSpec:
    """The spec registered under ``name``. The built-in models are registered by the time this
    runs: importing this module first runs ``torchtitan_like/models/__init__.py``, which
    imports them."""
    if name not in _REGISTRY:
        raise ConfigError(
            f"[model] name: unknown model {name!r}; registered: {', '.join(sorted(_REGISTRY))}"
            + did_you_mean(name, _REGISTRY)
            + " (a model of your own is registered by a module named in [job] custom_import)"
        )
    return _REGISTRY[name]


def get_model_args(spec: ModelSpec, flavor: str) -> BaseModelArgs:
    """A fresh copy of the flavor's args, safe to update for this job."""
    if flavor not in spec.flavors:
        raise ConfigError(
            f"[model] flavor: {spec.name} has no flavor {flavor!r}; "
            f"choose from {', '.join(spec.flavors)}" + did_you_mean(flavor, spec.flavors)
        )
    return dataclasses.replace(spec.flavors[flavor])


def _overridable_type(tp: Any) -> Any:
    """The type an override is checked against: a scalar, a Literal, or X of ``X | None``;
    None for fields an override cannot set (collections)."""
    options = [t for t in typing.get_args(tp) if t is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(options) == 1:
        tp = options[0]
    scalar = tp in (int, float, bool, str) or typing.get_origin(tp) is typing.Literal
    return tp if scalar else None


def _paths(overrides: Mapping[str, Any], prefix: tuple[str, ...] = ()
           ) -> dict[tuple[str, ...], Any]:
    """``{"moe": {"top_k": 2}, "n_layers": 8}`` (or a dotted key ``"moe.top_k"``) ->
    ``{("moe", "top_k"): 2, ("n_layers",): 8}``, later entries winning."""
    paths: dict[tuple[str, ...], Any] = {}
    for key, value in overrides.items():
        path = (*prefix, *str(key).split("."))
        paths.update(_paths(value, path) if isinstance(value, Mapping) else {path: value})
    return paths


def _replace_fields(args: Any, overrides: Mapping[tuple[str, ...], Any],
                    where: str) -> Any:
    """``args`` (a dataclass) with the fields at the paths of ``overrides`` replaced; a path
    into a nested dataclass field (``MoEArgs``) replaces that field by an updated copy, whose
    own checks (``__post_init__``) run again on the new values."""
    hints = typing.get_type_hints(type(args))
    names = [f.name for f in dataclasses.fields(args) if f.init]
    by_field: dict[str, dict[tuple[str, ...], Any]] = {}
    for path, value in overrides.items():
        by_field.setdefault(path[0], {})[path[1:]] = value
    values = {}
    for name, rest in by_field.items():
        if name not in names:
            raise ConfigError(f"[model] {where}.{name}: {type(args).__name__} has no field "
                              f"{name!r}" + did_you_mean(name, names))
        values[name] = _new_value(getattr(args, name), hints[name], rest, f"{where}.{name}")
    try:
        return dataclasses.replace(args, **values)
    except ConfigError:
        raise
    except ValueError as e:  # the args' own checks, e.g. MoEArgs: top_k <= num_experts
        raise ConfigError(f"[model] {where}: {e}") from e


def _new_value(current: Any, hint: Any, rest: Mapping[tuple[str, ...], Any], where: str) -> Any:
    """One field's overridden value: ``rest`` maps the paths below the field (``()`` = the
    field itself) to values. ``"none"`` sets a field typed ``X | None`` to None (TOML has no
    null), e.g. ``moe.load_balance_coeff = "none"`` turns bias balancing off."""
    value = rest.get(())
    if (len(rest) == 1 and type(None) in typing.get_args(hint) and isinstance(value, str)
            and value.strip().lower() == "none"):
        return None
    if dataclasses.is_dataclass(current):
        if () in rest:
            example = dataclasses.fields(current)[0].name
            raise ConfigError(f"[model] {where} is a group of fields ({type(current).__name__})"
                              f": set them one by one, e.g. --model.{where}.{example}=...")
        return _replace_fields(current, rest, where)
    tp = _overridable_type(hint)
    if set(rest) != {()}:
        what = ("None in this flavor, and an override cannot create it; choose a flavor "
                "that has one" if current is None else
                f"a {type_name(tp) if tp else hint}, not a group of fields")
        raise ConfigError(f"[model] {where} is {what}")
    if tp is None:
        raise ConfigError(f"[model] {where}: field of type {hint} cannot be overridden "
                          "(only numbers, booleans and strings); register a flavor instead")
    return coerce(value, tp, f"[model] {where}", from_cli=isinstance(value, str))


def apply_overrides(args: BaseModelArgs, overrides: Mapping[str, Any]) -> BaseModelArgs:
    """``args`` with the fields named in ``[model] overrides`` replaced, nested dataclass fields
    included (``{ moe = { num_experts = 8 } }``, ``--model.overrides.moe.num_experts=8``), each
    type-checked (``"none"`` for None where the field allows it); ConfigError for an unknown
    name (closest match suggested), a collection field, or values the args' own checks
    refuse."""
    return _replace_fields(args, _paths(overrides), "overrides")


def model_spec_and_args(job_config: JobConfig) -> tuple[ModelSpec, BaseModelArgs]:
    """The job's model spec and its flavor's args with ``[model] overrides`` applied, updated
    for the job: what the trainer, the planner and every other caller builds."""
    spec = get_model_spec(job_config.model.name)
    args = apply_overrides(get_model_args(spec, job_config.model.flavor),
                           job_config.model.overrides)
    args.update_from_config(job_config)
    return spec, args
