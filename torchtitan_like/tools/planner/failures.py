"""What failures cost a run, beside its checkpoint interval: a whole-job restart from the
latest checkpoint against replica groups that heal from a live peer (docs/fault-tolerance.md).

First-order expected costs (failures rare against one checkpoint interval), with failures
arriving at rate lambda = num_gpus / MTTF of one GPU, a step of t seconds, a checkpoint every
I steps that blocks the loop c seconds:

- **restart** (torchrun's MAX_RESTARTS): every failure stops the whole job for its restart R
  and loses the work since the latest checkpoint, I t / 2 on average. Lost share of the time:
  c / (I t) + lambda (R + I t / 2); the interval that minimises it is Young's
  sqrt(2 c / lambda) / t steps.
- **replica groups** (``[fault_tolerance]``, G = dp_replicate groups): a failure takes one
  group out for R + H (H: healing, its state shard over the link between groups); the other
  G - 1 go on, so 1/G of the job is lost for that time; every group also waits out the
  lighthouse's heartbeat timeout h, redoes the interrupted step t and waits the healing H at
  the rejoining step's quorum. Lost share: c / (I t) + lambda ((R + H) / G + h + t + H), the
  checkpoints kept for whole-job restarts.
- ``min_replica_size``: groups are down at once as a Poisson count of mean lambda (R + H)
  (Little's law); the largest min_replica_size whose quorum misses it at most 1% of the time,
  and at most G - 1 (the lost share above assumes that the survivors of a failure go on).
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class FailureInputs:
    num_gpus: int
    gpu_mttf_hours: float
    """Mean time to failure of one GPU (with its share of host, network, software)."""
    step_seconds: float
    checkpoint_interval: int
    """Steps between persistent checkpoints."""
    checkpoint_seconds: float
    """Time one save blocks the training loop."""
    restart_seconds: float
    """A job's (or a group's) start-up to its first step: scheduling, imports, load."""
    state_bytes_per_gpu: float
    """Master weights and optimizer states one rank holds: what a healing rank receives."""
    link_gbps: float
    """GB/s per GPU between replica groups (the inter-node links)."""
    groups: int
    """Replica groups (the layout's dp_replicate)."""
    heartbeat_seconds: float = 5.0
    """The lighthouse's heartbeat timeout (torchft's default 5 s)."""


@dataclasses.dataclass(frozen=True)
class FailureCost:
    failures_per_day: float
    restart_lost_share: float
    """Share of the run's time lost with restarts from checkpoints, at the given interval."""
    best_interval: int
    """Young's interval in steps (restarts)."""
    best_lost_share: float
    heal_seconds: float
    groups_lost_share: float
    """Share lost with replica groups that heal (groups > 1), at the given interval."""
    min_replica_size: int


def _poisson_quantile(mean: float, tail: float = 0.01) -> int:
    """The smallest k with P(N > k) <= ``tail`` for N ~ Poisson(``mean``)."""
    k, term = 0, math.exp(-mean)
    cumulative = term
    while 1 - cumulative > tail:
        k += 1
        term *= mean / k
        cumulative += term
    return k


def failure_cost(f: FailureInputs) -> FailureCost:
    """The expected costs of the module docstring for one run."""
    if min(f.num_gpus, f.gpu_mttf_hours, f.step_seconds, f.checkpoint_interval, f.groups) <= 0:
        raise ValueError("failure pricing needs positive GPUs, MTTF, step time, checkpoint "
                         "interval and groups")
    rate = f.num_gpus / (f.gpu_mttf_hours * 3600)

    def checkpoint_share(interval: float) -> float:
        return f.checkpoint_seconds / (interval * f.step_seconds)

    def restart_share(interval: float) -> float:
        lost = f.restart_seconds + interval * f.step_seconds / 2
        return checkpoint_share(interval) + rate * lost

    young = math.sqrt(2 * f.checkpoint_seconds / rate) / f.step_seconds
    best = max(1, round(young))
    heal = f.state_bytes_per_gpu / (f.link_gbps * 1e9)
    per_failure = ((f.restart_seconds + heal) / f.groups + f.heartbeat_seconds
                   + f.step_seconds + heal)
    down = _poisson_quantile(rate * (f.restart_seconds + heal))
    return FailureCost(
        failures_per_day=rate * 86400,
        restart_lost_share=restart_share(f.checkpoint_interval),
        best_interval=best,
        best_lost_share=restart_share(best),
        heal_seconds=heal,
        groups_lost_share=checkpoint_share(f.checkpoint_interval) + rate * per_failure,
        min_replica_size=max(1, min(f.groups - 1, f.groups - down)),
    )


def failure_lines(f: FailureInputs, cost: FailureCost) -> list[str]:
    """The report's lines (ttl-plan --gpu_mttf_hours)."""
    mttf_h = f.gpu_mttf_hours / f.num_gpus
    lines = [
        f"Failures: {cost.failures_per_day:.1f} a day on {f.num_gpus} GPUs (job MTTF "
        f"{mttf_h:.2f} h at {f.gpu_mttf_hours:,.0f} h per GPU); a restart "
        f"{f.restart_seconds:.0f} s, a checkpoint blocks {f.checkpoint_seconds:g} s",
        f"  restart from checkpoints every {f.checkpoint_interval} steps: "
        f"{cost.restart_lost_share:.1%} of the time lost (Young's interval "
        f"{cost.best_interval} steps: {cost.best_lost_share:.1%})",
    ]
    if f.groups > 1:
        lines += [
            f"  {f.groups} replica groups that heal ([fault_tolerance]): "
            f"{cost.groups_lost_share:.1%} lost; healing moves "
            f"{f.state_bytes_per_gpu / 2**30:.2f} GiB per GPU in {cost.heal_seconds:.2f} s at "
            f"{f.link_gbps:g} GB/s; min_replica_size {cost.min_replica_size} (a quorum "
            "missing it <= 1% of the time)",
        ]
    else:
        lines.append("  replica groups: the layout has dp_replicate 1; with --dp_replicate G "
                     "each of G groups could fail alone and heal from a peer")
    return lines
