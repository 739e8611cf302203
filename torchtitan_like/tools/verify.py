"""``ttl-plan --verify``: run a few steps of the planned job with the real trainer, set the
measurement beside the prediction, and keep the pair in a history file (JSONL) whose error the
planner reports (``history_lines``), so a team sees how far to trust it on its own machine.

The job runs as its own torchrun launch of this module (``python -m torchtitan_like.launch
--standalone --nproc_per_node N -m torchtitan_like.tools.verify SPEC OUT``: the project's
launcher, as run_train.sh uses). Each rank builds the trainer of the job's config, trains
``warmup`` steps, then ``steps`` timed steps on fresh copies of one fixed batch, each between
barriers (tools/bench_runner.py: ``timed_steps``), then one more step whose peak tensor memory
it measures: MemTracker on a CPU (tools/memory.py: ``measure_train_step``), CUDA's
``max_memory_allocated`` on a GPU. Measured step terms:

- **step**: the fastest timed step's wall seconds (on a shared machine the least disturbed);
- **compute** (CPU): the busiest rank's main-thread CPU seconds in that step: a CPU process
  computes on its main thread, and its waits (gloo's transfers, a pipeline's idle slots) leave
  that thread's clock still; **waiting** is the step less it: exposed communication, bubble and
  whatever else stalls the step (the planner's exposed communication + bubble);
- on a GPU the trainer's work is asynchronous to the host: compute is not separated there
  (only the step, tokens/s and memory are compared);
- **pace**: calibrate.py's fixed probe before the first step and after the timed ones. Set
  against the profile's readings (tools/pace.py) it says whether the machine still runs as it
  did when measured: on a shared host the same code runs 1.5-3x slower for an hour at a time
  (docs/measurements.md), which a prediction from a profile of the other state cannot know.

The record appended to the history: the date, the host, the config and command, the hardware
profile (or preset) the prediction used, the predicted and measured figures and their ratios,
and the pace against the profile with the step shift it makes (tools/pace.py).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torchtitan_like.launch import torchrun_argv
from torchtitan_like.tools.pace import paced

LAUNCH_ENV = {"TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1", "PYTHONWARNINGS": "ignore"}


def launch_command(nproc: int, module: str, args: list[str]) -> list[str]:
    """The launch of ``module`` on one node through the project's launcher, as run_train.sh
    launches the trainer (its threads too: torchrun's default, one per process when
    several)."""
    return torchrun_argv(nproc, "-m", module, *args, max_restarts=0,
                         launcher="torchtitan_like.launch")


def measure(overrides: list[str], nproc: int, steps: int, warmup: int,
            calibrate: dict[str, Any] | None = None) -> dict[str, Any]:
    """Launch the job on ``nproc`` processes of this node; what its ranks measured (with
    ``calibrate`` {"out": profile path, "job": what to record}, the ranks first measure the
    machine at the job's shapes and write the profile: tools/calibrate.py). Raises
    RuntimeError with the end of the launch's output when it fails."""
    with tempfile.TemporaryDirectory(prefix="ttl-verify-") as tmp:
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "measured.json"
        spec.write_text(json.dumps({"overrides": [*overrides, "--job.dump_folder",
                                                  str(Path(tmp) / "job")],
                                    "steps": steps, "warmup": warmup,
                                    "calibrate": calibrate}))
        env = {**LAUNCH_ENV, **os.environ}
        proc = subprocess.run(launch_command(nproc, "torchtitan_like.tools.verify",
                                             [str(spec), str(out)]),
                              env=env, capture_output=True, text=True)
        if proc.returncode or not out.exists():
            raise RuntimeError(f"the verify run failed (exit {proc.returncode}):\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def _peak_bytes(trainer: Any) -> float:
    """Peak tensor bytes of one more step on this rank."""
    import torch

    if trainer.device.type == "cuda":
        data = iter(trainer.dataloader)
        torch.cuda.reset_peak_memory_stats(trainer.device)
        trainer.train_step([next(data) for _ in range(trainer.grad_accumulation_steps)])
        return float(torch.cuda.max_memory_allocated(trainer.device))
    from torchtitan_like.tools.memory import measure_train_step

    return float(measure_train_step(trainer)["Total"])


def worker(spec_file: str, out_file: str) -> None:
    """Inside the launch: build the trainer, time its steps, measure its peak; rank 0 writes
    every rank's figures."""
    import copy

    import torch.distributed as dist

    from torchtitan_like.distributed.lifecycle import exit_process
    from torchtitan_like.distributed.utils import init_distributed
    from torchtitan_like.tools.calibrate import measure_pace
    from torchtitan_like.train import Trainer
    from torchtitan_like.validate import parse_args

    spec = json.loads(Path(spec_file).read_text())
    device = init_distributed()
    config = parse_args(spec["overrides"], dist.get_world_size())
    if spec.get("calibrate"):
        _calibrate(config, device, spec["calibrate"])
    trainer = Trainer(config, device)
    data = iter(trainer.dataloader)
    batches = [next(data) for _ in range(trainer.grad_accumulation_steps)]
    steps, pace = [], [measure_pace(device)]
    for i in range(spec["warmup"] + spec["steps"]):
        fresh = copy.deepcopy(batches)  # CP shards a batch in place
        dist.barrier()
        start, busy = time.perf_counter(), time.thread_time()
        trainer.train_step(fresh)
        busy = time.thread_time() - busy
        if device.type == "cuda":
            import torch

            torch.cuda.synchronize(device)
        dist.barrier()
        if i >= spec["warmup"]:
            steps.append((time.perf_counter() - start, busy))
    pace.append(measure_pace(device))
    peak = _peak_bytes(trainer)
    mine = {"steps": steps, "peak_bytes": peak, "pace": pace,
            "tokens_per_rank_step": trainer.tokens_per_rank_step,
            "dp": trainer.parallel_dims.dp, "device": device.type}
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    trainer.metrics.close()
    if dist.get_rank() == 0:
        Path(out_file).write_text(json.dumps({"ranks": ranks}))
    exit_process(0)


def _calibrate(config: Any, device: Any, calibrate: dict[str, Any]) -> None:
    """Measure the machine at the job's shapes (the planner's own reading of the config) and
    write the profile from rank 0."""
    import torch.distributed as dist

    from torchtitan_like.tools.calibrate import calibrate as measure_machine
    from torchtitan_like.tools.planner import from_job_config
    from torchtitan_like.tools.planner.hardware import write_profile

    model, work, layout = from_job_config(config, dist.get_world_size())
    job = {**calibrate["job"], "model": config.model.name, "flavor": config.model.flavor}
    record = measure_machine(model, work, layout, device, job)
    if dist.get_rank() == 0:
        write_profile(calibrate["out"], record)


def summarize(measured: dict[str, Any], pp: int) -> dict[str, Any]:
    """The job's figures from every rank's: the fastest step (the same step on every rank,
    each timed between barriers), tokens/s per process, compute and waiting (CPU), the peak
    memory of each pipeline rank (the largest of its processes; PP is outermost)."""
    ranks = measured["ranks"]
    fastest = min(range(len(ranks[0]["steps"])), key=lambda i: max(r["steps"][i][0]
                                                                    for r in ranks))
    step = max(r["steps"][fastest][0] for r in ranks)
    tokens = ranks[0]["tokens_per_rank_step"] * ranks[0]["dp"]
    per_stage = len(ranks) // pp
    out: dict[str, Any] = {
        "step_seconds": step, "tokens_per_second_per_gpu": tokens / step / len(ranks),
        "peak_gib_per_pipeline_rank": [max(r["peak_bytes"] for r in ranks[s * per_stage:
                                                                          (s + 1) * per_stage])
                                       / 2**30 for s in range(pp)],
        "steps_seconds": [max(r["steps"][i][0] for r in ranks)
                          for i in range(len(ranks[0]["steps"]))]}
    out["pace"] = {key: [p[key] for p in ranks[0]["pace"]] for key in ranks[0]["pace"][0]}
    if ranks[0]["device"] == "cpu":
        compute = max(r["steps"][fastest][1] for r in ranks)
        out["compute_seconds"] = compute
        out["waiting_seconds"] = max(0.0, step - compute)
    return out


def comparison(predicted: dict[str, Any], measured: dict[str, Any]) -> dict[str, float]:
    """Predicted over measured of each figure both have."""
    ratios = {"tokens_per_second_per_gpu": predicted["tokens_per_second_per_gpu"]
              / measured["tokens_per_second_per_gpu"],
              "peak_memory": max(predicted["peak_gib_per_pipeline_rank"])
              / max(measured["peak_gib_per_pipeline_rank"])}
    for name in ("compute_seconds", "waiting_seconds"):
        if name in measured and measured[name] > 0:
            ratios[name.removesuffix("_seconds")] = predicted[name] / measured[name]
    return ratios


def report_lines(predicted: dict[str, Any], measured: dict[str, Any],
                 ratios: dict[str, float]) -> list[str]:
    """The printed table: predicted, measured, their ratio."""
    rows = [("tokens/s per GPU", "tokens_per_second_per_gpu", "{:,.1f}"),
            ("step seconds", "step_seconds", "{:.3f}"),
            ("compute seconds", "compute_seconds", "{:.3f}"),
            ("exposed comm. + bubble s", "waiting_seconds", "{:.3f}")]
    lines = [f"{'':26s} {'predicted':>12s} {'measured':>12s} {'pred/meas':>9s}"]
    for label, key, fmt in rows:
        if key in measured:
            ratio = predicted[key] / measured[key] if measured[key] else float("nan")
            lines.append(f"{label:26s} {fmt.format(predicted[key]):>12s} "
                         f"{fmt.format(measured[key]):>12s} {ratio:9.3f}")
    for s, (p, m) in enumerate(zip(predicted["peak_gib_per_pipeline_rank"],
                                   measured["peak_gib_per_pipeline_rank"], strict=True)):
        label = "peak memory GiB" + (f" (PP rank {s})" if len(measured[
            "peak_gib_per_pipeline_rank"]) > 1 else "")
        lines.append(f"{label:26s} {p:12.3f} {m:12.3f} {p / m:9.3f}")
    return lines


def append_history(path: str | Path, record: dict[str, Any]) -> None:
    record = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              **record}
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """The history's records (none when the file does not exist; unreadable lines skipped)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in records if isinstance(r, dict) and "ratios" in r]


def history_lines(path: str | Path) -> list[str]:
    """The planner's error on its history: per figure, the median and range of predicted over
    measured across the recorded runs, those whose machine was off its profile's pace left
    out (counted)."""
    records = read_history(path)
    if not records:
        return []
    steady = [r for r in records if paced(r.get("pace_shift", 0.0))]
    runs = f"{len(steady)} run(s)"
    if len(steady) < len(records):
        runs += f", {len(records) - len(steady)} more off their profile's pace left out"
    figures = []
    for key, label in (("tokens_per_second_per_gpu", "tokens/s"), ("peak_memory", "peak memory")):
        values = [r["ratios"][key] for r in steady if key in r["ratios"]]
        if values:
            figures.append(f"{label} predicted/measured median {statistics.median(values):.2f}, "
                           f"{min(values):.2f}-{max(values):.2f}")
    return [f"Verified on this machine ({path}, {runs})" + (": " if figures else "")
            + "; ".join(figures)]


if __name__ == "__main__":
    worker(*sys.argv[1:])
