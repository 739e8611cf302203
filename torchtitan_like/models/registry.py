"""The model registry: how the trainer finds a model, its sizes and its parallelization plan.

A ``ModelSpec`` (protocols/model_spec.py) bundles everything model-specific the trainer needs;
nothing else in the trainer knows a model by name. Research models register themselves from
outside the package: name a module in ``[job] custom_import`` that calls ``register_model``
(README, "Your own model").
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import coerce, did_you_mean, type_name
from torchtitan_like.protocols.model_args import BaseModelArgs
from torchtitan_like.protocols.model_spec import PARALLEL_DIMS, ModelSpec

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig


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


def overridden_max_seq_len(job_config: JobConfig) -> int | None:
    """``[model] overrides.max_seq_len``, if set. The trainer sizes the RoPE table to
    ``[training] seq_len`` whatever the flavor says (``update_from_config``: context
    parallelism shards the table beside the tokens, an HF export names it
    max_position_embeddings), so an override below seq_len contradicts the data (refused by
    ``model_spec_and_args``) and one above it is a setting without effect (named at start-up,
    components/run_summary.py)."""
    value = job_config.model.overrides.get("max_seq_len")
    return None if value is None else int(value)


def model_spec_and_args(job_config: JobConfig) -> tuple[ModelSpec, BaseModelArgs]:
    """The job's model spec and its flavor's args with ``[model] overrides`` applied, updated
    for the job: what the trainer, the planner and every other caller builds."""
    spec = get_model_spec(job_config.model.name)
    args = apply_overrides(get_model_args(spec, job_config.model.flavor),
                           job_config.model.overrides)
    rows, seq_len = overridden_max_seq_len(job_config), job_config.training.seq_len
    if rows is not None and rows < seq_len:
        raise ConfigError(f"[model] overrides.max_seq_len = {rows} is below [training] seq_len "
                          f"= {seq_len}: the model would have no position for the sequence's "
                          "last tokens; the RoPE table is always seq_len long, remove the "
                          "override")
    args.update_from_config(job_config)
    return spec, args
