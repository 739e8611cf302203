"""Step time on one GPU, in named parts, and the tokens/s and MFU that follow.

    (every compute part on the busiest pipeline rank: x its blocks / the average)
    gemm        weight matmuls: 6 FLOPs per weight per token (the model's flops_per_token
                less attention), at ``gpu.gemm_efficiency`` of the bf16 peak (the measured
                best large matmul, MAMF; inputs.py gives the source per GPU), thin shapes at
                HBM pace (overheads.roofline_factor), or at a hardware profile's rate measured
                at the job's shapes in its compute dtype; with Float8
                the blocks' linears (not the output head) at the same share of the fp8 peak
                (no sourced fp8 MAMF; a fitted share did not improve the held-out table)
    attention   QK^T and AV: a causal flash kernel computes half the score matrix, forward
                4 s^2 q / 2 per sequence and layer, backward 2.5 x that (ring.py:
                FLASH_BACKWARD_FLOPS; the model's flops_per_token counts 2 x, as MFU does),
                at ``gpu.attention_efficiency`` of the bf16 peak; under CP each rank computes 1/cp
                of it, the ring's steps on received chunks at the calibrated share of that
                rate (the busiest rank more without a load balancer: ring.py)
    memory_bound  the blocks' element-wise kernels: the calibrated passes x the bytes of the
                activations they produce, over the HBM bandwidth
    recompute   one more forward of every fully checkpointed block (a third of its share of
                gemm and memory_bound, 1/3.5 of its attention); op-level selective AC
                recomputes only element-wise ops (counted in the passes) and an MoE's
                routed-expert grouped GEMMs, not among its saved ops (one forward of them:
                moe.routed_forward_share), TorchTitan's also every other matmul
                (``layout.op_sac_every_other_matmul``: one more forward of those)
    tp          TP/SP all-gathers and reduce-scatters sit on the critical path; async TP is
                not credited (``ASYNC_TP``); with a measured ``GPU.sync_skew_s`` (a CPU
                profile: tools/sync_cost.py) each also waits that long for the slower rank
    cp          ring attention's K/V traffic that no step's compute hides, and its
                element-wise merges (ring.py: per step, against one chunk's attention)
    fsdp        FSDP/HSDP all-gathers and reduce-scatters overlap compute up to its length;
                the first unit's gather and the last unit's reduce-scatter are always exposed;
                under PP the reductions run after the stage's last backward: all exposed,
                pp times over with a runtime that reduces before sending (see
                ``_exposed_data_parallel``); plus FSDP's own copies (overheads.py)
    pp          point-to-point activation transfers (exposed)
    grad_accumulation  pipelined FSDP's per-microbatch accumulation of the stage's unsharded
                gradients in the reduce dtype, at HBM bandwidth (``gradient_accumulation``)
    optimizer   gradient clipping and the optimizer step over the GPU's sharded parameters, at
                HBM bandwidth, plus Muon's Newton-Schulz iterations and the trips of its
                matrices to their owner ranks and back (overheads.py, optimizer.py; exposed:
                nothing runs beside it)
    host        the host's dispatch of every op beyond the device's own time (overheads.py:
                measured per-op costs; on a CPU process all of it)
    bubble      (compute + grad_accumulation + tp + cp + ep) x b / (1 - b), b from
                schedule.bubble_fraction
    ep          MoE all-to-all dispatch and combine (moe.py: its volume): on the critical
                path, as TP's collectives, since the experts wait for their tokens and the
                next block for the combined output (no schedule here overlaps them with
                another microbatch's compute); with ``layout.ep_overlapped`` (DeepSeek's
                DualPipe, a published run's input) only what exceeds the compute it hides
                behind, and it no longer stretches the bubble

The fitted numbers (memory-bound passes, the ring's efficiency) come in a ``Calibration``
(calibration.py: what each is fitted to and judged on; docs/planner-throughput.md).
"""

from __future__ import annotations

import dataclasses

from torchtitan_like.tools.planner.activations import (
    alternate_matmul_share,
    layer_elements,
    routed_elements,
)
from torchtitan_like.tools.planner.calibration import CALIBRATION, Calibration
from torchtitan_like.tools.planner.communication import tp_collectives
from torchtitan_like.tools.planner.hardware import DTYPE_NAMES, gemm_rate
from torchtitan_like.tools.planner.inputs import Cluster, Layout, ModelShape, Workload
from torchtitan_like.tools.planner.links import Comm, rate_at
from torchtitan_like.tools.planner.moe import routed_forward_share
from torchtitan_like.tools.planner.overheads import (
    fsdp_copy_seconds,
    host_seconds,
    optimizer_seconds,
    roofline_factor,
)
from torchtitan_like.tools.planner.ring import FLASH_BACKWARD_FLOPS, attention_factor, ring_time
from torchtitan_like.tools.planner.schedule import (
    bubble_fraction,
    busiest_rank_layers,
    checkpointed,
    rank_layers,
)

ASYNC_TP = ("async TP: no time credited: fitted on the published runs with it, the share of TP's "
            "collectives it hides comes out 0 (docs/planner-throughput.md)")
"""What the planner says of ``layout.async_tp``."""

ATTENTION_PASS_FLOPS = 1 + FLASH_BACKWARD_FLOPS
"""Forward and backward of the attention kernel, in forwards."""


@dataclasses.dataclass
class StepTime:
    """Seconds per optimizer step on one GPU, by part (see the module docstring)."""

    gemm: float
    attention: float
    memory_bound: float
    recompute: float
    tp: float
    cp: float
    fsdp: float
    pp: float
    bubble: float
    ep: float = 0.0
    grad_accumulation: float = 0.0
    optimizer: float = 0.0
    """Gradient clipping, the optimizer step and Muon's Newton-Schulz (overheads.py)."""
    host: float = 0.0
    """The host's dispatch beyond the device's time (overheads.py)."""

    @property
    def compute(self) -> float:
        return self.gemm + self.attention + self.memory_bound + self.recompute

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in dataclasses.fields(self))

    def parts(self) -> dict[str, float]:
        return dataclasses.asdict(self)


ROUTED_PASSES = 8
"""Times an MoE block's routed token copies (top_k x dim per token) cross HBM: the dispatch
reads each token and writes its copies sorted by expert, the combine reads the expert outputs
and writes their weighted sum (2 x read + write), and the backward does both again."""


def _elementwise_elements(m: ModelShape, tp: int, fused_norm: bool) -> float:
    """Activation elements per token a block's memory-bound kernels produce on one TP rank:
    those it keeps without AC, less the all-gathered matmul inputs of sequence parallelism
    (NCCL writes them; the norms before them produce h/tp) and the routed copies of an MoE
    block (timed apart: ``ROUTED_PASSES``)."""
    gathered = 2 * (m.dim - m.dim / tp)
    return layer_elements(m, "none", tp, fused_norm) - gathered - routed_elements(m, tp)


def _gemm_time(m: ModelShape, cluster: Cluster, layout: Layout, work: Workload,
               tokens: float) -> tuple[float, float]:
    """(all weight matmuls, the output head's) seconds for ``tokens`` tokens on one GPU."""
    gpu = cluster.gpu
    gemm_flops = tokens * m.flops_per_token(0)
    head_flops = tokens * 6 * m.vocab_size * m.dim  # the output projection (stays bf16)
    rate = gemm_rate(gpu, DTYPE_NAMES.get(work.precision.compute_bytes, "bfloat16"))
    shapes = roofline_factor(m, gpu, layout, work, rate)  # thin matmuls at HBM pace
    measured = dict(gpu.gemm_tflops_by_dtype)
    if layout.float8 and (gpu.fp8_tflops or "float8" in measured):  # (else emulated: bf16)
        fp8 = gemm_rate(gpu, "float8")
        return shapes * (head_flops / rate + (gemm_flops - head_flops) / fp8), \
            shapes * head_flops / rate
    return shapes * gemm_flops / rate, shapes * head_flops / rate


def attention_rate(cluster: Cluster, seq_len: int) -> float:
    """FLOP/s of the attention kernels on ``seq_len`` tokens: measured at lengths around it
    (``GPU.attention_tflops_by_seq``, a hardware profile) or the preset's share of its peak."""
    gpu = cluster.gpu
    return rate_at(gpu.attention_tflops_by_seq, seq_len) * 1e12 \
        or gpu.peak_tflops * 1e12 * gpu.attention_efficiency


def compute_times(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout,
                  calibration: Calibration = CALIBRATION
                  ) -> tuple[float, float, float, float]:
    """(gemm, attention, memory_bound, recompute) seconds per step on one GPU."""
    gpu = cluster.gpu
    local_tokens = work.global_batch * work.seq_len / layout.dp / layout.cp
    tokens = local_tokens / (layout.tp * layout.pp)  # FLOPs split over TP and PP too
    imbalance = busiest_rank_layers(m, layout) * layout.pp / m.n_layers  # the slowest stage
    gemm, head = _gemm_time(m, cluster, layout, work, tokens)
    gemm *= imbalance
    forward = tokens * m.attention_flops_per_token(work.seq_len) / 6  # causal, one forward
    kernel_rate = attention_rate(cluster, work.seq_len // layout.cp)  # a CP rank's chunk
    attention = forward * ATTENTION_PASS_FLOPS / kernel_rate * imbalance \
        * attention_factor(layout, calibration.ring_efficiency)
    passes = calibration.compiled_passes if layout.compile else calibration.eager_passes
    crossings = (_elementwise_elements(m, layout.tp, gpu.fused_rms_norm) * passes
                 + routed_elements(m, layout.tp) / 2 * ROUTED_PASSES) * m.n_layers / layout.pp
    memory_bound = local_tokens * crossings * work.precision.compute_bytes \
        / (gpu.hbm_tbps * 1e12) * imbalance
    share = sum(checkpointed(layout.ac, m.n_layers)) / m.n_layers
    block_gemm = gemm - head * imbalance  # (the head is on one stage: approx.)
    recompute = share * ((block_gemm + memory_bound) / 3 + attention / ATTENTION_PASS_FLOPS)
    if layout.ac == "op":  # the routed experts' grouped GEMMs are recomputed (moe.py)
        recompute += gemm * routed_forward_share(m)
    if layout.ac == "op" and layout.op_sac_every_other_matmul:  # one more forward of those
        recompute += block_gemm * alternate_matmul_share(m) / 3
    return gemm, attention, memory_bound, recompute


def gradient_accumulation(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout,
                          microbatches: int) -> float:
    """Seconds a pipelined FSDP stage spends folding each microbatch's gradients into the
    unsharded accumulator, on the busiest pipeline rank.

    Under PP, torch.distributed.pipelining runs every microbatch's backward with FSDP's
    gradient sync off (``set_requires_gradient_sync(False)``), so FSDP2's post-backward keeps
    each gathered parameter's gradient unsharded: the first microbatch's bf16 gradient is cast
    to the reduce dtype (``FSDPParam.to_accumulated_grad_if_needed``: read c, write r bytes),
    every later one is added to it (``accumulate_unsharded_grad_if_needed``: read r + c, write
    r). Per gathered parameter and step: (c + r) + (m - 1)(c + 2r) bytes of HBM traffic; with
    the reduce dtype equal to the compute dtype autograd accumulates in place, 3c(m - 1).
    Without PP, FSDP reduce-scatters every microbatch (counted in ``fsdp``) and nothing of this
    size stays unsharded. Parameters: the busiest rank's blocks once gathered (dense over TP,
    experts over EP; the embedding and head are left out)."""
    if layout.pp == 1 or not layout.fsdp_enabled:
        return 0.0
    c, r = work.precision.compute_bytes, work.precision.reduce_bytes
    per_param = 3 * c * (microbatches - 1) if r == c else (c + r) + (microbatches - 1) * (c + 2 * r)
    params = busiest_rank_layers(m, layout) * m.gathered_block_params(layout.tp, layout.ep)
    return params * per_param / (cluster.gpu.hbm_tbps * 1e12)


def _exposed_data_parallel(m: ModelShape, work: Workload, layout: Layout,
                           seconds: dict[str, float], compute: float, microbatches: int,
                           overlaps: bool) -> float:
    """FSDP/HSDP seconds the step waits for. Without ``overlaps`` (a CPU process:
    ``GPU.comm_overlaps_compute``) all of it. Gathers and reductions overlap compute up to its
    length, and the first unit's gather and the last unit's reduction are always exposed.
    Under PP, torch.distributed.pipelining runs every unit's reduce-scatter (and HSDP's
    all-reduce) after the stage's last backward (``perform_reduce_grad``: FSDP's post_backward
    for all of them at once, then waiting for them), so the reduction is exposed whole.

    Older runtimes (``layout.pp_reduce_before_send``: torch before pytorch/pytorch#166449)
    run that post-backward inside the stage's last backward, before its gradient is sent to
    the previous stage, and FSDP2's post-backward makes the compute stream wait for each unit's
    reduce-scatter before issuing the next (``comm_ctx.reduce_scatter_state.event``): the last
    microbatch's backward then crosses every stage only after that stage's reduction, so the
    step carries the reductions of all pp x v stages in a row, pp x the rank's reduction (the
    whole of each, where all but its last unit's are waited for). scripts/pp_executor_timing.py
    checks it on torch's own step tables: 1F1B (pp 8, m 8) and interleaved 1F1B (v 2, m 16)
    both lengthen by 8 of a rank's reductions.
    """
    data = seconds.get("fsdp", 0.0) + seconds.get("dp_replicate", 0.0)
    if not overlaps:
        return data
    units = rank_layers(m, layout, 0) + 2  # blocks, embedding, head: one FSDP unit each
    if layout.pp == 1:
        return max(0.0, data - compute) + data / units / max(1, microbatches)
    prec = work.precision  # under PP the stage gathers once and reduces once per step
    reduce = seconds.get("fsdp", 0.0) * prec.reduce_bytes / (prec.compute_bytes
                                                              + prec.reduce_bytes)
    reduce += seconds.get("dp_replicate", 0.0)
    gather = data - reduce
    chain = layout.pp if layout.pp_reduce_before_send else 1
    return chain * reduce + max(0.0, gather - compute) + gather / units


def estimate_step_time(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout,
                       microbatches: int, comms: list[Comm],
                       calibration: Calibration = CALIBRATION) -> StepTime:
    """The parts of one optimizer step on the busiest GPU."""
    gemm, attention, memory_bound, recompute = compute_times(m, cluster, work, layout,
                                                             calibration)
    compute = gemm + attention + memory_bound + recompute
    seconds = {c.dim: c.seconds for c in comms}
    tp = seconds.get("tp", 0.0)  # async TP: no share hidden (ASYNC_TP)
    tp += tp_collectives(m, layout, microbatches) * cluster.gpu.sync_skew_s
    ring = ring_time(m, work, layout, microbatches,
                     attention_rate(cluster, work.seq_len // layout.cp),
                     calibration.ring_efficiency, next((c for c in comms if c.dim == "cp"), None),
                     cluster.gpu.hbm_tbps)
    cp = ring.total
    ep = seconds.get("ep", 0.0)
    if layout.ep_overlapped:  # another microbatch's compute runs during the all-to-all
        ep = max(0.0, ep - compute)
    fsdp = _exposed_data_parallel(m, work, layout, seconds, compute, microbatches,
                                  cluster.gpu.comm_overlaps_compute) \
        + fsdp_copy_seconds(m, cluster, work, layout, microbatches)
    accumulation = gradient_accumulation(m, cluster, work, layout, microbatches)
    b = bubble_fraction(layout.pp, microbatches, layout.modelled_schedule,
                        layout.stages_per_rank)
    bubble = (compute + accumulation + tp + cp + ep) * b / (1 - b)  # exposed ep only
    step = StepTime(gemm=gemm, attention=attention, memory_bound=memory_bound,
                    recompute=recompute, tp=tp, cp=cp, fsdp=fsdp, pp=seconds.get("pp", 0.0),
                    bubble=bubble, ep=ep, grad_accumulation=accumulation,
                    optimizer=optimizer_seconds(m, cluster, work, layout))
    host = host_seconds(m, cluster.gpu, layout, microbatches)
    step.host = max(0.0, host - step.total) if cluster.gpu.host_overlaps_device else host
    return step
