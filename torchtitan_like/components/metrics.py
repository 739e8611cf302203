"""Per-step training metrics to the console, ``{dump_folder}/metrics.jsonl`` and the trackers
(TensorBoard, W&B, MLflow: components/trackers.py), which receive exactly the file's records.

Throughput follows TorchTitan: ``tokens_per_second`` is per device, i.e. the tokens this rank's
model replica consumed divided by time and by the devices that replica spans (pp x cp x tp);
``tokens_per_second_total`` is for the whole job. TFLOP/s = flops_per_token x tokens_per_second,
and MFU = TFLOP/s / peak (``mfu_peak_tflops`` in every record says which peak was used).

The peak is ``[metrics] peak_tflops``, else a table of known GPUs (dense bf16), else, on a CPU,
the best of several matmul timings: in the compute dtype, and for a 16-bit one in float32 too,
the peak being the faster of the two. A CPU without AVX512-BF16/AMX runs bf16 matmuls on slow
fallback kernels (1-3 GFLOP/s against float32's ~100; ``ONEDNN_MAX_CPU_ISA=AVX2`` shows it on
any x86 CPU, ``ATEN_CPU_CAPABILITY=avx2`` does not: oneDNN, not ATen, picks the bf16 kernel),
so a bf16 job there is named in one warning line with both rates and the float32 alternative,
and measured against float32's rate, the machine's real capability (against the bf16 rate it
read 498%). Whatever the source, MFU never exceeds 100%: the peak cannot be below what the run
achieves, so a window that computes faster than the peak raises the peak to its own rate
(from then on, with one warning naming both rates and ``[metrics] peak_tflops``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from torchtitan_like.components.progress import Progress
from torchtitan_like.components.storage import writing
from torchtitan_like.components.trackers import TensorBoardTracker, Tracker, build_trackers
from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.manager import to_toml
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.logging import logger
from torchtitan_like.protocols.model_args import BaseModelArgs

# Dense bf16 TFLOP/s (no sparsity) per device, by a substring of torch.cuda.get_device_name().
GPU_PEAK_TFLOPS = {
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.0,
    "H200": 989.0,
    "H800": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "L40S": 362.0,
    "MI300X": 1307.0,
}


SLOW_DTYPE_RATIO = 2.0
"""A 16-bit compute dtype whose matmuls run at less than 1/this of float32's is named slow."""


@functools.cache
def measure_cpu_tflops(dtype: torch.dtype, n: int = 1024, runs: int = 5,
                       min_seconds: float = 0.2, budget_seconds: float = 2.0) -> float:
    """Matmul throughput of this CPU (with torch's threads) in ``dtype``: a practical peak.

    The best of ``runs`` timings, each of enough matmuls to last ``min_seconds``: a busy
    machine only ever slows a run down, so the fastest is the closest to the peak. Runs stop
    once ``budget_seconds`` are spent (a slow dtype's one matmul can take seconds). Cached:
    measured once per process and dtype."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    iters, best, spent = 1, 0.0, 0.0
    for _ in range(runs):
        if spent >= budget_seconds:
            break
        while True:
            start = time.perf_counter()
            for _ in range(iters):
                a @ b
            seconds = time.perf_counter() - start
            if seconds >= min_seconds:
                break
            iters *= 2
        spent += seconds
        best = max(best, 2 * n**3 * iters / seconds / 1e12)
    return best


def peak_tflops(
    device: torch.device, configured: float, compute_dtype: torch.dtype
) -> float | None:
    if configured > 0:
        return configured
    if device.type == "cpu":
        return cpu_peak_tflops(compute_dtype)
    name = torch.cuda.get_device_name(device)
    for key, tflops in GPU_PEAK_TFLOPS.items():
        if key in name:
            return tflops
    logger.warning(f"MFU unavailable: no peak known for {name!r}; set [metrics] peak_tflops")
    return None


def cpu_peak_tflops(compute_dtype: torch.dtype) -> float:
    """This CPU's peak for the job's matmuls: the faster of the compute dtype's measured rate
    and, for a 16-bit compute dtype, float32's (module docstring); one warning line when the
    compute dtype is the slow one."""
    measured = measure_cpu_tflops(compute_dtype)
    fp32 = measured if compute_dtype == torch.float32 else measure_cpu_tflops(torch.float32)
    name = str(compute_dtype).removeprefix("torch.")
    if fp32 > SLOW_DTYPE_RATIO * measured:
        logger.warning(
            f'[training] mixed_precision_param = "{name}" is slow on this CPU: {name} matmuls '
            f"run at {measured * 1e3:.3g} GFLOP/s, float32's at {fp32 * 1e3:.3g} (no "
            f"AVX512-BF16/AMX kernels), so this job computes up to {fp32 / measured:.0f}x "
            'slower than with mixed_precision_param = "float32"; MFU is against the float32 rate')
    peak = max(measured, fp32)
    logger.info(f"MFU peak: measured {peak:.3f} TFLOP/s ({'float32' if peak == fp32 else name} "
                "matmul on this CPU, best of up to 5 timings); set [metrics] peak_tflops to use "
                "another")
    return peak


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
        total_steps: int = 0,
        trackers: list[Tracker] | None = None,
        config_toml: str = "",
    ):
        self.device = device
        self.flops_per_token = flops_per_token
        self.peak = peak
        self.replica_devices = replica_devices
        self.world_size = world_size
        self.progress = Progress(total_steps, resume_step) if total_steps else None
        self.writer = writer
        self.dump_folder = Path(dump_folder)
        self.tb_folder = tb_folder if enable_tensorboard else None
        self.resume_step = resume_step
        self.jsonl = None
        self.trackers = list(trackers or [])  # W&B, MLflow: started at the first record
        self.config_toml = config_toml  # the run's merged config, written beside its metrics
        self.warned_mfu = False
        self.reset()

    def _open(self) -> None:
        """Open the files at the first record, when the job has started: a job that fails
        before (config, data, checkpoint loading) leaves an earlier run's metrics intact."""
        path = self.dump_folder / "metrics.jsonl"
        resume_step = self.resume_step
        with writing("metrics.jsonl", path):
            self.dump_folder.mkdir(parents=True, exist_ok=True)
            if resume_step > 0:
                self._truncate(path, resume_step)
            self.jsonl = open(path, "a" if resume_step > 0 else "w")  # noqa: SIM115
        if self.tb_folder is not None:
            # purge_step drops the events of the steps after resume_step the same way.
            purge = resume_step + 1 if resume_step > 0 else None
            folder = self.dump_folder / self.tb_folder
            with writing("TensorBoard events", folder):
                self.trackers.insert(0, TensorBoardTracker(folder, purge))
        if resume_step > 0:
            self._record({"step": resume_step, "resumed": True})

    @staticmethod
    def _truncate(path: Path, resume_step: int) -> None:
        """A run resuming after ``resume_step`` continues the file from there: records of later
        steps (logged before a failure, and recomputed now) are dropped, so that every step
        appears once, and a ``{"step": resume_step, "resumed": true}`` record marks the restart.
        A line cut short by a kill (the last one), or one that is no record (valid JSON
        without an integer ``step``: ``{}``, ``null``), is dropped with a warning."""
        if not path.exists():
            return
        kept = []
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                logger.warning(f"{path}:{line_no}: dropped a torn record {line[:60]!r}")
                continue
            step = record.get("step") if isinstance(record, dict) else None
            if not isinstance(step, int) or isinstance(step, bool):
                logger.warning(f"{path}:{line_no}: dropped a line that is no record {line[:60]!r}")
                continue
            if step <= resume_step:
                kept.append(line)
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)

    def reset(self) -> None:
        self.window_start = time.perf_counter()
        self.tokens = 0
        self.data_seconds = 0.0
        self.paused_seconds = {"checkpoint": 0.0, "validation": 0.0}

    def add_step(self, tokens: int, data_seconds: float) -> None:
        """Account one step's tokens (of this rank's replica) and its data-loading time."""
        if self.progress is not None:
            self.progress.step_started()
        self.tokens += tokens
        self.data_seconds += data_seconds

    @contextlib.contextmanager
    def paused(self, kind: str) -> Iterator[None]:
        """Time spent outside training steps (``checkpoint`` saves, ``validation``): left out
        of the window's throughput and recorded as ``<kind>_seconds`` instead."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.paused_seconds[kind] += time.perf_counter() - start

    def log(self, step: int, values: dict[str, Any], console: list[str] = ()) -> dict[str, Any]:
        """Write a training record: ``values`` (loss, grad_norm, lr, the model's own metrics
        from protocols/step_hooks.py, ...) plus throughput and, with ``total_steps``,
        progress (``tokens_seen`` in values is shown when given); the ``console`` names among
        ``values`` are shown on the console line too."""
        seconds = time.perf_counter() - self.window_start - sum(self.paused_seconds.values())
        tps = self.tokens / seconds / self.replica_devices
        tflops = self.flops_per_token * tps / 1e12
        self._raise_peak_to(tflops)
        progress = {} if self.progress is None else self.progress.fields(step)
        record = {
            "step": step,
            **values,
            "tokens_per_second": tps,
            "tokens_per_second_total": tps * self.world_size,
            "tflops": tflops,
            "mfu": 100 * (tflops / self.peak) if self.peak else None,  # exactly 100 at the peak
            "mfu_peak_tflops": self.peak,
            "memory_gib": peak_memory_gib(self.device),
            "data_loading_percent": 100 * self.data_seconds / seconds,
            **{f"{kind}_seconds": paused for kind, paused in self.paused_seconds.items()},
            **progress,
        }
        mfu = f"{record['mfu']:.2f}%" if record["mfu"] is not None else "n/a"
        where = (f"step {step:5d}" if self.progress is None else
                 self.progress.text(step, progress, values.get("tokens_seen")))
        logger.info(
            f"{where}  loss {values['loss']:8.4f}  grad_norm {values['grad_norm']:7.4f}  "
            f"lr {values['lr']:.2e}  tps {tps:,.0f}  tflops {tflops:.3f}  mfu {mfu}  "
            f"memory {record['memory_gib']:.2f}GiB  data {record['data_loading_percent']:.1f}%"
            + "".join(f"  {name} {values[name]:.4g}" for name in console)
        )
        self._write(step, record)
        self.reset()
        return record

    def _raise_peak_to(self, tflops: float) -> None:
        """MFU never exceeds 100%: a peak below what the run achieves is raised to it (module
        docstring), with one warning."""
        if self.peak is None or tflops <= self.peak:
            return
        if not self.warned_mfu:
            self.warned_mfu = True
            logger.warning(f"MFU: this run computes {tflops:.4g} TFLOP/s, above the peak of "
                           f"{self.peak:.4g}: the peak is raised to the rate achieved (MFU "
                           "100%); set [metrics] peak_tflops to this device's real peak")
        self.peak = tflops

    def log_validation(self, step: int, loss: float) -> dict[str, Any]:
        perplexity = float(torch.tensor(loss).exp())
        record = {"step": step, "validation_loss": loss, "validation_perplexity": perplexity}
        logger.info(f"step {step:5d}  validation loss {loss:.4f}  perplexity {perplexity:.2f}")
        self._write(step, record)
        return record

    def log_event(self, record: dict[str, Any]) -> None:
        """An event record (e.g. a loss spike, components/spikes.py) of ``record["step"]``."""
        self._write(record["step"], record)

    def _write(self, step: int, record: dict[str, Any]) -> None:
        if self.writer and self.jsonl is None:
            self._open()
            if self.config_toml:  # runnable again: --job.config_file dump_folder/config.toml
                config = self.dump_folder / "config.toml"
                with writing("the config copy", config):
                    config.write_text(self.config_toml)
        if self.jsonl is not None:
            self._record(record)

    def _record(self, record: dict[str, Any]) -> None:
        """One line of metrics.jsonl, and the same record to every tracker (a write that
        fails for good: one StorageError naming the file, components/storage.py)."""
        with writing("metrics.jsonl", self.dump_folder / "metrics.jsonl"):
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
        for tracker in self.trackers:
            with writing(tracker.what):
                tracker.log(record["step"], record)

    def where(self) -> str:
        """Where this run's records are, for the job's last console line."""
        jsonl = f"metrics in {self.dump_folder}/metrics.jsonl"
        if self.tb_folder is None:
            return jsonl
        return f"{jsonl}, TensorBoard: tensorboard --logdir {self.dump_folder}/{self.tb_folder}"

    def close(self) -> None:
        """Close the file and the trackers (again: a no-op; TensorBoard's buffered events are
        written). Nothing is written, or reopened, afterwards."""
        self.writer = False
        closing = [(tracker.what, tracker.close) for tracker in self.trackers]
        if self.jsonl is not None:
            closing.insert(0, (f"metrics.jsonl ({self.dump_folder / 'metrics.jsonl'})",
                               self.jsonl.close))
        self.jsonl, self.trackers = None, []
        failures = []
        for what, close in closing:  # each one, whatever the others do
            try:
                with writing(what):
                    close()
            except Exception as e:
                failures.append(e)
        if failures:
            raise failures[0]


def build_metrics(config: JobConfig, parallel_dims: ParallelDims, model_args: BaseModelArgs,
                  device: torch.device, rank: int, step: int) -> MetricsLogger:
    """The job's metrics logger: rank 0 writes (and feeds the trackers); a run resumed at
    ``step`` continues its metrics.jsonl."""
    m, training = config.metrics, config.training
    return MetricsLogger(
        dump_folder=config.job.dump_folder,
        writer=rank == 0,
        enable_tensorboard=m.enable_tensorboard,
        tb_folder=m.save_tb_folder,
        device=device,
        flops_per_token=model_args.flops_per_token(training.seq_len),
        peak=peak_tflops(device, m.peak_tflops, DTYPES[training.mixed_precision_param]),
        replica_devices=parallel_dims.non_data_parallel_size,
        world_size=parallel_dims.world_size,
        resume_step=step,
        total_steps=training.steps,
        trackers=build_trackers(config, step) if rank == 0 else [],
        config_toml=to_toml(config),
    )
