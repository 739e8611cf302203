"""Step time on one GPU, in named parts, and the tokens/s and MFU that follow.

    (every compute part on the busiest pipeline rank: x its blocks / the average)
    gemm        weight matmuls: 6 FLOPs per weight per token (the model's flops_per_token
                less attention), at ``gpu.gemm_efficiency`` of the bf16 peak (the measured
                best large matmul, MAMF; inputs.py gives the source per GPU); with Float8
                the blocks' linears (not the output head) at the fp8 peak x
                FLOAT8_GEMM_EFFICIENCY instead
    attention   QK^T and AV forward and backward (a causal flash kernel computes half the
                score matrix) at ATTENTION_EFFICIENCY of the bf16 peak
    memory_bound  the blocks' element-wise kernels: MEMORY_BOUND_PASSES x the bytes of the
                activations they produce, over the HBM bandwidth
    recompute   one more forward of every fully checkpointed block (a third of its share of
                the three parts above); op-level selective AC recomputes only element-wise ops
                (counted in the passes) and an MoE's routed-expert grouped GEMMs, not
                among its saved ops (one forward of them: moe.routed_forward_share),
                TorchTitan's also every other matmul (``layout.op_sac_every_other_matmul``:
                one more forward of those)
    tp          TP/SP all-gathers and reduce-scatters sit on the critical path; async TP
                hides ASYNC_TP_HIDDEN_SHARE of them behind the matmuls (at most the gemm
                time), the share TorchTitan's one published async-TP pair implies
    cp          the ring's K/V exchange overlaps the attention it feeds: only the excess
    fsdp        FSDP/HSDP all-gathers and reduce-scatters overlap compute up to its length;
                the first unit's gather and the last unit's reduce-scatter are always exposed;
                under PP the reductions run after the stage's last backward: all exposed,
                pp times over with a runtime that reduces before sending (see
                ``_exposed_data_parallel``)
    pp          point-to-point activation transfers (exposed)
    grad_accumulation  pipelined FSDP's per-microbatch accumulation of the stage's unsharded
                gradients in the reduce dtype, at HBM bandwidth (``gradient_accumulation``)
    bubble      (compute + grad_accumulation + tp + cp + ep) x b / (1 - b), b from
                schedule.bubble_fraction
    ep          MoE all-to-all dispatch and combine (moe.py: its volume): on the critical
                path, as TP's collectives, since the experts wait for their tokens and the
                next block for the combined output (no schedule here overlaps them with
                another microbatch's compute); with ``layout.ep_overlapped`` (DeepSeek's
                DualPipe, a published run's input) only what exceeds the compute it hides
                behind, and it no longer stretches the bubble

MEMORY_BOUND_PASSES (eager and compiled), FLOAT8_GEMM_EFFICIENCY and ASYNC_TP_HIDDEN_SHARE
are the step-time model's only fitted numbers, each fitted to one published run (the async-TP
share to one pair; Tables 1 and 4 of TorchTitan's performance docs,
docs/planner-throughput.md); every other published row tests them. (Memory has one more:
memory.ALLOCATOR_RESERVE.)
"""

from __future__ import annotations

import dataclasses

from torchtitan_like.tools.planner.activations import (
    alternate_matmul_share,
    layer_elements,
    routed_elements,
)
from torchtitan_like.tools.planner.communication import Comm
from torchtitan_like.tools.planner.inputs import Cluster, Layout, ModelShape, Workload
from torchtitan_like.tools.planner.moe import routed_forward_share
from torchtitan_like.tools.planner.schedule import (
    bubble_fraction,
    busiest_rank_layers,
    checkpointed,
    rank_layers,
)

ATTENTION_EFFICIENCY = 0.35
"""FlashAttention-2 reaches about 35% of an H100's bf16 peak (Shah et al., "FlashAttention-3",
2024, section 1); PyTorch's SDPA runs FA2-class kernels. Used for every GPU."""

MEMORY_BOUND_PASSES = {"eager": 35.2, "compiled": 25.4}
"""Times each activation element of a block (activations.layer_elements without AC) crosses
HBM in the block's memory-bound kernels (norms, RoPE, SwiGLU's element-wise ops, residual
adds, casts, forward and backward): fitted to TorchTitan's Llama 3.1 8B on 8 H100 (FSDP,
selective AC with its every-other-matmul policy), eager 5,762 and compiled 6,667
tokens/s/GPU."""

FLOAT8_GEMM_EFFICIENCY = 0.825
"""Share of the fp8 peak torchao's dynamically scaled Float8 linears reach, their casts and
scale computations included: fitted to the same run with Float8 (8,532 tokens/s/GPU). It lands
above what fp8 matmuls reach alone (about 0.7): part of that run's gain is something the
model does not represent, so Float8 predictions far from that shape deserve less trust (the
recomputed matmuls of that run's AC policy run in fp8 too)."""

ASYNC_TP_HIDDEN_SHARE = 0.262
"""Share of the TP/SP collectives' modelled time that async TP hides behind the matmuls,
calibrated on the published pair of runs differing only in async TP on the torch the
published table's rows used: TorchTitan's
docs/performance.md, Table 4 (Llama 3.1 70B on 256 H100, FSDP 32 x TP 8, seq 8192, local
batch 16, full AC, compile, Float8; torch of 2024-12), 829 tokens/s/GPU without async TP and
876 with. A GPU's step carries 512 x 8192 / 256 = 16,384 tokens, so the published steps are
16,384 / 829 = 19.764 s and 16,384 / 876 = 18.703 s: async TP saved 1.060 s. The planner
prices that row's TP collectives (communication.py, ring volume over NVLink) at 4.042 s, so
the hidden share is 1.060 / 4.042 = 0.262. Applied to every layout with async TP (never fitted
per row); the hidden time is capped at the gemm time, which the overlap needs. One pair on one
torch version (the one of the 405B rows too): which collectives torch's micro-pipeline pass
leaves unfused under Float8 and full AC is not published, and it changes with the version
(TorchTitan's benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, torch of 2025-06, same
70B layout: async TP saves 2.3 s a step in bf16, 2.8 s with Float8 tensorwise, 1.1 s rowwise)."""


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

    @property
    def compute(self) -> float:
        return self.gemm + self.attention + self.memory_bound + self.recompute

    @property
    def total(self) -> float:
        return sum(dataclasses.asdict(self).values())

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


def compute_times(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout
                  ) -> tuple[float, float, float, float]:
    """(gemm, attention, memory_bound, recompute) seconds per step on one GPU."""
    gpu = cluster.gpu
    local_tokens = work.global_batch * work.seq_len / layout.dp / layout.cp
    tokens = local_tokens / (layout.tp * layout.pp)  # FLOPs split over TP and PP too
    imbalance = busiest_rank_layers(m, layout) * layout.pp / m.n_layers  # the slowest stage
    attention_model = m.attention_flops_per_token(work.seq_len)
    gemm_flops = tokens * (m.flops_per_token(work.seq_len) - attention_model)
    head_flops = tokens * 6 * m.vocab_size * m.dim  # the output projection (stays bf16)
    bf16 = gpu.peak_tflops * 1e12 * gpu.gemm_efficiency
    if layout.float8 and gpu.fp8_tflops:  # (without fp8 tensor cores: emulated, bf16 rate)
        fp8 = gpu.fp8_tflops * 1e12 * FLOAT8_GEMM_EFFICIENCY
        gemm = head_flops / bf16 + (gemm_flops - head_flops) / fp8
    else:
        gemm = gemm_flops / bf16
    gemm *= imbalance
    attention = tokens * attention_model / 2 / (gpu.peak_tflops * 1e12 * ATTENTION_EFFICIENCY)
    passes = MEMORY_BOUND_PASSES["compiled" if layout.compile else "eager"]
    crossings = (_elementwise_elements(m, layout.tp, gpu.fused_rms_norm) * passes
                 + routed_elements(m, layout.tp) / 2 * ROUTED_PASSES) * m.n_layers / layout.pp
    attention *= imbalance
    memory_bound = local_tokens * crossings * work.precision.compute_bytes \
        / (gpu.hbm_tbps * 1e12) * imbalance
    share = sum(checkpointed(layout.ac, m.n_layers)) / m.n_layers
    block_gemm = gemm * (1 - head_flops / gemm_flops)  # (the head is on one stage: approx.)
    recompute = share * (block_gemm + attention + memory_bound) / 3
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
                           seconds: dict[str, float], compute: float, microbatches: int) -> float:
    """FSDP/HSDP seconds the step waits for. Gathers and reductions overlap compute up to its
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
              microbatches: int, comms: list[Comm]) -> StepTime:
    """The parts of one optimizer step on the busiest GPU."""
    gemm, attention, memory_bound, recompute = compute_times(m, cluster, work, layout)
    compute = gemm + attention + memory_bound + recompute
    seconds = {c.dim: c.seconds for c in comms}
    tp = seconds.get("tp", 0.0)
    if layout.async_tp:
        tp -= min(ASYNC_TP_HIDDEN_SHARE * tp, gemm)
    cp = max(0.0, seconds.get("cp", 0.0) - attention)
    ep = seconds.get("ep", 0.0)
    if layout.ep_overlapped:  # another microbatch's compute runs during the all-to-all
        ep = max(0.0, ep - compute)
    fsdp = _exposed_data_parallel(m, work, layout, seconds, compute, microbatches)
    accumulation = gradient_accumulation(m, cluster, work, layout, microbatches)
    b = bubble_fraction(layout.pp, microbatches, layout.modelled_schedule,
                        layout.stages_per_rank)
    bubble = (compute + accumulation + tp + cp + ep) * b / (1 - b)  # exposed ep only
    return StepTime(gemm=gemm, attention=attention, memory_bound=memory_bound,
                    recompute=recompute, tp=tp, cp=cp, fsdp=fsdp, pp=seconds.get("pp", 0.0),
                    bubble=bubble, ep=ep, grad_accumulation=accumulation)
