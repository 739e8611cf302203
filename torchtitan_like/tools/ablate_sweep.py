"""A sweep of the ablation runner (tools/ablate.py, whose docstring shows the file): its
variants, each variant's launch command and planned memory, and the checks of the file.
The runner runs it; tools/ablate_report.py writes its results."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import torch

from torchtitan_like.config.manager import build_job_config, tomllib
from torchtitan_like.launch import torchrun_argv
from torchtitan_like.tools.planner import CPU, Cluster, from_job_config, plan
from torchtitan_like.tools.planner.hardware import load_profile


class SweepError(ValueError):
    """A sweep file that cannot run; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...] = ()
    nproc: int | None = None

    @property
    def folder_name(self) -> str:
        """The name as a folder: letters, digits, '-', '_' and '.' kept, the rest '_'."""
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.name).strip("_") or "variant"


@dataclasses.dataclass(frozen=True)
class Sweep:
    base_config: Path
    variants: tuple[Variant, ...]
    steps: int = 10
    nproc: int = 1
    baseline: str = ""
    output_folder: Path = Path("outputs/ablations")
    overrides: tuple[str, ...] = ()
    timeout_s: float = 1800.0
    hardware: Path | None = None
    """A hardware profile (ttl-plan --calibrate) for the planned columns (ttl-ablate
    --hardware)."""

    @property
    def baseline_name(self) -> str:
        return self.baseline or self.variants[0].name

    def command(self, variant: Variant, folder: Path) -> list[str]:
        """The launch command of one variant, as run_train.sh would build it on one node
        (torchtitan_like.launch: its last line is the first failing rank's error); the
        variant's overrides win over the sweep's. Every rank's output reaches the log
        (prefixed with its rank). A re-run of the sweep archives a variant's earlier outputs
        (``[job] overwrite``, components/run_folder.py)."""
        return torchrun_argv(self.nproc_of(variant), "--role=rank", "--tee=3",
                             "-m", "torchtitan_like.train", *self.trainer_args(variant, folder),
                             max_restarts=0, launcher="torchtitan_like.launch")

    def trainer_args(self, variant: Variant, folder: Path) -> list[str]:
        """The trainer's own arguments for one variant (the config and its overrides)."""
        return ["--job.config_file", str(self.base_config), *self.overrides,
                f"--training.steps={self.steps}", f"--job.dump_folder={folder}",
                "--job.overwrite=true", *variant.overrides]

    def nproc_of(self, variant: Variant) -> int:
        return variant.nproc or self.nproc

    def planned(self, variant: Variant) -> tuple[float | None, float | None]:
        """The planner's peak tensor memory per rank (GiB) and, with a hardware profile
        (``hardware``, ttl-plan --calibrate), tokens/s per device for the variant; None where
        the planner cannot model its config. The memory: on CUDA comparable with the logged
        peak; on CPU, where the logged peak is the process's RSS, the only view of activation
        memory. Without a profile the device is the CPU preset (its rates are placeholders:
        no tokens/s)."""
        argv = ["--job.config_file", str(self.base_config), *self.overrides, *variant.overrides]
        nproc = self.nproc_of(variant)
        device = load_profile(self.hardware).gpu if self.hardware else \
            dataclasses.replace(CPU, fused_rms_norm=torch.cuda.is_available())
        try:
            model, work, layout = from_job_config(build_job_config(argv), nproc)
            result = plan(model, Cluster(device, gpus_per_node=nproc), work, layout)
        except ValueError:  # a config error (the run will say so) or a model without shapes
            return None, None
        speed = result.tokens_per_second_per_gpu if self.hardware else None
        return result.memory.total / 2**30, speed


_SWEEP_KEYS = {"base_config", "steps", "nproc", "baseline", "output_folder", "overrides",
               "timeout_s"}
_VARIANT_KEYS = {"name", "overrides", "nproc"}


def _overrides(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SweepError(f"{where}: overrides must be a list of strings like "
                         '"--section.key=value"')
    for item in value:
        if not item.startswith("--"):
            raise SweepError(f"{where}: override {item!r} must look like --section.key=value")
    return tuple(value)


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file not found: {path}")
    data = tomllib.loads(path.read_text())
    unknown_sections = set(data) - {"sweep", "variants"}
    if unknown_sections:
        raise SweepError(f"{path}: unknown sections {sorted(unknown_sections)}; a sweep has "
                         "[sweep] and [[variants]]")
    head = data.get("sweep", {})
    unknown = set(head) - _SWEEP_KEYS
    if unknown:
        raise SweepError(f"{path}: unknown [sweep] keys {sorted(unknown)}; known: "
                         f"{', '.join(sorted(_SWEEP_KEYS))}")
    if "base_config" not in head:
        raise SweepError(f"{path}: [sweep] base_config is required (a training TOML)")
    base = (path.parent / head["base_config"]).resolve()
    if not base.is_file():
        raise SweepError(f"{path}: base_config {base} does not exist")

    variants = []
    for i, raw in enumerate(data.get("variants", [])):
        where = f"{path} variant {i + 1}"
        unknown = set(raw) - _VARIANT_KEYS
        if unknown or "name" not in raw:
            raise SweepError(f"{where}: needs a name, may have overrides and nproc "
                             f"(unknown: {sorted(unknown)})")
        variants.append(Variant(str(raw["name"]), _overrides(raw.get("overrides", []), where),
                                raw.get("nproc")))
    if not variants:
        raise SweepError(f"{path}: no [[variants]]")
    names = [v.folder_name for v in variants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SweepError(f"{path}: variant names must differ as folder names: {duplicates}")
    sweep = Sweep(
        base_config=base,
        variants=tuple(variants),
        steps=int(head.get("steps", 10)),
        nproc=int(head.get("nproc", 1)),
        baseline=str(head.get("baseline", "")),
        output_folder=Path(head.get("output_folder", f"outputs/ablations/{path.stem}")),
        overrides=_overrides(head.get("overrides", []), f"{path} [sweep]"),
        timeout_s=float(head.get("timeout_s", 1800)),
    )
    if sweep.baseline_name not in {v.name for v in variants}:
        raise SweepError(f"{path}: baseline {sweep.baseline!r} is not a variant name")
    return sweep
