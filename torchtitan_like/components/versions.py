"""Version gates: a feature that the installed torch or torchao cannot run is refused at start-up
in one ``config error:`` line naming the versions (validate.py; before torchrun, preflight.py),
not at step 1 with a traceback.

- ``[float8] moe_grouped_mm = "mxfp8"`` (emulated too) needs torch >= 2.13, or a torch with
  DTensor's ``scaled_mm_single_dim_strategy`` and ``is_pinned_handler``: torchao 0.18 probes
  for both (prototype/moe_training/conversion_utils.py) and otherwise asserts "Please install
  the latest torch nightly build to use MXFP8 training"; torch 2.11 failed it on an H200, 2.13
  has both.
- ``[float8] moe_grouped_mm`` (either recipe) and ``recipe_name = "blockwise"`` need torchao
  >= 0.18: the training-op configs and ``Float8BlockwiseLinear`` this code calls are 0.18's.
- ``[float8] recipe_name = "blockwise"`` on a GPU needs ``torch.nn.functional.scaled_mm`` with
  its blockwise scaling recipes (torchao 0.18's linear calls it): torch >= 2.11, where it
  trained on the H200.
- ``[optimizer] implementation = "fused"`` with bf16 moments needs no gate: torch >= 2.13 on
  CUDA runs torch's own kernel, any other torch the compiled step (components/bf16_moments.py).

Everything else ran on torch 2.11 on the H200 (docs/gpu.md) and is tested on 2.13 on CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from importlib import metadata

import torch

from torchtitan_like.config.derived import float8_enabled
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig


def parse_version(text: str) -> tuple[int, int]:
    """"2.13.0+cu130" -> (2, 13); "0.18.0.dev2026" -> (0, 18)."""
    major, minor = text.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def torch_version() -> tuple[int, int]:
    return parse_version(torch.__version__)


def torchao_version() -> tuple[int, int] | None:
    """torchao's (major, minor), or None when it is not installed (read without importing it)."""
    try:
        return parse_version(metadata.version("torchao"))
    except metadata.PackageNotFoundError:
        return None


def _dtensor_scaled_mm_strategies() -> bool:
    """What torchao 0.18 probes for before MXFP8 training."""
    from torch.distributed.tensor import _dispatch, _ops

    return hasattr(_ops, "scaled_mm_single_dim_strategy") and hasattr(
        _dispatch, "is_pinned_handler")


def _functional_scaled_mm() -> bool:
    return hasattr(torch.nn.functional, "scaled_mm")


@dataclasses.dataclass(frozen=True)
class Gate:
    """``feature`` (when ``applies``) needs torch >= ``torch_min`` or a torch where ``probe``
    holds, and torchao >= ``torchao_min``."""

    feature: str
    applies: Callable[[JobConfig, str], bool]
    torch_min: tuple[int, int] = (0, 0)
    probe: Callable[[], bool] | None = None
    torchao_min: tuple[int, int] = (0, 0)


def _uses_torchao_moe(c: JobConfig, _device: str) -> bool:
    return c.float8.moe_grouped_mm != "none"


def _gpu_blockwise(c: JobConfig, device: str) -> bool:
    return (float8_enabled(c) and c.float8.recipe_name == "blockwise" and device == "cuda"
            and not c.float8.emulate)


GATES = (
    Gate('[float8] moe_grouped_mm = "mxfp8"',
         lambda c, _d: c.float8.moe_grouped_mm == "mxfp8",
         torch_min=(2, 13), probe=lambda: _dtensor_scaled_mm_strategies()),
    Gate("[float8] moe_grouped_mm", _uses_torchao_moe, torchao_min=(0, 18)),
    Gate('[float8] recipe_name = "blockwise"', _gpu_blockwise, torch_min=(2, 11),
         probe=lambda: _functional_scaled_mm(), torchao_min=(0, 18)),
)


def refusal(gate: Gate, torch_have: tuple[int, int], probe_ok: bool,
            torchao_have: tuple[int, int] | None) -> str | None:
    """Why ``gate``'s feature cannot run with these versions, or None (pure)."""
    if torch_have < gate.torch_min and not probe_ok:
        return (f"needs torch >= {_dotted(gate.torch_min)} (this is torch "
                f"{_dotted(torch_have)}); install a newer torch or turn it off")
    if gate.torchao_min > (0, 0) and (torchao_have is None or torchao_have < gate.torchao_min):
        have = "not installed" if torchao_have is None else _dotted(torchao_have)
        return (f"needs torchao >= {_dotted(gate.torchao_min)} (torchao here: {have}); "
                "install it or turn it off")
    return None


def check_versions(config: JobConfig, device_type: str) -> None:
    """ConfigError for the first feature this job asks for that these versions cannot run."""
    for gate in GATES:
        if not gate.applies(config, device_type):
            continue
        probe_ok = gate.probe is not None and torch_version() < gate.torch_min and gate.probe()
        if why := refusal(gate, torch_version(), probe_ok, torchao_version()):
            raise ConfigError(f"{gate.feature} {why}")


def _dotted(version: tuple[int, int]) -> str:
    return ".".join(map(str, version))
