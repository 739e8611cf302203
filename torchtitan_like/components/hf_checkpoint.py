"""HuggingFace safetensors folders <-> our checkpoints, in one process (scripts/convert_hf.py).

A HuggingFace model folder is ``config.json`` plus ``*.safetensors`` files (sharded above
``max_shard_bytes``, with a ``model.safetensors.index.json`` naming each tensor's file). Names
and config come from the model's ``HFAdapter`` (ModelSpec.hf_adapter). Loading HF weights into
a *sharded* training job goes through DCP's HuggingFaceStorageReader instead
(``[checkpoint] initial_load_in_hf``, components/checkpoint/manager.py), which reads each
rank's slices.

Every file written carries the CRC-32 of each tensor, and every load checks them
(components/checkpoint/hf_checksums.py); DCP checkpoints are read and written through the
checksum reader and writer (components/checkpoint/checksums.py).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint import CheckpointException

from torchtitan_like.components.checkpoint.checksums import (
    ChecksumReader,
    ChecksumWriter,
    checksums_of,
)
from torchtitan_like.components.checkpoint.failure import load_failure
from torchtitan_like.components.checkpoint.folder import publish, read_info
from torchtitan_like.components.checkpoint.hf_checksums import checksum_metadata, load_verified
from torchtitan_like.logging import logger
from torchtitan_like.models.registry import (
    apply_overrides,
    get_model_args,
    get_model_spec,
    registered_models,
)
from torchtitan_like.protocols.hf_adapter import HFAdapter
from torchtitan_like.protocols.model_spec import ModelSpec

INDEX_FILE = "model.safetensors.index.json"


def save_hf(state_dict: dict[str, torch.Tensor], adapter: HFAdapter, folder: Path,
            dtype: torch.dtype, max_shard_bytes: int = 5 * 2**30) -> list[Path]:
    """Write full (unsharded) weights with our FQNs as a HuggingFace model folder."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in adapter.to_hf(state_dict).items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    files = [folder / ("model.safetensors" if len(shards) == 1 else
                       f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
             for i in range(len(shards))]
    for file, shard in zip(files, shards, strict=True):
        save_file(shard, str(file), metadata={"format": "pt", **checksum_metadata(shard)})
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size()
                                                for t in tensors.values())},
                 "weight_map": {n: f.name for f, s in zip(files, shards, strict=True) for n in s}}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=1))
    (folder / "config.json").write_text(json.dumps(adapter.hf_config(dtype), indent=1))
    return files


def load_hf(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, every tensor under its HF name) of a HuggingFace model folder."""
    files = sorted(folder.glob("*.safetensors"))
    if not (folder / "config.json").is_file() or not files:
        raise ValueError(f"{folder}: not a HuggingFace model folder (config.json and "
                         "*.safetensors expected)")
    tensors: dict[str, torch.Tensor] = {}
    verified = True
    for file in files:
        loaded, has_crcs = load_verified(file)
        tensors.update(loaded)
        verified &= has_crcs
    if not verified:
        logger.info(f"{folder}: its safetensors carry no checksums (not written by "
                    "torchtitan_like): loaded unverified")
    return json.loads((folder / "config.json").read_text()), tensors


def flavor_args(spec: ModelSpec, flavor: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """A flavor's args with ``[model] overrides`` applied (models/registry.py)."""
    return apply_overrides(get_model_args(spec, flavor), overrides or {})


def overrides_from_cli(items: list[str]) -> dict[str, str] | None:
    """Repeated ``--override NAME=VALUE`` flags of the conversion tools (``moe.top_k=2`` for a
    nested field) -> [model] overrides; None when there are none."""
    overrides = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"--override {item!r}: expected NAME=VALUE, e.g. moe.top_k=2")
        overrides[name.strip()] = value.strip()
    return overrides or None


def _hf_model_types(spec: ModelSpec) -> set[str]:
    """The config.json ``model_type`` values the flavors of ``spec`` are written with (a flavor
    without an HF layout, which its adapter refuses with a ValueError, adds none)."""
    assert spec.hf_adapter is not None
    types = set()
    for args in spec.flavors.values():
        try:
            types.add(str(spec.hf_adapter(args).hf_config(torch.float32).get("model_type")))
        except ValueError:
            continue
    return types


def model_of_folder(path: Path, model_name: str | None = None) -> ModelSpec:
    """The registered model of a DCP step folder (the ``model.name`` its checkpoint.json
    records) or of a HuggingFace folder (the model whose HF adapter writes its config.json's
    ``model_type``); ``model_name`` (the tools' ``--model``) wins. ValueError (or
    CheckpointError for an unreadable checkpoint.json) naming what to pass otherwise."""
    if model_name:
        return get_model_spec(model_name)
    if not path.is_dir():
        raise ValueError(f"{path}: no such folder (a DCP step-N folder or a HuggingFace one)")
    if (path / "config.json").is_file():
        try:
            model_type = json.loads((path / "config.json").read_text()).get("model_type")
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(f"{path}/config.json is not a readable HF config ({e})") from None
        matches = [spec for spec in registered_models()
                   if spec.hf_adapter is not None and model_type in _hf_model_types(spec)]
        if len(matches) == 1:
            return matches[0]
        known = ", ".join(f"{s.name} ({'/'.join(sorted(_hf_model_types(s)))})"
                          for s in registered_models() if s.hf_adapter is not None)
        which = (f"is written by {len(matches)} registered models" if matches
                 else "is no registered model's")
        raise ValueError(f"{path}/config.json: model_type {model_type!r} {which} ({known}); "
                         "pass --model (and --custom_import for a model of your own)")
    name = read_info(path).get("model", {}).get("name")
    if not name:
        raise ValueError(f"{path}/checkpoint.json does not name its model; pass --model")
    return get_model_spec(name)


def model_from_checkpoint(spec: ModelSpec, checkpoint: Path, flavor: str | None = None,
                          overrides: Mapping[str, Any] | None = None,
                          ) -> tuple[torch.nn.Module, Any]:
    """The full model of a DCP checkpoint (any layout it was saved under) in this process,
    with the flavor, model overrides and context length recorded in its checkpoint.json
    (``overrides`` given here replace the recorded ones)."""
    info = read_info(checkpoint)
    saved = info["model"]
    args = flavor_args(spec, flavor or saved["flavor"],
                       saved.get("overrides", {}) if overrides is None else overrides)
    args.max_seq_len = info.get("seq_len", args.max_seq_len)
    model = spec.model_cls(args)
    state = model.state_dict()
    with warnings.catch_warnings():  # "... assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        try:
            dcp.load({"model": state}, no_dist=True, storage_reader=ChecksumReader(
                checkpoint, checksums_of(checkpoint)))
        except (Exception, CheckpointException) as e:  # the latter is a BaseException
            raise load_failure(e, f"checkpoint {checkpoint}", checkpoint) from e
    model.load_state_dict(state)
    return model, args


def model_from_hf(spec: ModelSpec, folder: Path, flavor: str | None = None,
                  overrides: Mapping[str, Any] | None = None) -> tuple[torch.nn.Module, Any]:
    """The model of a HuggingFace folder in this process; the flavor is the one whose shape,
    with ``overrides`` applied, its config.json describes (every shape-defining field
    compared) unless given."""
    config, hf_tensors = load_hf(folder)
    flavor = flavor or _matching_flavor(spec, config, folder, overrides)
    args = flavor_args(spec, flavor, overrides)
    adapter = spec.hf_adapter(args)
    adapter.check_config(config)
    args.max_seq_len = config.get("max_position_embeddings", args.max_seq_len)
    model = spec.model_cls(args)
    model.load_state_dict(adapter.from_hf(hf_tensors))
    return model, args


def hf_to_seed_checkpoint(spec: ModelSpec, hf_folder: Path, checkpoint_folder: Path,
                          flavor: str | None = None, overrides: Mapping[str, Any] | None = None,
                          ) -> tuple[Path, str]:
    """Write a HuggingFace folder's weights as the seed checkpoint ``step-0`` (model only) of a
    checkpoint folder; the flavor is the one whose shape, with ``overrides`` applied (the
    job's [model] overrides), the config.json describes."""
    config, hf_tensors = load_hf(hf_folder)
    if flavor is None:
        flavor = _matching_flavor(spec, config, hf_folder, overrides)
    adapter = spec.hf_adapter(flavor_args(spec, flavor, overrides))
    adapter.check_config(config)
    final = checkpoint_folder / "step-0"
    if final.exists():
        raise ValueError(f"{final} exists already; choose an empty checkpoint folder")
    partial = checkpoint_folder / "step-0.partial"
    state = {k: v.contiguous() for k, v in adapter.from_hf(hf_tensors).items()}
    dcp.save({"model": state}, storage_writer=ChecksumWriter(partial), no_dist=True)
    dtypes = {t.dtype for t in state.values()}
    publish(partial, final, {"step": 0, "states": ["model"], "source": str(hf_folder),
                             "model": {"name": spec.name, "flavor": flavor,
                                       "overrides": dict(overrides or {})},
                             "dtype": str(dtypes.pop()).removeprefix("torch.")
                             if len(dtypes) == 1 else "mixed",
                             "world_size": 1})
    return final, flavor


def _matching_flavor(spec: ModelSpec, config: dict[str, Any], hf_folder: Path,
                     overrides: Mapping[str, Any] | None = None) -> str:
    """The first flavor whose shape, with ``overrides`` applied, config.json describes. An
    override that a flavor's args refuse (a ConfigError, also a ValueError) rules it out."""
    for name in spec.flavors:
        try:
            spec.hf_adapter(flavor_args(spec, name, overrides)).check_config(config)
            return name
        except ValueError:
            continue
    with_overrides = f" with [model] overrides {dict(overrides)}" if overrides else ""
    raise ValueError(f"{hf_folder}/config.json matches no {spec.name} flavor "
                     f"({', '.join(spec.flavors)}){with_overrides}; register one of its shape")
