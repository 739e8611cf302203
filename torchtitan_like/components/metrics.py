"""Per-step training metrics to the console, TensorBoard and ``{dump_folder}/metrics.jsonl``.

Throughput follows TorchTitan: ``tokens_per_second`` is per device, i.e. the tokens this rank's
model replica consumed divided by time and by the devices that replica spans (pp x cp x tp);
``tokens_per_second_total`` is for the whole job. TFLOP/s = flops_per_token x tokens_per_second,
and MFU = TFLOP/s / peak, the peak coming from ``[metrics] peak_tflops``, else a table of
known GPUs (dense bf16), else, on a CPU, a matmul measured at start-up in the compute dtype.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import torch

from torchtitan_like.logging import logger

# Dense bf16 TFLOP/s (no sparsity) per device, by a substring of torch.cuda.get_device_name().
GPU_PEAK_TFLOPS = {
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.0,
    "H200": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "L40S": 362.0,
    "MI300X": 1307.0,
}


def measure_cpu_tflops(dtype: torch.dtype, n: int = 1024, iters: int = 8) -> float:
    """Matmul throughput of this CPU (with torch's threads) in ``dtype``: a practical peak."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(2):
        a @ b
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    return 2 * n**3 * iters / (time.perf_counter() - start) / 1e12


def peak_tflops(
    device: torch.device, configured: float, compute_dtype: torch.dtype
) -> float | None:
    if configured > 0:
        return configured
    if device.type == "cpu":
        measured = measure_cpu_tflops(compute_dtype)
        logger.info(f"MFU peak: measured {measured:.3f} TFLOP/s ({compute_dtype} matmul on this "
                    "CPU); set [metrics] peak_tflops to use another")
        return measured
    name = torch.cuda.get_device_name(device)
    for key, tflops in GPU_PEAK_TFLOPS.items():
        if key in name:
            return tflops
    logger.warning(f"MFU unavailable: no peak known for {name!r}; set [metrics] peak_tflops")
    return None


def peak_memory_gib(device: torch.device) -> float:
    """CUDA: peak allocated by tensors. CPU: peak resident set size of the process."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


class MetricsLogger:
    """Accumulates timings between log steps and writes one record per logged step.

    Only rank 0 (``writer``) writes files; every rank prints, torchrun shows LOG_RANK's lines.
    """

    def __init__(
        self,
        *,
        dump_folder: str,
        writer: bool,
        enable_tensorboard: bool,
        tb_folder: str,
        device: torch.device,
        flops_per_token: int,
        peak: float | None,
        replica_devices: int,
        world_size: int,
        resume_step: int = 0,
    ):
        self.device = device
        self.flops_per_token = flops_per_token
        self.peak = peak
        self.replica_devices = replica_devices
        self.world_size = world_size
        self.jsonl = None
        self.tensorboard = None
        if writer:
            Path(dump_folder).mkdir(parents=True, exist_ok=True)
            path = Path(dump_folder) / "metrics.jsonl"
            if resume_step > 0:
                self._truncate(path, resume_step)
            self.jsonl = open(path, "a" if resume_step > 0 else "w")  # noqa: SIM115
            if enable_tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step drops the events of the steps after resume_step the same way.
                purge = resume_step + 1 if resume_step > 0 else None
                self.tensorboard = SummaryWriter(Path(dump_folder) / tb_folder, purge_step=purge)
            if resume_step > 0:
                self.jsonl.write(json.dumps({"step": resume_step, "resumed": True}) + "\n")
        self.reset()

    @staticmethod
    def _truncate(path: Path, resume_step: int) -> None:
        """A run resuming after ``resume_step`` continues the file from there: records of later
        steps (logged before a failure, and recomputed now) are dropped, so that every step
        appears once, and a ``{"step": resume_step, "resumed": true}`` record marks the restart."""
        if not path.exists():
            return
        kept = [line for line in path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= resume_step]
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)

    def reset(self) -> None:
        self.window_start = time.perf_counter()
        self.tokens = 0
        self.data_seconds = 0.0

    def add_step(self, tokens: int, data_seconds: float) -> None:
        """Account one step's tokens (of this rank's replica) and its data-loading time."""
        self.tokens += tokens
        self.data_seconds += data_seconds

    def log(self, step: int, values: dict[str, Any], console: list[str] = ()) -> dict[str, Any]:
        """Write a training record: ``values`` (loss, grad_norm, lr, the model's own metrics
        from components/model_hooks.py, ...) plus throughput; the ``console`` names among
        ``values`` are shown on the console line too."""
        seconds = time.perf_counter() - self.window_start
        tps = self.tokens / seconds / self.replica_devices
        tflops = self.flops_per_token * tps / 1e12
        record = {
            "step": step,
            **values,
            "tokens_per_second": tps,
            "tokens_per_second_total": tps * self.world_size,
            "tflops": tflops,
            "mfu": 100 * tflops / self.peak if self.peak else None,
            "memory_gib": peak_memory_gib(self.device),
            "data_loading_percent": 100 * self.data_seconds / seconds,
        }
        mfu = f"{record['mfu']:.2f}%" if record["mfu"] is not None else "n/a"
        logger.info(
            f"step {step:5d}  loss {values['loss']:8.4f}  grad_norm {values['grad_norm']:7.4f}  "
            f"lr {values['lr']:.2e}  tps {tps:,.0f}  tflops {tflops:.3f}  mfu {mfu}  "
            f"memory {record['memory_gib']:.2f}GiB  data {record['data_loading_percent']:.1f}%"
            + "".join(f"  {name} {values[name]:.4g}" for name in console)
        )
        self._write(step, record)
        self.reset()
        return record

    def log_validation(self, step: int, loss: float) -> dict[str, Any]:
        perplexity = float(torch.tensor(loss).exp())
        record = {"step": step, "validation_loss": loss, "validation_perplexity": perplexity}
        logger.info(f"step {step:5d}  validation loss {loss:.4f}  perplexity {perplexity:.2f}")
        self._write(step, record)
        return record

    def _write(self, step: int, record: dict[str, Any]) -> None:
        if self.jsonl is not None:
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
        if self.tensorboard is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(key, value, step)

    def close(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
