"""Command line of the planner (ttl-plan, or python -m torchtitan_like.tools.plan_cli).

    ttl-plan --flavor 70B --gpu H100 --num_gpus 512 --seq_len 8192 \
        --tokens 15e12 --mfu 0.40            # one layout: memory, fit, step time, cost
    ttl-plan --flavor 405B --gpu H100 --num_gpus 16384 --seq_len 8192 \
        --global_batch 2048 --search --tp 8  # the best fitting layouts with TP 8
    ttl-plan --config train_configs/debug_model.toml --num_gpus 2 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from torchtitan_like.config.dtypes import DTYPES
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.launcher_env import world_size_of
from torchtitan_like.config.manager import build_job_config, import_custom_modules
from torchtitan_like.tools import plan_measure
from torchtitan_like.tools.planner import (
    GPUS,
    Cluster,
    GiB,
    Layout,
    LayoutError,
    ModelShape,
    Plan,
    Workload,
    bubble_formula,
    check_ac,
    from_job_config,
    plan_fitting,
    search,
)
from torchtitan_like.tools.planner.failures import FailureInputs, failure_cost, failure_lines
from torchtitan_like.tools.planner.from_config import implied_num_gpus
from torchtitan_like.tools.planner.hardware import load_profile
from torchtitan_like.tools.planner.optimizer import state_bytes_per_parameter
from torchtitan_like.tools.planner.uncertainty import (
    expected_band,
    memory_band,
    uncertainty_lines,
    with_uncertainty,
)
from torchtitan_like.tools.search_report import format_search
from torchtitan_like.tools.verify import history_lines

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig

SCHEDULES = ["1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
             "ZBVZeroBubble", "DualPipeV"]
POLICIES: tuple[tuple[str, Any, str], ...] = (
    ("pp_virtual_stages", int, "model chunks per pipeline rank of the multi-stage schedules "
     "(default 2)"),
    ("pp_microbatches", int, "microbatches per pipeline schedule step (default: all of a "
     "step's in one schedule)"),
    ("cp_load_balancer", ["headtail", "none"], "CP chunking: headtail (equal causal work) or "
     "none (default headtail)"),
    ("cp_rotate_method", ["allgather", "alltoall"], "how ring attention moves K/V (default "
     "allgather, torch's)"),
    ("cp_algorithm", ["ring", "gathered_kv"], "CP attention: ring (torch's, this platform's) "
     "or gathered_kv (Llama 3's all-gather of grouped K/V; default ring)"),
    ("op_sac_every_other_matmul", bool, "op-level AC saves every other matmul output "
     "(TorchTitan's policy) instead of every one (this platform's)"),
    ("pp_reduce_before_send", bool, "pipeline stages reduce FSDP gradients before sending "
     "their last backward on (torch before 2025-10)"),
    ("ep_overlapped", bool, "the schedule hides the EP all-to-all behind another microbatch "
     "(DeepSeek's DualPipe)"),
)
"""Layout inputs that describe a run's own policies (the published runs carry them,
tools/planner/published.py): flags named as the ``Layout`` fields, each pinned under --search;
add a row here to expose a new one."""
PINNABLE = ("tp", "cp", "pp", "dp_replicate", "dp_shard", "ac", "local_batch_size",
            "pp_schedule", "compile", "float8", "async_tp", "ep",
            *(name for name, _, _ in POLICIES))
"""Layout flags that --search keeps when given."""
KEPT_OPTIONS = ("local_batch_size", "loss_parallel", "reshard_after_forward", "cp_load_balancer",
                "cp_rotate_method", "pp_embedding_weight", "pp_output_weight", "compile",
                "float8", "async_tp")
"""Options of the base layout (flags or --config) every searched layout keeps; a --config also
keeps its pipeline schedule."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="plan", description="Memory per GPU, fit, communication, step time, tokens/s, MFU "
        "and cost of a training layout, or a search for the best layouts.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model = p.add_argument_group("model (a registry flavor, or a training config)")
    model.add_argument("--config", help="training TOML: model, seq_len, batch, degrees, AC, "
                       "dtypes, compile, float8 are read from it (flags below override)")
    model.add_argument("--model", default="llama3", help="registry name")
    model.add_argument("--flavor", help="flavor of the model, e.g. 8B, 70B, 405B")
    model.add_argument("--custom_import", nargs="*", default=[],
                       help="modules to import first (models registered outside the package)")
    hw = p.add_argument_group("cluster")
    hw.add_argument("--gpu", default="H100", choices=sorted(GPUS), help="GPU preset")
    hw.add_argument("--hardware", metavar="PROFILE", help="a hardware profile written by "
                    "--calibrate (this machine's measured rates), instead of --gpu")
    hw.add_argument("--gpu_memory_gib", type=float, help="override the preset's memory")
    hw.add_argument("--peak_tflops", type=float, help="override the preset's dense bf16 peak")
    hw.add_argument("--intra_node_gbps", type=float, help="override: GB/s per GPU in a node")
    hw.add_argument("--inter_node_gbps", type=float, help="override: GB/s per GPU between nodes")
    hw.add_argument("--gpus_per_node", type=int, help="default: the profile's processes per "
                    "node, else 8")
    hw.add_argument("--num_gpus", type=int, help="GPUs in all (default: one node)")
    hw.add_argument("--nodes", type=int, help="nodes (instead of --num_gpus)")
    job = p.add_argument_group("workload")
    job.add_argument("--seq_len", type=int, help="tokens per sequence (default 8192)")
    job.add_argument("--global_batch", type=int,
                     help="sequences per step (default: 4M tokens / seq_len)")
    job.add_argument("--tokens", type=float, default=0.0, help="token budget, e.g. 15e12")
    job.add_argument("--dtype", choices=DTYPES, help="master weights, gradients, optimizer "
                     "states (default float32)")
    job.add_argument("--param_dtype", choices=DTYPES, help="compute dtype (default bfloat16)")
    job.add_argument("--optimizer", help="a registered optimizer: AdamW (default), Adam, Muon "
                     "(its states and Newton-Schulz time), or one of --custom_import")
    job.add_argument("--reduce_dtype", choices=DTYPES, help="gradient reduction (default "
                     "float32)")
    job.add_argument("--state_dtype", choices=("float32", "bfloat16"),
                     help="Adam's moments ([optimizer] state_dtype; default float32)")
    job.add_argument("--optimizer_implementation", choices=("foreach", "fused", "for-loop"),
                     help="[optimizer] implementation: foreach (the default) keeps a temporary "
                     "per parameter in the step")
    _layout_flags(p.add_argument_group("layout (each flag given is pinned under --search)"))
    est = p.add_argument_group("estimate")
    est.add_argument("--mfu", type=float, help="MFU for time and cost (0.40 or 40); default: "
                     "the step-time model's estimate")
    est.add_argument("--headroom", type=float, default=0.10,
                     help="share of GPU memory kept free (allocator, NCCL, CUDA context)")
    fail = p.add_argument_group("failures (priced when --gpu_mttf_hours is given)")
    fail.add_argument("--gpu_mttf_hours", type=float, help="mean time to failure of one GPU, "
                      "e.g. 8e4 (Llama 3 405B: ~1 interruption per 3 h on 16,384 GPUs: 5e4)")
    fail.add_argument("--checkpoint_interval", type=int, default=500, help="steps between "
                      "checkpoints")
    fail.add_argument("--checkpoint_seconds", type=float, default=5.0,
                      help="time one checkpoint blocks the loop")
    fail.add_argument("--restart_seconds", type=float, default=300.0,
                      help="a job's or a replica group's start-up to its first step")
    fail.add_argument("--heartbeat_seconds", type=float, default=5.0,
                      help="the torchft lighthouse's heartbeat timeout")
    plan_measure.add_flags(p)
    out = p.add_argument_group("output")
    out.add_argument("--search", action="store_true", help="rank the fitting layouts")
    out.add_argument("--top", type=int, default=5, help="layouts --search prints")
    out.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def _layout_flags(lay: argparse._ArgumentGroup) -> None:
    lay.add_argument("--tp", type=int, help="tensor parallel degree")
    lay.add_argument("--cp", type=int, help="context parallel degree")
    lay.add_argument("--pp", type=int, help="pipeline parallel degree")
    lay.add_argument("--ep", type=int, help="expert parallel degree (MoE models; borrows "
                     "dp_shard x cp x tp ranks)")
    lay.add_argument("--dp_replicate", type=int, help="HSDP replicas")
    lay.add_argument("--dp_shard", type=int, help="FSDP shard degree; -1 = the rest")
    lay.add_argument("--local_batch_size", type=int, help="sequences per microbatch (default 1)")
    lay.add_argument("--pp_schedule", choices=SCHEDULES)
    lay.add_argument("--ac", help="activation checkpointing: auto (the least that fits), none, "
                     "op, full, or N (every N-th block); default auto")
    for name, what in (("compile", "compiled blocks (fused element-wise kernels)"),
                       ("float8", "Float8 linear layers (torchao)"),
                       ("async_tp", "async TP (needs --compile; no time credited)")):
        lay.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, help=what)
    for name, kind, what in POLICIES:
        if kind is bool:
            lay.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, help=what)
        elif isinstance(kind, list):
            lay.add_argument(f"--{name}", choices=kind, help=what)
        else:
            lay.add_argument(f"--{name}", type=kind, help=what)


def _pick(flag: Any, fallback: Any) -> Any:
    return fallback if flag is None else flag


def _cluster(args: argparse.Namespace, num_gpus: int) -> Cluster:
    gpu = load_profile(args.hardware).gpu if args.hardware else GPUS[args.gpu]
    gpu = dataclasses.replace(
        gpu, memory_gib=_pick(args.gpu_memory_gib, gpu.memory_gib),
        peak_tflops=_pick(args.peak_tflops, gpu.peak_tflops),
        intra_node_gbps=_pick(args.intra_node_gbps, gpu.intra_node_gbps),
        inter_node_gbps=_pick(args.inter_node_gbps, gpu.inter_node_gbps))
    per_node = args.gpus_per_node
    if num_gpus < per_node:
        per_node = num_gpus
    if num_gpus % per_node:
        raise LayoutError(f"--num_gpus {num_gpus} is not a multiple of --gpus_per_node "
                          f"{per_node}")
    return Cluster(gpu, gpus_per_node=per_node, num_nodes=num_gpus // per_node)


def _num_gpus(args: argparse.Namespace, config: JobConfig | None) -> tuple[int, str]:
    """GPUs in all, and where the number comes from: --num_gpus or --nodes, else (with
    --config) the config's degrees when they fix it, else NPROC (or NGPU) x NNODES as
    run_train.sh would launch it, else one node."""
    if args.num_gpus or args.nodes:
        given = args.num_gpus or args.nodes * args.gpus_per_node
        return given, "--num_gpus" if args.num_gpus else "--nodes"
    if config is not None:
        if implied := implied_num_gpus(config):
            return implied, "the config's degrees"
        if os.environ.get("NPROC") or os.environ.get("NGPU"):
            return world_size_of(os.environ), "NPROC x NNODES"
    return args.gpus_per_node, "one node, the default"


def _read_config(args: argparse.Namespace) -> JobConfig | None:
    """The --config job (with --flavor's model, when given), or None."""
    import_custom_modules(args.custom_import)
    if not args.config:
        return None
    config = build_job_config(["--job.config_file", args.config, *args.overrides])
    import_custom_modules(config.job.custom_import)
    if args.flavor:
        config.model.name, config.model.flavor = args.model, args.flavor
    config.optimizer.name = args.optimizer or config.optimizer.name
    return config


def _from_config_or_flavor(args: argparse.Namespace, config: JobConfig | None, num_gpus: int
                           ) -> tuple[ModelShape, Workload, Layout]:
    if config is not None:
        if implied_num_gpus(config) not in (None, num_gpus):  # --num_gpus says otherwise:
            config.parallelism.data_parallel_shard_degree = -1  # FSDP takes the rest
        return from_job_config(config, num_gpus)
    if not args.flavor:
        raise LayoutError("name a model: --flavor (with --model) or --config")
    config = build_job_config([f"--model.name={args.model}", f"--model.flavor={args.flavor}",
                               f"--optimizer.name={args.optimizer or 'AdamW'}"])
    model, work, _ = from_job_config(config, num_gpus)
    return model, Workload(seq_len=8192, global_batch=0, optimizer=work.optimizer), \
        Layout(ac="auto")


def _workload(args: argparse.Namespace, work: Workload) -> Workload:
    seq_len = _pick(args.seq_len, work.seq_len)
    p = work.precision
    precision = dataclasses.replace(
        p, master_bytes=DTYPES[args.dtype].itemsize if args.dtype else p.master_bytes,
        compute_bytes=DTYPES[args.param_dtype].itemsize if args.param_dtype else p.compute_bytes,
        reduce_bytes=DTYPES[args.reduce_dtype].itemsize if args.reduce_dtype else p.reduce_bytes,
        state_bytes=DTYPES[args.state_dtype].itemsize % 4 if args.state_dtype else p.state_bytes)
    if args.state_dtype or args.optimizer_implementation:  # bf16 moments step in chunks
        kernel = args.optimizer_implementation or "foreach"
        precision = dataclasses.replace(precision, fused_optimizer=kernel == "fused",
                                        step_temporary=precision.state_bytes == 0
                                        and kernel == "foreach")
    global_batch = args.global_batch or (work.global_batch if args.config else
                                         max(1, 2**22 // seq_len))
    return dataclasses.replace(work, seq_len=seq_len, global_batch=global_batch,
                               tokens=args.tokens, precision=precision)


def pins_of(args: argparse.Namespace) -> dict[str, Any]:
    """The layout flags given on the command line (dp_shard -1 and ac auto pin nothing)."""
    pins = {name: getattr(args, name) for name in PINNABLE if getattr(args, name) is not None}
    if pins.get("dp_shard") == -1:
        del pins["dp_shard"]
    if pins.get("ac") == "auto":
        del pins["ac"]
    return pins


def _layout(args: argparse.Namespace, layout: Layout, num_gpus: int) -> Layout:
    pins = pins_of(args)
    changed = any(pins.get(d, getattr(layout, d)) != getattr(layout, d)
                  for d in ("tp", "cp", "pp", "dp_replicate"))
    shard = args.dp_shard if args.dp_shard is not None else (
        -1 if changed or not args.config else layout.dp_shard)  # FSDP takes the rest
    layout = dataclasses.replace(layout, **{k: v for k, v in pins.items() if k != "dp_shard"})
    if shard == -1:
        others = layout.tp * layout.cp * layout.pp * layout.dp_replicate
        if num_gpus % others:
            raise LayoutError(f"{num_gpus} GPUs do not divide into tp x cp x pp x "
                              f"dp_replicate = {others}")
        shard = num_gpus // others
    if layout.ac != "auto":
        check_ac(layout.ac)
    return dataclasses.replace(layout, dp_shard=shard)


def resolve(args: argparse.Namespace) -> tuple[ModelShape, Cluster, Workload, Layout]:
    """Planner inputs from the flags (and the config file, when given); sets
    ``args.gpus_per_node`` and ``args.gpus_from``."""
    config = _read_config(args)
    if args.gpus_per_node is None:  # a measured machine's processes per node, else 8
        args.gpus_per_node = load_profile(args.hardware).gpus_per_node if args.hardware else 8
    num_gpus, args.gpus_from = _num_gpus(args, config)
    if args.gpus_from == "one node, the default" and (args.calibrate or args.verify):
        num_gpus, args.gpus_from = 1, "one process, the default of --calibrate and --verify"
    cluster = _cluster(args, num_gpus)
    model, work, layout = _from_config_or_flavor(args, config, cluster.num_gpus)
    return model, cluster, _workload(args, work), _layout(args, layout, cluster.num_gpus)


def _si(value: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.3g}"


def _header(model: ModelShape, cluster: Cluster, work: Workload, args: argparse.Namespace
            ) -> list[str]:
    name = args.flavor or "from " + str(args.config)
    gpu = cluster.gpu
    moe = (f", {_si(model.active_params)} active per token: {model.num_experts} routed experts "
           f"top-{model.top_k} in {model.moe_layers} MoE blocks" if model.is_moe else "")
    return [
        f"Model: {args.model} {name}, {_si(model.num_params)} parameters{moe} "
        f"({model.n_layers} layers, dim {model.dim}, {model.n_heads} heads, "
        f"{model.kv_heads} KV heads, FFN {model.ffn_hidden_dim}, vocab {model.vocab_size})",
        f"Cluster: {cluster.num_gpus} x {gpu.name} ({cluster.num_nodes} node(s) of "
        f"{cluster.gpus_per_node}: {args.gpus_from}; {gpu.memory_gib:.4g} GiB, "
        f"{gpu.peak_tflops:.4g} TFLOP/s bf16, "
        f"{gpu.intra_node_gbps:.4g} GB/s in a node, {gpu.inter_node_gbps:.4g} GB/s between nodes)"
        + (f"; {load_profile(args.hardware).describe()}" if args.hardware else ""),
        f"Workload: seq {work.seq_len}, global batch {work.global_batch} sequences = "
        f"{_si(work.global_batch * work.seq_len)} tokens/step"
        + (f", budget {_si(work.tokens)} tokens" if work.tokens else ""),
    ]


def _memory_lines(result: Plan, model: ModelShape, work: Workload, args: argparse.Namespace
                  ) -> list[str]:
    mem, lay, prec, held = result.memory, result.layout, work.precision, memory_band()
    names = {4: "fp32", 2: "bf16"}
    states = state_bytes_per_parameter(model, work)
    return [
        f"Memory per GPU, peak at the {mem.moment}"
        + (f" (pipeline stage {mem.stage})" if lay.pp > 1 else "")
        + ", what is allocated at that moment:",
        *(f"  {label:17s} {value / GiB:8.2f} GiB" for label, value in (
            ("parameters", mem.parameters), ("gradients", mem.gradients),
            ("optimizer states", mem.optimizer), ("activations", mem.activations))),
        f"  total             {mem.total / GiB:8.2f} GiB  of {result.usable_gib:.1f} GiB usable "
        f"({result.capacity_gib:g} GiB less {args.headroom:.0%} headroom)",
        f"  reserved by the CUDA caching allocator, estimated: {result.reserved_estimate / GiB:.1f}"
        f" GiB (x{result.calibration.allocator_reserve:g}, calibrated on published runs' "
        f"max_reserved; held out on {held.runs} of them: {held.low - 1:+.0%} to "
        f"{held.high - 1:+.0%})",
        f"  bytes per parameter: {names[prec.master_bytes]} weights {prec.master_bytes} + "
        f"gradients {prec.master_bytes} + optimizer states {states:.3g} = "
        f"{2 * prec.master_bytes + states:.3g}, sharded over {lay.tp} (TP) x {lay.pp} (PP) x "
        f"{lay.fsdp_degree} (FSDP); {names[prec.compute_bytes]} compute copies "
        f"{prec.compute_bytes}; {names[prec.reduce_bytes]} reductions {prec.reduce_bytes}",
        *(["  per pipeline rank  " + " ".join(f"{total / GiB:.1f}" for total in
                                               result.stage_totals) + " GiB"]
          if lay.pp > 1 else []),
        "Verdict: " + ("FITS" if result.fits else "DOES NOT FIT")
        + f" ({mem.total / GiB:.1f} of {result.usable_gib:.1f} GiB)",
    ]


def _time_lines(result: Plan) -> list[str]:
    lines = ["Communication per step, bytes each GPU sends:"]
    for c in result.comms:
        lines.append(f"  {c.dim:12s} group {c.group:5d}  {c.link:10s} {c.bandwidth_gbps:6.3g} "
                     f"GB/s  {c.bytes_per_step / 1e9:10.2f} GB  {c.seconds:8.3f} s")
    if not result.comms:
        lines.append("  none (one GPU)")
    formula = bubble_formula(result.layout, result.microbatches)
    step = result.step
    lines += [
        f"Pipeline bubble: {result.bubble:.1%}" + (f" ({formula})" if formula else ""),
        f"Step time: {step.total:.3f} s = "
        + " + ".join(f"{name} {value:.3f}" for name, value in step.parts().items()
                     if name != "ep" or result.layout.ep > 1)
        + " (compute parts, then exposed communication and bubble; docs/planner-throughput.md)",
        f"Throughput: {result.tokens_per_second_per_gpu:,.0f} tokens/s per GPU, MFU "
        f"{result.mfu_estimate:.1%} (model FLOPs over the bf16 peak)",
        *uncertainty_lines(result),
    ]
    return lines


def _cost_lines(result: Plan, model: ModelShape, cluster: Cluster, work: Workload,
                args: argparse.Namespace) -> list[str]:
    flops = work.tokens * result.flops_per_token
    flops_6nd = 6 * model.params_6nd * work.tokens
    days_6nd = result.days * result.gpu_hours_6nd / result.gpu_hours
    source = "given" if args.mfu is not None else "estimated"
    held = expected_band(result.layout)  # GPU-hours scale as 1 / throughput
    band = "" if args.mfu is not None else \
        f", held-out band {_si(result.gpu_hours * held.low)}-{_si(result.gpu_hours * held.high)}"
    return [
        f"Compute: C = 6ND = {flops_6nd:.3g} FLOPs; with attention at seq {work.seq_len} "
        f"({result.flops_per_token / 1e9:.1f} GFLOP/token, the trainer's MFU count) "
        f"{flops:.3g} FLOPs",
        f"GPU-hours: {_si(result.gpu_hours_6nd)} (6ND) | {_si(result.gpu_hours)} "
        f"(with attention) at {result.mfu:.1%} MFU ({source}{band})",
        f"Days on {cluster.num_gpus} GPUs: {days_6nd:.1f} (6ND) | {result.days:.1f} "
        "(with attention)",
    ]


def failure_inputs(result: Plan, model: ModelShape, cluster: Cluster, work: Workload,
                   args: argparse.Namespace) -> FailureInputs:
    """The failure pricing's inputs: the plan's step time and per-GPU state, the flags."""
    lay, prec = result.layout, work.precision
    per_param = prec.master_bytes + state_bytes_per_parameter(model, work)
    return FailureInputs(
        num_gpus=cluster.num_gpus, gpu_mttf_hours=args.gpu_mttf_hours,
        step_seconds=result.step_seconds, checkpoint_interval=args.checkpoint_interval,
        checkpoint_seconds=args.checkpoint_seconds, restart_seconds=args.restart_seconds,
        state_bytes_per_gpu=model.num_params * per_param / (lay.tp * lay.pp * lay.fsdp_degree),
        link_gbps=cluster.gpu.inter_node_gbps, groups=lay.dp_replicate,
        heartbeat_seconds=args.heartbeat_seconds)


def format_plan(result: Plan, model: ModelShape, cluster: Cluster, work: Workload,
                args: argparse.Namespace) -> str:
    """The human-readable report of one layout."""
    chosen = " (auto: the least recomputation that fits)" if args.ac == "auto" else ""
    lines = [
        *_header(model, cluster, work, args),
        f"Layout: {result.layout.label()}{chosen}; {result.microbatches} microbatch(es) per "
        "step per rank",
        "",
        *_memory_lines(result, model, work, args),
        "",
        *_time_lines(result),
        *(_cost_lines(result, model, cluster, work, args) if work.tokens else []),
    ]
    if args.gpu_mttf_hours:
        inputs = failure_inputs(result, model, cluster, work, args)
        lines += failure_lines(inputs, failure_cost(inputs))
    return "\n".join(lines + [f"Note: {note}" for note in result.notes]
                     + history_lines(args.history))


def _run_search(model: ModelShape, cluster: Cluster, work: Workload, layout: Layout,
                args: argparse.Namespace, kwargs: dict[str, Any]) -> int:
    kept = KEPT_OPTIONS + (("pp_schedule", "pp_virtual_stages") if args.config else ())
    pins = {**{k: getattr(layout, k) for k in kept}, **pins_of(args)}
    plans = search(model, cluster, work, pins=pins, top=args.top, **kwargs)
    print(json.dumps([p.to_dict() for p in plans], indent=1) if args.json
          else format_search(plans, _header(model, cluster, work, args), model, work,
                             pins_of(args)))
    return 0 if plans else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:split])
    args.overrides = argv[split + 1:]
    if args.mfu is not None and args.mfu > 1:
        args.mfu /= 100  # given in percent
    try:
        plan_measure.check_flags(args, pins_of(args))
        if args.verify:
            return plan_measure.verify(args, argv, lambda: _planned(args))
        model, cluster, work, layout = resolve(args)
        if args.calibrate:
            return plan_measure.calibrate(args, argv, model, work, layout, cluster)
        kwargs = {"mfu": args.mfu, "headroom": args.headroom}
        if args.search:
            return _run_search(model, cluster, work, layout, args, kwargs)
        args.ac = layout.ac  # "auto" unless the flag or the config names a mode
        result = plan_fitting(model, cluster, work, layout, **kwargs)
    except (LayoutError, ConfigError, ValueError) as e:
        print(f"plan error: {e}", file=sys.stderr)
        return 2
    if args.json:
        record = with_uncertainty(result)
        if args.gpu_mttf_hours:
            record["failures"] = dataclasses.asdict(
                failure_cost(failure_inputs(result, model, cluster, work, args)))
        print(json.dumps(record, indent=1))
    else:
        print(format_plan(result, model, cluster, work, args))
    return 0 if result.fits else 1


def _planned(args: argparse.Namespace) -> tuple[Plan, Cluster, str]:
    """The plan of the flags, its cluster and its report (for --verify)."""
    model, cluster, work, layout = resolve(args)
    result = plan_fitting(model, cluster, work, layout, mfu=args.mfu, headroom=args.headroom)
    args.ac = layout.ac
    return result, cluster, format_plan(result, model, cluster, work, args)


if __name__ == "__main__":
    raise SystemExit(main())
