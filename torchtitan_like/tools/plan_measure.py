"""What ``ttl-plan --calibrate`` and ``ttl-plan --verify`` do around the plan: start the
measuring processes on this node through the project's launcher (or measure here when already
under torchrun), and for --verify set the measurement beside the plan and keep the pair
(tools/calibrate.py measures the machine, tools/verify.py the job)."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from torchtitan_like.tools.pace import pace_lines, pace_ratios, step_shift
from torchtitan_like.tools.planner import Cluster, Layout, LayoutError, ModelShape, Plan, Workload
from torchtitan_like.tools.planner.hardware import load_profile
from torchtitan_like.tools.verify import (
    LAUNCH_ENV,
    append_history,
    comparison,
    history_lines,
    launch_command,
    measure,
    report_lines,
    summarize,
)

GiB = 2**30


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ


def add_flags(p: argparse.ArgumentParser) -> None:
    """ttl-plan's flags for measuring this machine and the job."""
    check = p.add_argument_group("measure this machine and the job (one node; a --config "
                                 "job's trainer overrides go after --)")
    check.add_argument("--calibrate", metavar="PROFILE", help="measure matmul, attention, "
                       "element-wise and collective rates at the job's shapes on --num_gpus "
                       "processes and write a hardware profile (under torchrun: on its ranks)")
    check.add_argument("--verify", action="store_true", help="run a few steps of the --config "
                       "job with the real trainer on --num_gpus processes and print predicted "
                       "vs measured tokens/s, step terms and peak memory (with --calibrate: "
                       "measure the machine first, in the same launch, and predict with it)")
    check.add_argument("--verify_steps", type=int, default=4, help="timed steps")
    check.add_argument("--verify_warmup", type=int, default=2, help="untimed steps first")
    check.add_argument("--history", default="ttl_plan_history.jsonl", help="the file --verify "
                       "appends to and whose error ttl-plan reports")


JOB_FLAGS = ("seq_len", "global_batch", "dtype", "param_dtype", "reduce_dtype", "state_dtype",
             "optimizer_implementation")
"""Planner flags that change a job: --verify refuses them (the trainer would not see them)."""


def check_flags(args: argparse.Namespace, pins: dict[str, Any]) -> None:
    """--calibrate and --verify run on this node's processes (under torchrun: its world);
    --verify runs the config's job as the trainer will, so its changes are trainer overrides."""
    if args.overrides and not args.config:
        raise LayoutError("trainer overrides after -- need --config")
    if under := under_torchrun():
        args.num_gpus = int(os.environ["WORLD_SIZE"])
        args.gpus_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", args.num_gpus))
    if args.verify and (under or args.search):
        raise LayoutError("--verify launches its own processes: not with --search or under "
                          "torchrun")
    if not args.verify:
        return
    changed = [f"--{name}" for name in JOB_FLAGS if getattr(args, name) is not None]
    changed += [f"--{name}" for name in pins]
    if not args.config or changed:
        raise LayoutError("--verify runs the --config job as the trainer will: give its "
                          "changes as trainer overrides after -- (e.g. -- --training.seq_len "
                          f"1024){', not ' + ' '.join(changed) if changed else ''}")


def _one_node(cluster: Cluster, flag: str) -> int:
    """The processes ttl-plan launches on this node for ``flag``."""
    if cluster.num_nodes > 1:
        raise LayoutError(f"{flag} launches on this node: --num_gpus at most --gpus_per_node "
                          "(on several nodes, run ttl-plan --calibrate under torchrun on each)")
    return cluster.num_gpus


def calibrate(args: argparse.Namespace, argv: list[str], model: ModelShape, work: Workload,
              layout: Layout, cluster: Cluster) -> int:
    """Measure here under torchrun; else launch ttl-plan itself on the plan's processes of
    this node (its argv unchanged) and return the launch's exit code."""
    if not under_torchrun():
        nproc = _one_node(cluster, "--calibrate")
        command = launch_command(nproc, "torchtitan_like.tools.plan_cli", argv)
        return subprocess.run(command, env={**LAUNCH_ENV, **os.environ}).returncode
    from torchtitan_like.tools.calibrate import run

    job = {"model": args.model, "flavor": args.flavor, "config": args.config,
           "overrides": args.overrides, "command": "ttl-plan " + shlex.join(argv)}
    return run(model, work, layout, job, args.calibrate)


def predicted(result: Plan, cluster: Cluster) -> dict[str, Any]:
    """The plan's figures the verify run measures too: its compute is the device's work
    (and a CPU process's dispatch, on the same thread), the rest what the step waits for."""
    step = result.step
    compute = step.compute + step.grad_accumulation + step.optimizer \
        + (0.0 if cluster.gpu.host_overlaps_device else step.host)
    return {"tokens_per_second_per_gpu": result.tokens_per_second_per_gpu,
            "step_seconds": step.total, "compute_seconds": compute,
            "waiting_seconds": step.total - compute,
            "peak_gib_per_pipeline_rank": [t / GiB for t in result.stage_totals],
            "step_breakdown_seconds": step.parts()}


def verify(args: argparse.Namespace, argv: list[str],
           planned: Callable[[], tuple[Plan, Cluster, str]]) -> int:
    """Run the config's job for a few steps on this node (with ``--calibrate``, after
    measuring the machine in the same launch and planning with that profile); print the plan
    (``planned``: the plan, its cluster and report, computed after the launch), predicted
    against measured, append the pair to ``--history`` and print the planner's error on it."""
    trainer_args = ["--job.config_file", args.config, *args.overrides]
    job = {"config": args.config, "overrides": args.overrides,
           "command": "ttl-plan " + shlex.join(argv)}
    given = args.hardware, args.gpus_per_node  # (the profile --calibrate writes: not yet)
    args.hardware = None if args.calibrate else args.hardware
    nproc = _one_node(planned()[1], "--verify")
    args.hardware, args.gpus_per_node = given
    try:
        runs = measure(trainer_args, nproc, args.verify_steps, args.verify_warmup,
                       calibrate={"out": args.calibrate, "job": job} if args.calibrate else None)
    except RuntimeError as e:
        print(f"verify error: {e}", file=sys.stderr)
        return 1
    if args.calibrate:
        args.hardware = args.calibrate
    result, cluster, report = planned()
    print(report)
    measured = summarize(runs, result.layout.pp)
    expected = predicted(result, cluster)
    ratios = comparison(expected, measured)
    print(f"Verify: {result.layout.label()} on {cluster.num_gpus} x {cluster.gpu.name}, "
          f"{args.verify_steps} timed steps after {args.verify_warmup} (fastest step)")
    print("\n".join(report_lines(expected, measured, ratios)))
    pace = pace_ratios(load_profile(args.hardware).pace, measured["pace"]) \
        if args.hardware else {}
    shift = step_shift(pace, expected["step_breakdown_seconds"])
    for line in pace_lines(pace, shift, args.hardware):  # none without the profile's readings
        print(line)
    append_history(args.history, {
        **job, "layout": result.layout.label(), "processes": cluster.num_gpus,
        "hardware": args.hardware or f"preset {args.gpu}", "gpu": cluster.gpu.name,
        "predicted": expected, "measured": measured, "ratios": ratios, "pace_ratios": pace,
        "pace_shift": shift})
    print("\n".join(history_lines(args.history)))
    return 0
