"""The step-time model's structure against this CPU: what each toggle costs, predicted and
measured, in one run.

    python scripts/bench_planner_structure.py            # debugmodel and 100M, ~10-20 min
    python scripts/bench_planner_structure.py --flavors debugmodel --steps 3

For each flavor the real Trainer trains, one thread per process (a process is the planner's
GPU), fp32, AC none, 2,048 tokens a step at seq 1,024 unless the toggle changes it: the base
on one process; full AC; seq 128 (the same tokens); FSDP 2, CP 2 and TP 2 on two processes
(the same global batch). CP 2 and TP 2 are judged against FSDP 2, the same two processes with
the other dimension (``TOGGLES``): that is the ablation a user runs, one dimension toggled on
the same GPUs, and it keeps what going from one process to two costs on a CPU (FSDP's copies
and gloo's transfers, on the cores that compute) in the FSDP 2 row.
A toggle's *relative cost* is its step time over the base's (the fastest of
``--steps`` steps after ``--warmup``, each between barriers: on a shared machine the minimum
is the least disturbed figure); beside it the same ratio of CPU seconds (the busier rank's),
which other processes on a shared machine do not inflate but which leaves out waits for
gloo. The planner predicts the same ratios with its CPU preset,
whose rates are measured in the same run, one thread, at the flavor's own shapes: the matmul
rate (a block's w1 on the step's tokens; ``peak_tflops`` with ``gemm_efficiency`` 1), the
attention kernels' rate (SDPA forward and backward at seq 1,024, FLOPs counted as the planner
counts them: ``attention_efficiency``), the element-wise bandwidth (``a * b`` on an FFN-wide
activation: ``hbm_tbps``) and, between the two processes, gloo's all-gather rate at message
sizes from 1 to 32 MiB a rank (``intra_node_gbps_by_message``: it falls about 2x over
that range, so TP's activations and FSDP's block parameters each run at their own size's
rate; reduce-scatter is priced at the all-gather's, though gloo's measured slower) and a
small message's latency (``intra_node_latency_s``); the fitted numbers are the
shipped ones (calibration.py), fitted on GPUs. A toggle is held when predicted / measured is
within ``BAND``: the step-time model's parts scale with each toggle as the measurement does.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import tempfile
import time

from torchtitan_like.tools.bench_runner import launch_bench, report, timed_steps, worker_cases
from torchtitan_like.tools.calibrate import fastest_seconds
from torchtitan_like.tools.planner.links import rate_at

BAND = 0.25
"""Held when |predicted / measured - 1| is at most this: the published runs' limit."""

SEQ, TOKENS = 1024, 2048

TOGGLES = (("cp 2", "fsdp 2"), ("tp 2", "fsdp 2"), ("fsdp 2", "base"), ("ac full", "base"),
           ("seq 128", "base"))
"""(toggled case, the case it is judged against): CP and TP on the same two processes as
FSDP 2, as an ablation toggles one dimension on the same GPUs."""


def _best(fn) -> float:
    """The fastest seconds per call of ``fn`` in this process's CPU time, for the one-thread
    compute rates (what other processes on the machine take is not counted)."""
    return fastest_seconds(fn, clock=time.process_time)


def measure_rates(flavor: str) -> dict[str, float]:
    """This CPU's rates, one thread, at ``flavor``'s shapes (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    from torchtitan_like.models.llama3.args import llama3_flavors
    from torchtitan_like.tools.planner import ModelShape

    torch.set_num_threads(1)
    m = ModelShape.from_args(llama3_flavors[flavor])
    x, w = torch.randn(TOKENS, m.dim), torch.randn(m.dim, m.ffn_hidden_dim)
    gemm = 2 * TOKENS * m.dim * m.ffn_hidden_dim / _best(lambda: x @ w)
    heads = [torch.randn(TOKENS // SEQ, m.n_heads, SEQ, m.head_dim, requires_grad=True)
             for _ in range(3)]

    def attend() -> None:
        F.scaled_dot_product_attention(*heads, is_causal=True).sum().backward()

    forward = 4 * TOKENS * SEQ * m.q_dim / 2  # causal, as ring.py / step_time.py count it
    attention = forward * 3.5 / _best(attend)
    a, b = torch.randn(TOKENS, m.ffn_hidden_dim), torch.randn(TOKENS, m.ffn_hidden_dim)
    bandwidth = 3 * a.numel() * 4 / _best(lambda: a * b)
    return {"gemm": gemm, "attention": attention, "bandwidth": bandwidth}


SWEEP_BYTES = tuple(2**k for k in range(20, 26))
"""Message sizes (bytes a rank sends: 1 to 32 MiB) of the measured gloo rate curve; below
1 MiB the latency dominates a call (~0.35 ms against ~1 ms of bytes) and the rate its
difference leaves is noise, so smaller messages take the 1 MiB rate."""


def _collective_seconds(fn, nbytes: float, runs: int = 3) -> float:
    """The fastest seconds per call of the collective ``fn``, over a number of calls both
    ranks derive from the size alone (~64 MiB a run): a rank that chose its own count from
    its own clock could issue a call the other rank never joins."""
    import torch.distributed as dist

    iters = min(200, max(3, int(2**26 // max(nbytes, 1))))
    best = float("inf")
    for _ in range(runs):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - start) / iters)
    return best


def measure_gloo(activation_bytes: int, block_bytes: int) -> dict[str, object]:
    """gloo's all-gather between the processes: its rate curve over ``SWEEP_BYTES`` a rank
    (``intra_node_gbps_by_message``: each bytes over the seconds beyond a 64-byte call's) and
    the 64-byte call's seconds per hop (``intra_node_latency_s``); beside them, for the notes,
    the curve's rate at a TP activation's shard and at a block's parameter shard (FSDP's
    messages), and the share of the latter's wall time that is this process's CPU time."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()

    def gather(nbytes: int):
        local = torch.randn(max(nbytes // 4, 1))
        out = torch.empty(local.numel() * world)
        return lambda: dist.all_gather_into_tensor(out, local)

    small = _collective_seconds(gather(64), 64)
    curve = [(float(b), b * (world - 1) / (_collective_seconds(gather(b), b) - small) / 1e9)
             for b in SWEEP_BYTES]
    block = gather(block_bytes)
    wall = _collective_seconds(block, block_bytes, runs=1)
    cpu = time.process_time()
    block()
    return {"curve": curve, "latency": small / (world - 1),
            "activation_gbps": rate_at(tuple(curve), activation_bytes),
            "block_gbps": rate_at(tuple(curve), block_bytes),
            "block_cpu_share": (time.process_time() - cpu) / wall}


def cases(flavor: str, folder: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(one-process cases, two-process cases): name -> trainer overrides."""
    base = ["--job.config_file", "train_configs/debug_model.toml", "--model.flavor", flavor,
            "--training.mixed_precision_param", "float32", "--training.steps", "1000",
            "--metrics.log_freq", "1000", "--metrics.peak_tflops", "1",
            "--metrics.enable_tensorboard", "false", "--validation.enable", "false",
            "--job.dump_folder", folder]

    def at(seq: int, *more: str) -> list[str]:
        batch = str(TOKENS // seq)
        return [*base, "--training.seq_len", str(seq), "--training.local_batch_size", batch,
                "--training.global_batch_size", batch, *more]

    one = {f"{flavor}/base": at(SEQ), f"{flavor}/ac full": at(SEQ, "--activation_checkpoint."
                                                               "mode", "full"),
           f"{flavor}/seq 128": at(128)}
    two = {f"{flavor}/fsdp 2": [*at(SEQ, "--parallelism.data_parallel_shard_degree", "2"),
                                "--training.local_batch_size", str(TOKENS // SEQ // 2)],
           f"{flavor}/cp 2": at(SEQ, "--parallelism.context_parallel_degree", "2",
                                "--parallelism.data_parallel_shard_degree", "1"),
           f"{flavor}/tp 2": at(SEQ, "--parallelism.tensor_parallel_degree", "2",
                                "--parallelism.data_parallel_shard_degree", "1")}
    return one, two


def predict(flavor: str, rates: dict[str, float], gloo: dict[str, float]) -> dict[str, float]:
    """The planner's step seconds of each case on the measured CPU preset."""
    from torchtitan_like.models.llama3.args import llama3_flavors
    from torchtitan_like.tools.planner import CPU, Cluster, Layout, ModelShape, Precision, Workload
    from torchtitan_like.tools.planner import plan as plan_layout

    gpu = dataclasses.replace(
        CPU, name="this CPU, one thread (measured)", peak_tflops=rates["gemm"] / 1e12,
        gemm_efficiency=1.0, attention_efficiency=rates["attention"] / rates["gemm"],
        hbm_tbps=rates["bandwidth"] / 1e12, intra_node_latency_s=gloo["latency"],
        intra_node_gbps_by_message=tuple(tuple(point) for point in gloo["curve"]))
    m = ModelShape.from_args(llama3_flavors[flavor])
    fp32 = Precision(compute_bytes=4)

    def step(n: int, seq: int, **layout: object) -> float:
        work = Workload(seq_len=seq, global_batch=TOKENS // seq, precision=fp32)
        layout.setdefault("local_batch_size", TOKENS // seq)
        lay = Layout(**layout)  # type: ignore[arg-type]
        return plan_layout(m, Cluster(gpu, gpus_per_node=n), work, lay).step_seconds

    return {f"{flavor}/base": step(1, SEQ), f"{flavor}/ac full": step(1, SEQ, ac="full"),
            f"{flavor}/seq 128": step(1, 128), f"{flavor}/cp 2": step(2, SEQ, cp=2),
            f"{flavor}/fsdp 2": step(2, SEQ, dp_shard=2, local_batch_size=TOKENS // SEQ // 2),
            f"{flavor}/tp 2": step(2, SEQ, tp=2)}


def worker(spec_file: str) -> None:
    """Inside torchrun: gloo's rates (two processes), then each case's fastest step, wall and
    CPU seconds."""
    import torch
    import torch.distributed as dist

    for i, (name, trainer, batches, spec) in enumerate(worker_cases(spec_file)):
        if i == 0 and dist.get_world_size() > 1:
            block = sum(p.numel() for p in trainer.model_parts[0].layers["0"].parameters())
            gloo = measure_gloo(TOKENS * trainer.model_args.dim * 4 // 2,
                                block * 4 // dist.get_world_size())
            if dist.get_rank() == 0:
                report("gloo", gloo)
        steps = timed_steps(trainer, batches, steps=spec["steps"], warmup=spec["warmup"])
        trainer.metrics.close()
        busy = torch.tensor(min(cpu for _, cpu in steps))
        dist.all_reduce(busy, op=dist.ReduceOp.MAX)  # the busier rank's CPU seconds
        if dist.get_rank() == 0:
            report(name, [min(wall for wall, _ in steps), busy.item()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flavors", default="debugmodel,100M")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    load = os.getloadavg()
    rows, notes, held = [], [], 0
    for flavor in args.flavors.split(","):
        rates = measure_rates(flavor)
        with tempfile.TemporaryDirectory() as folder:
            one, two = cases(flavor, folder)
            measured = {**launch_bench(__file__, 1, one, steps=args.steps, warmup=args.warmup),
                        **launch_bench(__file__, 2, two, steps=args.steps, warmup=args.warmup)}
        gloo = measured.pop("gloo")
        predicted = predict(flavor, rates, gloo)
        for toggle, against in TOGGLES:
            name, base = f"{flavor}/{toggle}", f"{flavor}/{against}"
            p = predicted[name] / predicted[base]
            wall, cpu = (measured[name][i] / measured[base][i] for i in (0, 1))
            ok = abs(p / wall - 1) <= BAND
            held += ok
            rows.append(f"| {name} vs {against} | {measured[base][0]:.3f} | "
                        f"{measured[name][0]:.3f} | "
                        f"{wall:.2f} | {cpu:.2f} | {p:.2f} | {p / wall:.2f} | {p / cpu:.2f} | "
                        f"{'held' if ok else 'MISS'} |")
        notes.append(f"{flavor}, measured: matmul {rates['gemm'] / 1e9:.1f} GFLOP/s, attention "
                     f"{rates['attention'] / 1e9:.1f} GFLOP/s, element-wise "
                     f"{rates['bandwidth'] / 1e9:.1f} GB/s (one thread, CPU time); gloo "
                     f"{gloo['latency'] * 1e6:.0f} us a hop, all-gather "
                     + ", ".join(f"{b / 2**20:g} MiB {r:.2f}" for b, r in gloo["curve"])
                     + f" GB/s a rank; at a TP activation's shard {gloo['activation_gbps']:.2f}"
                     f", at a block's parameter shard (FSDP) {gloo['block_gbps']:.2f} GB/s, "
                     f"its CPU time {gloo['block_cpu_share']:.0%} of its wall time")
    print(f"$ python scripts/bench_planner_structure.py {shlex.join(sys.argv[1:])}".rstrip())
    print(f"load average before the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
          f"after: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    print("| toggle | base step s | toggled step s | measured cost (wall) | "
          "measured cost (CPU time) | predicted cost | predicted / wall | predicted / CPU | "
          f"wall within {BAND:.0%} |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    print("\n".join(rows))
    print("\n".join(["", *notes, f"{held} of {len(rows)} toggles held within {BAND:.0%}"]))


if __name__ == "__main__":
    main()
