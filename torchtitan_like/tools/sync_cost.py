"""What a synchronous tensor-parallel collective costs a CPU process beyond its transfer, measured
by ``ttl-plan --calibrate`` on the node's process group (tools/calibrate.py): two figures of a
hardware profile (inputs.GPU ``host_collective_s`` and ``sync_skew_s``).

Measured on issue 41's 100M TP 2 job (two processes on two cores, gloo): its main thread
computed 0.4-0.6 s a step more than the step's kernels at their calibrated rates, and the step
waited 0.3 s more than its 100 all-gathers and reduce-scatters cost alone. Neither is
contention slowing the kernels (the job's matmuls and element-wise products cost the same
main-thread CPU time with a 28 MiB gloo all-gather or reduce-scatter looping beside them on
both ranks); they are:

- **the collective's own main-thread work** (``host_collective_s``): DTensor's redistribution
  of a sequence-parallel activation runs on the thread that computes: its Python (placement
  planning, the functional collective, the wrapper tensor), gloo's clone of a reduce-scatter's
  input and the copy that moves the gathered shards into place (``torch.cat`` along the
  sequence). Measured as the main thread's CPU seconds (``time.thread_time``: the wait for the
  transfer leaves it still) per redistribution of the job's activation, Shard(1) -> Replicate
  and Partial -> Shard(1) in turn, averaged;
- **the wait for the slower rank** (``sync_skew_s``): every synchronous collective starts when
  the last rank reaches it, so each costs the step the ranks' skew at it, which a collective
  timed between barriers does not see (the job's ranks reached its collectives 1.3-1.5 ms
  apart, median). Measured as the seconds per collective by which a loop of [the job's
  feed-forward input matmul, a redistribution] outlasts the slowest rank's matmuls alone plus
  the redistributions alone.

The planner adds ``host_collective_s`` per TP collective to the host's dispatch (on a CPU
process, the computing thread) and ``sync_skew_s`` per TP collective to the exposed TP time
(step_time.py). A GPU profile leaves both at 0 (not measured): a GPU's host runs ahead of its
collectives, and the device-side skew is not what this measures.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from torchtitan_like.tools.planner.inputs import Layout, ModelShape, Workload

ROUNDS = 12
"""Iterations of each timed loop (each with two collectives); the fastest of ``RUNS`` kept."""
RUNS = 3


def _loop_seconds(body: Callable[[], object], group: dist.ProcessGroup,
                  clock: Callable[[], float]) -> float:
    """The fastest of ``RUNS`` runs of ``ROUNDS`` calls of ``body``, by ``clock``, each run
    started together on every rank (a barrier), per call."""
    body()
    best = float("inf")
    for _ in range(RUNS):
        dist.barrier(group=group)
        start = clock()
        for _ in range(ROUNDS):
            body()
        best = min(best, (clock() - start) / ROUNDS)
    return best


def sync_group(layout: Layout, node: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The group the job's synchronous TP collectives run on: its TP group (consecutive ranks,
    TP innermost in the mesh; every rank creates every group), else the node's processes (the
    TP a later plan may use); None for a process alone in its node without TP."""
    if layout.tp > 1:
        return dist.new_subgroups(group_size=layout.tp)[0]
    return node


def measure_sync_costs(m: ModelShape, work: Workload, layout: Layout,
                       group: dist.ProcessGroup, device: torch.device,
                       slowest: Callable[[float], float]) -> dict[str, float]:
    """``host_collective_s`` and ``sync_skew_s`` (module docstring) on ``group`` (``sync_group``)
    at the job's activation in its compute dtype (a microbatch's tokens x dim, sharded along
    the sequence), with ``slowest`` reducing a rank's figure to the slowest rank's."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    mesh = DeviceMesh.from_group(group, device.type)
    n = dist.get_world_size(group)
    seq = max(n, work.seq_len // layout.cp // n * n)
    batch = layout.local_batch_size
    dtype = torch.bfloat16 if work.precision.compute_bytes == 2 else torch.float32
    sharded = DTensor.from_local(torch.randn(batch, seq // n, m.dim, dtype=dtype), mesh,
                                 [Shard(1)])
    partial = DTensor.from_local(torch.randn(batch, seq, m.dim, dtype=dtype), mesh,
                                 [Partial()])

    def collectives() -> None:
        sharded.redistribute(mesh, [Replicate()]).to_local()
        partial.redistribute(mesh, [Shard(1)]).to_local()

    x = torch.randn(batch * seq, m.dim, dtype=dtype)  # the feed-forward's input and w1
    w = torch.randn(m.dim, max(1, m.ffn_hidden_dim // n), dtype=dtype)

    def compute() -> None:
        x @ w
        x @ w

    def both() -> None:
        x @ w
        sharded.redistribute(mesh, [Replicate()]).to_local()
        x @ w
        partial.redistribute(mesh, [Shard(1)]).to_local()

    host = slowest(_loop_seconds(collectives, group, time.thread_time) / 2)
    alone = slowest(_loop_seconds(collectives, group, time.perf_counter))
    computing = slowest(_loop_seconds(compute, group, time.perf_counter))
    together = slowest(_loop_seconds(both, group, time.perf_counter))
    return {"host_collective_s": host,
            "sync_skew_s": max(0.0, together - computing - alone) / 2}
