"""A hardware profile: what ``ttl-plan --calibrate`` measured on one machine, kept by the user
and given back as ``ttl-plan --hardware PROFILE`` (and ``ttl-ablate --hardware``) instead of a
GPU preset.

The file is JSON (``FORMAT``)::

    {"format": "ttl-hardware-profile/1",
     "date": "2026-12-04T19:30:00+00:00",          when it was measured (UTC)
     "host": {"device": "cpu", "device_name": ..., "torch": "2.13.0", "cuda": null,
              "driver": null, "nccl": null, "cpu": ..., "threads": 1, ...},
     "processes": {"world_size": 2, "per_node": 2, "nodes": 1},
     "job": {...},                                  the shapes it was measured at
     "gpu": {every field of inputs.GPU},            what the planner reads
     "measured": {...},                             the raw figures behind "gpu"
     "pace": {"matmul_tflops": [start, end],        a fixed probe at the start and the end
              "dispatch_us": [start, end]},         (calibrate.py: measure_pace)
     "seconds": 41.2}

Only ``gpu`` and ``processes.per_node`` feed the planner (and ``pace``, ``--verify``'s check
that the machine still runs as it did); the rest says what was measured,
where and with which versions, so that a profile is not silently used on other hardware or
software (ttl-plan prints its date and torch version in the cluster line). The GPU's curves
are (bytes per ring step, GB/s a rank sends) pairs, ascending in size (communication.py).
``gemm_rate`` is where a matmul's rate is read, the profile's or the preset's (the step's
matmuls, step_time.py; Muon's iteration, optimizer.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

from torchtitan_like.tools.planner.inputs import GPU, LayoutError

FORMAT = "ttl-hardware-profile/1"

_CURVES = ("intra_node_gbps_by_message", "attention_tflops_by_seq")
"""GPU fields that are tuples of (x, y) points."""


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    gpu: GPU
    gpus_per_node: int
    """Processes per node when it was measured (a link is intra-node up to this span)."""
    date: str
    host: dict[str, Any]
    path: str = ""
    pace: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    """The fixed probe's readings when it was measured (none in a profile written before it)."""

    def describe(self) -> str:
        """What the cluster line says of the profile."""
        host = self.host
        versions = ", ".join(f"{k} {host[k]}" for k in ("torch", "cuda", "driver") if host.get(k))
        return f"profile {self.path or '(unnamed)'} measured {self.date[:10]} ({versions})"


def gpu_to_dict(gpu: GPU) -> dict[str, Any]:
    """The GPU's fields as JSON values (tuples as lists)."""
    out = dataclasses.asdict(gpu)
    out["collective_gbps"] = {key: [list(p) for p in curve]
                              for key, curve in gpu.collective_gbps}
    out["gemm_tflops_by_dtype"] = dict(gpu.gemm_tflops_by_dtype)
    for name in _CURVES:
        out[name] = [list(point) for point in getattr(gpu, name)]
    return out


def _points(value: Any, what: str) -> tuple[tuple[float, float], ...]:
    try:
        points = tuple((float(x), float(y)) for x, y in value)
    except (TypeError, ValueError):
        raise LayoutError(f"hardware profile: {what} must be a list of [x, y] number pairs") \
            from None
    if any(b[0] <= a[0] for a, b in itertools.pairwise(points)) or \
            any(y <= 0 for _, y in points):
        raise LayoutError(f"hardware profile: {what} must ascend in x with positive rates")
    return points


def gpu_from_dict(fields: dict[str, Any]) -> GPU:
    """A GPU from a profile's ``gpu`` object; LayoutError names what is wrong."""
    known = {f.name for f in dataclasses.fields(GPU)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise LayoutError(f"hardware profile: unknown gpu field(s) {', '.join(unknown)}")
    values = dict(fields)
    try:
        values["collective_gbps"] = tuple(
            (str(key), _points(curve, f"collective_gbps[{key}]"))
            for key, curve in dict(values.get("collective_gbps", {})).items())
        values["gemm_tflops_by_dtype"] = tuple(
            (str(k), float(v)) for k, v in dict(values.get("gemm_tflops_by_dtype", {})).items())
    except (TypeError, ValueError):
        raise LayoutError("hardware profile: collective_gbps and gemm_tflops_by_dtype must be "
                          "objects") from None
    for name in _CURVES:
        values[name] = _points(values.get(name, []), name)
    try:
        return GPU(**values)
    except TypeError as e:
        raise LayoutError(f"hardware profile: gpu: {e}") from None


def load_profile(path: str | Path) -> HardwareProfile:
    """Read and check a profile; LayoutError (one line) when it cannot be used."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise LayoutError(f"hardware profile {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise LayoutError(f"hardware profile {path} is not JSON: {e.msg} (line {e.lineno})") \
            from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise LayoutError(f"hardware profile {path}: not a {FORMAT} file (write one with "
                          "ttl-plan --calibrate)")
    for key in ("date", "host", "processes", "gpu"):
        if key not in data:
            raise LayoutError(f"hardware profile {path}: no {key!r}")
    per_node = int(data["processes"].get("per_node", 1))
    return HardwareProfile(gpu_from_dict(data["gpu"]), max(1, per_node), str(data["date"]),
                           dict(data["host"]), str(path), _pace(data.get("pace", {})))


def _pace(value: Any) -> dict[str, list[float]]:
    """A profile's pace readings, checked: {figure: [positive readings]}."""
    try:
        pace = {str(key): [float(x) for x in readings] for key, readings in dict(value).items()}
        if all(readings and min(readings) > 0 for readings in pace.values()):
            return pace
    except (TypeError, ValueError):
        pass
    raise LayoutError("hardware profile: pace must map each probe figure to a list of positive "
                      "readings")


def write_profile(path: str | Path, record: dict[str, Any]) -> None:
    """Write a profile record (``gpu`` already a dict of ``gpu_to_dict``), checked by
    reading it back."""
    record = {"format": FORMAT, **record}
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    load_profile(path)


DTYPE_NAMES = {4: "float32", 2: "bfloat16"}
"""A compute dtype's name by its bytes, as ``GPU.gemm_tflops_by_dtype`` keys it."""


def gemm_rate(gpu: GPU, dtype: str) -> float:
    """FLOP/s of the weight matmuls in ``dtype``: measured at the job's shapes
    (``GPU.gemm_tflops_by_dtype``, a hardware profile) or the preset's share of its peak (the
    bf16 peak for any dtype but float8, the GPU's fp8 peak for float8)."""
    measured = dict(gpu.gemm_tflops_by_dtype)
    if dtype in measured:
        return measured[dtype] * 1e12
    peak = gpu.fp8_tflops if dtype == "float8" and gpu.fp8_tflops else gpu.peak_tflops
    return peak * 1e12 * gpu.gemm_efficiency
