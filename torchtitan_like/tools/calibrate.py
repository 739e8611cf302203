"""``ttl-plan --calibrate PROFILE``: measure what the planner's step-time terms need on this
machine, as the job will use it, and write a hardware profile (tools/planner/hardware.py).

Run under torchrun (``python -m torchtitan_like.launch --nproc_per_node N -m
torchtitan_like.tools.plan_cli --calibrate PROFILE ...`` on every node), or plainly: ttl-plan
then launches itself on one node with ``--nproc`` processes. Every rank measures at once, as
the ranks of a step compute at once (on a CPU they share cores and memory), with the threads
the launcher gives it (a one-thread CPU process timed by its own CPU clock:
``compute_clock``); a rate is the slowest rank's. Measured, at the planned job's shapes
(its model, sequence length, microbatch, TP and CP degrees, compute dtype):

- **matmul**: every weight matmul of a block and the output head, forward and both backward
  shapes, in fp32 and bf16 (and float8 with ``torch._scaled_mm`` on GPUs of SM 8.9 or newer;
  a CPU has no float8 matmul unit), FLOPs-weighted: the gemm term's rate per compute dtype;
- **attention**: the model's attention call (models/attention.py) forward and backward, causal,
  at the job's sequence length and half of it, FLOPs counted as step_time.py counts them;
- **element-wise bandwidth**: a product of two feed-forward-wide activations (3 crossings);
- **host dispatch**: per eager op, through DTensor, compiled (when the job compiles) and per
  FSDP unit (tools/host_dispatch.py);
- **a synchronous collective's cost beyond its transfer** on a CPU process (over the job's TP
  group, else the node's processes): its main-thread work and the wait for the slower rank
  (tools/sync_cost.py);
- **collectives** inside a node (a group of its processes) and, with several nodes, across
  them (one process per node): all-gather, reduce-scatter, all-reduce, all-to-all and
  send/recv (a ring of batched pairs) at message sizes from 64 KiB to twice the job's
  largest (``sweep``), each rate the bytes a rank sends over the seconds beyond the hop
  latency (a 64-byte call's, per hop);
- **pace**: a fixed probe, at the start and at the end (``measure_pace``), which ``--verify``
  reads again around its steps, so that it says when the machine it measures no longer runs
  at the pace of the profile it predicts with.

Every rank derives each collective's call count from the message size alone, never from its
own clock, so no rank issues a call the others do not join (a per-rank clock-based count
once desynchronised the collectives of scripts/bench_planner_structure.py); each timing is
the slowest rank's (an all-reduce of the maximum), so every rank records the same profile.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from torchtitan_like.components.metrics import peak_tflops
from torchtitan_like.tools.host_dispatch import measure_host_costs
from torchtitan_like.tools.planner.hardware import gpu_to_dict, write_profile
from torchtitan_like.tools.planner.inputs import CPU, GPU, GPUS, Layout, ModelShape, Workload
from torchtitan_like.tools.planner.overheads import gemm_shapes
from torchtitan_like.tools.planner.step_time import ATTENTION_PASS_FLOPS
from torchtitan_like.tools.sync_cost import measure_sync_costs, sync_group

SWEEP = tuple(4**k for k in range(8, 15))
"""Message sizes (bytes a ring step) of the collective curves: 64 KiB, x4 up to the first one
at least twice the job's largest message (``largest_message``), at most 256 MiB."""
BUDGET = {"cpu": 2**26, "cuda": 2**30}
"""Bytes a rank sends per timed run of one collective size (3 to 200 calls)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def fastest_seconds(fn: Callable[[], object], device: torch.device | None = None,
                    min_seconds: float = 0.2, runs: int = 3,
                    clock: Callable[[], float] = time.perf_counter) -> float:
    """The fastest seconds per call of ``fn`` by ``clock`` (wall by default): ``runs`` runs,
    each of enough calls to last ``min_seconds`` (no collective inside: each rank may repeat
    it a different number of times); a busy machine only slows a run down."""
    fn()
    _sync(device)
    best, iters = float("inf"), 1
    for _ in range(runs):
        while True:
            start = clock()
            for _ in range(iters):
                fn()
            _sync(device)
            seconds = clock() - start
            if seconds >= min_seconds:
                break
            iters *= 2
        best = min(best, seconds / iters)
    return best


def compute_clock(device: torch.device | None) -> Callable[[], float]:
    """The clock the compute rates are timed by: a one-thread CPU process's own CPU clock
    (``time.thread_time``: it computes on that thread, and the verify run counts its compute
    by the same clock; another tenant's process taking the core then delays the run without
    lengthening it, where the wall clock measured 27-38% low rates twice in nine two-process
    calibrations on the shared 2-core machine, docs/measurements.md), else the wall clock (a
    GPU; several threads)."""
    if device is not None and device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def _slowest(value: float, device: torch.device, group: dist.ProcessGroup | None = None,
             op: dist.ReduceOp.RedOpType = dist.ReduceOp.MAX) -> float:
    """``value`` reduced over ``group`` (the world): every rank gets the same number."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op, group=group)
    return t.item()


PACE_MATMUL = {"cpu": 512, "cuda": 8192}
"""The pace probe's square matmul, fp32 on a CPU (fast on any x86-64: AVX2-only ones run bf16
at 1-3 GFLOP/s), bf16 on a GPU."""


def measure_pace(device: torch.device) -> dict[str, float]:
    """The machine's pace by a fixed probe, every rank at once (the slowest rank's): a square
    matmul's TFLOP/s and one tiny eager op's microseconds (its dispatch), fastest of five runs
    by ``compute_clock``; the same shapes on every run of every job, so that two readings
    compare the machine with itself (tools/pace.py). About 1.5 s on a CPU process."""
    n = PACE_MATMUL[device.type]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    one, clock = torch.ones(1, device=device), compute_clock(device)
    dist.barrier()
    matmul = fastest_seconds(lambda: a @ b, device, min_seconds=0.1, runs=5, clock=clock)
    dispatch = fastest_seconds(lambda: one.add(one), device, min_seconds=0.1, runs=5,
                               clock=clock)
    return {"matmul_tflops": _slowest(2 * n**3 / matmul / 1e12, device, op=dist.ReduceOp.MIN),
            "dispatch_us": _slowest(dispatch * 1e6, device)}


def _matmul(rows: int, inner: int, cols: int, dtype: str, device: torch.device
            ) -> Callable[[], object]:
    if dtype == "float8":
        a = torch.randn(rows, inner, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(cols, inner, device=device).to(torch.float8_e4m3fn).t()  # col-major
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    a = torch.randn(rows, inner, device=device, dtype=DTYPES[dtype])
    b = torch.randn(inner, cols, device=device, dtype=DTYPES[dtype])
    return lambda: a @ b


def measure_gemm(m: ModelShape, layout: Layout, tokens: int, dtype: str,
                 device: torch.device) -> float:
    """TFLOP/s of the job's weight matmuls in ``dtype``, FLOPs-weighted (each shape timed
    once; a block's shapes count n_layers times)."""
    counts: dict[tuple[int, int, int], int] = {}
    for count, *shape in gemm_shapes(m, layout.tp, tokens):
        counts[tuple(shape)] = counts.get(tuple(shape), 0) + count
    flops = seconds = 0.0
    for (rows, inner, cols), count in counts.items():
        flops += count * 2 * rows * inner * cols
        seconds += count * fastest_seconds(_matmul(rows, inner, cols, dtype, device), device,
                                           0.05, clock=compute_clock(device))
    return flops / seconds / 1e12


def measure_attention(m: ModelShape, layout: Layout, batch: int, seq: int,
                      dtype: torch.dtype, device: torch.device) -> float:
    """TFLOP/s of the model's causal attention, forward and backward, at ``seq`` tokens."""
    from torchtitan_like.models.attention import sdpa

    heads = max(1, m.n_heads // layout.tp)
    qkv = [torch.randn(batch, heads, seq, m.head_dim, device=device, dtype=dtype,
                       requires_grad=True) for _ in range(3)]

    def attend() -> None:
        sdpa(*qkv, is_causal=True).sum().backward()

    forward = 4 * batch * seq * seq * heads * m.head_dim / 2  # causal, as step_time counts
    return forward * ATTENTION_PASS_FLOPS / fastest_seconds(
        attend, device, clock=compute_clock(device)) / 1e12


def measure_bandwidth(m: ModelShape, layout: Layout, tokens: int, dtype: torch.dtype,
                      device: torch.device) -> float:
    """TB/s of an element-wise product of two feed-forward-wide activations."""
    a, b = (torch.randn(tokens, m.ffn_hidden_dim // layout.tp, device=device, dtype=dtype)
            for _ in range(2))
    return 3 * a.numel() * a.element_size() / fastest_seconds(
        lambda: a * b, device, clock=compute_clock(device)) / 1e12


def _collective(kind: str, nbytes: int, group: dist.ProcessGroup, device: torch.device
                ) -> tuple[Callable[[], object], float, float]:
    """(one call, bytes a rank sends, hops) of collective ``kind`` with ``nbytes`` a ring step
    (hardware.py's key): a shard for all-gather and reduce-scatter, a 1/n slice of the
    all-reduced tensor, a rank's whole all-to-all input less its own slice, one send."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    elems = max(1, nbytes // 4)
    shard = torch.randn(elems, device=device)
    whole = torch.randn(elems * n, device=device)
    if kind == "all_gather":
        return lambda: dist.all_gather_into_tensor(whole, shard, group=group), \
            (n - 1) * elems * 4, n - 1
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(shard, whole, group=group), \
            (n - 1) * elems * 4, n - 1
    if kind == "all_reduce":
        return lambda: dist.all_reduce(whole, group=group), 2 * (n - 1) * elems * 4, 2 * (n - 1)
    if kind == "all_to_all":
        out = torch.empty_like(whole)
        return lambda: dist.all_to_all_single(out, whole, group=group), (n - 1) * elems * 4, 1
    peers = dist.get_process_group_ranks(group)
    received = torch.empty_like(shard)

    def ring() -> None:
        ops = [dist.P2POp(dist.isend, shard, peers[(rank + 1) % n], group),
               dist.P2POp(dist.irecv, received, peers[(rank - 1) % n], group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return ring, elems * 4, 1


def _collective_seconds(fn: Callable[[], object], nbytes: float, device: torch.device,
                        group: dist.ProcessGroup, runs: int = 3) -> float:
    """The slowest rank's fastest seconds per call, over a call count derived from the size
    alone (the same on every rank)."""
    iters = min(200, max(3, int(BUDGET[device.type] // max(nbytes, 1))))
    fn()
    best = float("inf")
    for _ in range(runs):
        dist.barrier(group=group)
        _sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        _sync(device)
        best = min(best, (time.perf_counter() - start) / iters)
    return _slowest(best, device)


KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv")


def largest_message(m: ModelShape, work: Workload, layout: Layout, world: int) -> float:
    """The job's largest ring-step message: a block's parameter shard (FSDP over the world,
    the reduce dtype's bytes) or a microbatch's activations a TP rank gathers."""
    prec = work.precision
    block = m.block_params / layout.tp * max(prec.compute_bytes, prec.reduce_bytes) / world
    return max(block, layout.local_batch_size * work.seq_len * m.dim * prec.compute_bytes
               / layout.tp)


def sweep(largest: float) -> list[int]:
    """``SWEEP`` up to the first size of at least twice ``largest``."""
    sizes = [size for size in SWEEP if size < 2 * largest]
    return [*sizes, SWEEP[len(sizes)]] if len(sizes) < len(SWEEP) else sizes


def measure_collectives(group: dist.ProcessGroup, device: torch.device, sizes: list[int]
                        ) -> dict[str, Any]:
    """Latency per hop (a 64-byte all-gather's) and each collective's rate curve on
    ``group`` at ``sizes``: {kind: [[bytes per ring step, GB/s a rank sends], ...]}."""
    n = dist.get_world_size(group)
    fn, _, hops = _collective("all_gather", 64, group, device)
    latency = _collective_seconds(fn, 64, device, group) / hops
    out: dict[str, Any] = {"group_size": n, "latency_s": latency}
    for kind in KINDS:
        curve = []
        for size in sizes:
            fn, sent, hops = _collective(kind, size, group, device)
            seconds = _collective_seconds(fn, sent, device, group)
            curve.append([float(size), sent / max(seconds - hops * latency, seconds / 10) / 1e9])
        out[kind] = curve
    return out


def _groups() -> dict[str, dist.ProcessGroup]:
    """This rank's node group (its node's processes) and, with several nodes, its cross-node
    group (one process per node, the same local rank); every rank creates every group."""
    world, per_node = dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    nodes = world // per_node
    groups: dict[str, dist.ProcessGroup] = {}
    if per_node > 1:
        intra, _ = dist.new_subgroups_by_enumeration(
            [list(range(n * per_node, (n + 1) * per_node)) for n in range(nodes)])
        groups["intra"] = intra
    if nodes > 1:
        inter, _ = dist.new_subgroups_by_enumeration(
            [list(range(local, world, per_node)) for local in range(per_node)])
        groups["inter"] = inter
    return groups


def host_info(device: torch.device) -> dict[str, Any]:
    """The machine and software the profile was measured on."""
    info: dict[str, Any] = {
        "hostname": platform.node(), "device": device.type, "torch": torch.__version__,
        "cuda": torch.version.cuda, "driver": None, "nccl": None,
        "cpu": _cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(), "python": platform.python_version()}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        driver = Path("/proc/driver/nvidia/version")
        info["driver"] = driver.read_text().split("\n")[0] if driver.exists() else None
    else:
        info["device_name"] = info["cpu"]
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _base_gpu(device: torch.device, per_node: int) -> GPU:
    """The preset this device matches (a GPU by name), else the CPU preset, with its memory
    and bf16 peak (the MFU denominator, as the trainer's metrics take it)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        base = next((gpu for key, gpu in GPUS.items() if key in name), GPUS["H100"])
        memory = torch.cuda.get_device_properties(device).total_memory / 2**30
        return GPU(**{**vars_of(base), "name": name, "memory_gib": memory,
                      "peak_tflops": peak_tflops(device, 0.0, torch.bfloat16) or base.peak_tflops})
    pages = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return GPU(**{**vars_of(CPU), "name": f"CPU process ({_cpu_model()})",
                  "memory_gib": pages / 2**30 / per_node,
                  "peak_tflops": peak_tflops(device, 0.0, torch.bfloat16)})


def vars_of(gpu: GPU) -> dict[str, Any]:
    return {f: getattr(gpu, f) for f in gpu.__dataclass_fields__}


def calibrate(m: ModelShape, work: Workload, layout: Layout, device: torch.device,
              job: dict[str, Any]) -> dict[str, Any]:
    """Every measurement of the module docstring, on this rank; the profile record (every
    rank gets the same one)."""
    started, pace = time.perf_counter(), [measure_pace(device)]
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    tokens = layout.local_batch_size * work.seq_len // layout.cp
    compute = DTYPES.get({4: "float32", 2: "bfloat16"}[work.precision.compute_bytes],
                         torch.bfloat16)
    dtypes = ["float32", "bfloat16"]
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9):
        dtypes.append("float8")
    gemm = {d: _slowest(measure_gemm(m, layout, tokens, d, device), device,
                        op=dist.ReduceOp.MIN) for d in dtypes}
    seq = work.seq_len // layout.cp
    attention = [[float(s), _slowest(measure_attention(m, layout, layout.local_batch_size, s,
                                                       compute, device), device,
                                     op=dist.ReduceOp.MIN)]
                 for s in sorted({max(16, seq // 2), seq})]
    bandwidth = _slowest(measure_bandwidth(m, layout, tokens, compute, device), device,
                         op=dist.ReduceOp.MIN)
    host = {name: _slowest(value, device)
            for name, value in measure_host_costs(device, layout.compile).items()}
    sizes = sweep(largest_message(m, work, layout, dist.get_world_size()))
    groups = _groups()
    collectives = {scope: measure_collectives(group, device, sizes)
                   for scope, group in groups.items()}
    sync_on = sync_group(layout, groups.get("intra")) if device.type == "cpu" else None
    sync = measure_sync_costs(m, work, layout, sync_on, device, lambda v: _slowest(v, device)) \
        if sync_on is not None else {}
    gpu = _base_gpu(device, per_node)
    peak = gpu.peak_tflops or max(gemm.values())
    fields = {**vars_of(gpu), "peak_tflops": peak, "gemm_efficiency": gemm["bfloat16"] / peak,
              "attention_efficiency": attention[-1][1] / peak, "hbm_tbps": bandwidth,
              "gemm_tflops_by_dtype": tuple(gemm.items()), **host,
              "attention_tflops_by_seq": tuple(tuple(p) for p in attention), **sync}
    curves = []
    for scope, measured in collectives.items():
        curves += [(f"{kind}/{scope}", tuple(tuple(p) for p in measured[kind]))
                   for kind in KINDS]
        fields[f"{scope}_node_latency_s"] = measured["latency_s"]
        fields[f"{scope}_node_gbps"] = measured["all_gather"][-1][1]
    if "inter" not in collectives and "intra" in collectives:
        fields["inter_node_gbps"] = gpu.inter_node_gbps  # one node: not measured
    fields["collective_gbps"] = tuple(curves)
    fields["intra_node_gbps_by_message"] = ()
    world = dist.get_world_size()
    pace.append(measure_pace(device))
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": host_info(device),
        "processes": {"world_size": world, "per_node": per_node, "nodes": world // per_node},
        "job": {**job, **job_fields(work, layout), "tokens_per_matmul": tokens},
        "gpu": gpu_to_dict(GPU(**fields)),
        "measured": {"gemm_tflops": gemm, "attention_tflops_by_seq": attention,
                     "elementwise_tbps": bandwidth, "host": host, "collectives": collectives,
                     "synchronous_collective": sync},
        "pace": {key: [p[key] for p in pace] for key in pace[0]},
        "seconds": round(time.perf_counter() - started, 1),
    }


def job_fields(work: Workload, layout: Layout) -> dict[str, Any]:
    """The job's shapes a profile was measured at (its ``job`` record, with what the caller
    adds: model, config, command)."""
    return {"seq_len": work.seq_len, "local_batch_size": layout.local_batch_size,
            "tp": layout.tp, "cp": layout.cp, "compute_bytes": work.precision.compute_bytes}


def run(m: ModelShape, work: Workload, layout: Layout, job: dict[str, Any], out: str) -> int:
    """Inside torchrun (or a world of one): measure, rank 0 writes ``out``."""
    from torchtitan_like.distributed.lifecycle import exit_process
    from torchtitan_like.distributed.utils import init_distributed

    device = init_distributed()
    record = calibrate(m, work, layout, device, job)
    if dist.get_rank() == 0:
        write_profile(out, record)
        gpu = record["gpu"]
        print(f"wrote {out}: {record['processes']['world_size']} process(es) of "
              f"{record['host']['device_name']}, matmul "
              + ", ".join(f"{d} {v:.3g}" for d, v in gpu["gemm_tflops_by_dtype"].items())
              + f" TFLOP/s, attention {gpu['attention_tflops_by_seq'][-1][1]:.3g} TFLOP/s at "
              f"seq {gpu['attention_tflops_by_seq'][-1][0]:g}, element-wise "
              f"{gpu['hbm_tbps'] * 1e3:.3g} GB/s in {record['seconds']} s", flush=True)
    exit_process(0)
    return 0
