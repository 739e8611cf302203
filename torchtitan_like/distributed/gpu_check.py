"""No silent CPU fallback: refuse to start when the machine has GPUs that torch cannot use.

``device_type()`` picks CUDA when ``torch.cuda.is_available()``, else the CPU and gloo. On a GPU
machine whose torch is a CPU wheel, or a CUDA wheel newer than the driver supports, that would
quietly "train" N CPU processes. So at start-up: if ``nvidia-smi -L`` lists GPUs but torch sees
none, the run stops with one line saying why and what to install (docs/gpu.md). GPUs hidden on
purpose (``CUDA_VISIBLE_DEVICES`` set to empty or -1, as run_tests.sh does) are not an error.

Run as ``python -m torchtitan_like.distributed.gpu_check`` (run_train.sh's preflight): exit 1
with the line on stderr when the check fails.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from torchtitan_like.config.errors import ConfigError


def _nvidia_smi(*args: str) -> list[str]:
    """Non-empty output lines of ``nvidia-smi args``; [] when it is absent or fails."""
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpus_hidden_on_purpose() -> bool:
    """``CUDA_VISIBLE_DEVICES`` set to nothing (or -1): the user asked for the CPU."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    return hidden is not None and hidden.strip() in ("", "-1")


def unusable_gpus_reason() -> str | None:
    """Why the listed GPUs are unusable by this torch, or None when all is well (torch sees a
    GPU, or none is listed, or they are hidden on purpose)."""
    if gpus_hidden_on_purpose() or torch.cuda.is_available():
        return None
    gpus = [line for line in _nvidia_smi("-L") if line.startswith("GPU ")]
    if not gpus:
        return None
    driver = (_nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader") or ["?"])[0]
    wheel_cuda = torch.version.cuda
    if wheel_cuda is None:
        why = (f"torch {torch.__version__} is a CPU-only build (torch.version.cuda = None); "
               "install a CUDA build")
    else:
        why = (f"torch {torch.__version__} is built for CUDA {wheel_cuda}, which NVIDIA driver "
               f"{driver} probably does not support (driver too old for the wheel); install the "
               "wheel for this driver, e.g. TORCH_INDEX_URL=https://download.pytorch.org/whl/"
               "cu126, or update the driver")
    return (f"nvidia-smi lists {len(gpus)} GPU(s) (driver {driver}) but torch cannot use them: "
            f"{why} (see docs/gpu.md); to run on the CPU on purpose set CUDA_VISIBLE_DEVICES=\"\"")


def require_usable_gpus() -> None:
    """ConfigError when the machine's GPUs are unusable by this torch (see the module doc)."""
    reason = unusable_gpus_reason()
    if reason is not None:
        raise ConfigError(reason)


if __name__ == "__main__":
    problem = unusable_gpus_reason()
    if problem is not None:
        print(f"preflight: {problem}", file=sys.stderr)
        sys.exit(1)
