"""What a step pays beside the kernels the compute parts count at their peak rates: matmul
shapes too thin to be compute-bound, the optimizer step, FSDP's copies and the host's dispatch
of every op.
Each is counted from first principles, with the per-op host costs measured (``GPU`` fields;
``ttl-plan --calibrate`` measures this machine's); none is fitted.

**Matmul shapes** (``roofline_factor``). The gemm term runs every weight matmul at the best
large matmul's rate (MAMF). A matmul of an (r x k) by a (k x c) matrix also moves
(rk + kc + rc) x bytes through HBM; where that takes longer than its 2rkc FLOPs (thin shapes:
a grouped-query K/V projection split over TP 8 has c = 128), it runs at the memory's pace. The
factor is the step's matmul seconds with each shape (forward, input gradient, weight gradient
of every block weight and the head, ``gemm_shapes``) at max(FLOPs / rate, bytes / HBM), over
the same at FLOPs / rate. With a measured matmul rate (a hardware profile, measured at the
job's shapes) the factor is 1: the measurement has it. Dense blocks; an MoE block's grouped
GEMMs are left at the FLOP count.

**Optimizer step** (``optimizer_seconds``). After the backward and before the next forward,
nothing overlaps it: gradient clipping (a norm over the gradients and their scaling: 3 element
accesses per parameter) and Adam over each GPU's sharded parameters. torch's foreach Adam
makes 20 accesses per parameter (the decoupled decay, the two moment updates in place, the
square root into a temporary, its scaling and epsilon, and the update: 2 + 3 + 2 + 3 + 2 + 2
+ 2 + 4), the fused kernel 7 (reads p, g, m, v; writes p, m, v), each of the master dtype's
bytes, at HBM bandwidth. Muon's element-wise passes over the matrices (the momentum and
Nesterov mixes, the decay and the update: 11 accesses) are counted at Adam's, within that
range; its Newton-Schulz iterations and owner traffic are added to the same term
(optimizer.py: ``orthogonalization_seconds``, 0 for an optimizer without them).

**FSDP's copies** (``fsdp_copy_seconds``, in the fsdp part). Beside its collectives FSDP2
copies every unit it gathers out of the all-gather buffer into the parameters and its shard in,
and every gradient it reduces into the reduce-scatter buffer and the reduced shard out: read
and write each, at HBM bandwidth. A GPU issues the copy-out on the compute stream and the rest
on the collectives' streams; a CPU process does them all on the thread that computes.

**Host dispatch** (``host_seconds``). Every op the trainer issues costs the host its dispatch
(Python, autograd, the dispatcher, the launch): ``GPU.host_op_s`` each, measured by timing a
block's forward and backward on tiny tensors, where nothing but dispatch is left, and
``OPS_PER_BLOCK`` ops for a Llama block's forward and backward (counted by a dispatch mode);
a tensor-parallel block's ops go through DTensor (``GPU.host_dtensor_op_s`` more each, the same
measurement with the block's TP plan on a one-rank mesh); a compiled block dispatches
``GPU.host_compiled_share`` of the eager cost (measured likewise, compiled); FSDP's hooks cost
``GPU.host_fsdp_unit_s`` per unit and microbatch; each synchronous TP collective
``GPU.host_collective_s`` (a CPU process's redistribution work on the computing thread,
measured by ``ttl-plan --calibrate``: tools/sync_cost.py; 0 unless measured). A GPU runs
the ops the host queued, so the host delays the step only by what exceeds the device's own
time; a CPU process dispatches on the thread that computes, so there it adds whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchtitan_like.tools.planner.communication import fsdp_gathers, tp_collectives
from torchtitan_like.tools.planner.optimizer import orthogonalization_seconds
from torchtitan_like.tools.planner.schedule import busiest_rank_layers, checkpointed

if TYPE_CHECKING:
    from torchtitan_like.tools.planner.inputs import GPU, Cluster, Layout, ModelShape, Workload

OPS_PER_BLOCK = 221
"""Ops one Llama block's forward and backward issue (torch 2.13: aten ops counted by a
TorchDispatchMode over one eager forward and backward of the 100M flavor's block); the other
families are counted at it."""

ADAM_ACCESSES = {"foreach": 20, "fused": 7}
"""Element accesses per parameter of one Adam step (module docstring)."""

CLIP_ACCESSES = 3
"""A gradient norm (read) and the gradients' scaling (read and write)."""


def gemm_shapes(m: ModelShape, tp: int, tokens: int) -> list[tuple[int, int, int, int]]:
    """(count, rows, inner, columns) of every matmul of the blocks and the head on one TP
    rank for ``tokens`` tokens: forward (x W^T), input gradient (dy W), weight gradient
    (dy^T x)."""
    h, kv = m.dim, m.kv_heads * m.head_dim
    weights = [(1, m.q_dim // tp, h), (2, kv // tp, h), (1, h, m.q_dim // tp),
               (2, m.ffn_hidden_dim // tp, h), (1, h, m.ffn_hidden_dim // tp)]
    shapes = []
    for count, out, inner in weights:
        n = count * m.n_layers
        shapes += [(n, tokens, inner, out), (n, tokens, out, inner), (n, out, tokens, inner)]
    vocab = m.vocab_size // tp
    return [*shapes, (1, tokens, h, vocab), (1, tokens, vocab, h), (1, vocab, tokens, h)]


def roofline_factor(m: ModelShape, gpu: GPU, layout: Layout, work: Workload, rate: float
                    ) -> float:
    """The matmuls' seconds with thin shapes at HBM pace over their seconds at ``rate``
    (FLOP/s; module docstring); 1 for a measured rate or an MoE model."""
    if gpu.gemm_tflops_by_dtype or m.is_moe:
        return 1.0
    tokens = layout.local_batch_size * work.seq_len // layout.cp
    bytes_per = 1 if layout.float8 else work.precision.compute_bytes
    bound = flops = 0.0
    for count, rows, inner, cols in gemm_shapes(m, layout.tp, tokens):
        f = 2 * rows * inner * cols / rate
        moved = (rows * inner + inner * cols + rows * cols) * bytes_per / (gpu.hbm_tbps * 1e12)
        bound, flops = bound + count * max(f, moved), flops + count * f
    return bound / flops


def optimizer_seconds(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout
                      ) -> float:
    """Gradient clipping, the element-wise step over the busiest GPU's sharded parameters
    and the optimizer's orthogonalization (Muon's), all exposed (module docstring)."""
    prec = work.precision
    params = (busiest_rank_layers(m, layout) * m.block_params + m.embedding_params
              + m.head_params) / (layout.tp * layout.fsdp_degree)
    accesses = CLIP_ACCESSES + ADAM_ACCESSES["fused" if prec.fused_optimizer else "foreach"]
    elementwise = params * accesses * prec.master_bytes / (cluster.gpu.hbm_tbps * 1e12)
    return elementwise + orthogonalization_seconds(m, cluster, work, layout)


def fsdp_copy_seconds(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout,
                      microbatches: int) -> float:
    """FSDP's own copies on the busiest GPU per step (module docstring): per gather, the
    shard into the all-gather buffer and the gathered unit out into the parameters (read and
    write each); per reduction, the unsharded gradients into the reduce-scatter buffer and the
    reduced shard out; at HBM bandwidth. A GPU runs the copy-out on the compute stream (the
    rest beside it, on the collectives' streams); a CPU process all of them on the thread that
    computes."""
    if not layout.fsdp_enabled:
        return 0.0
    prec, n = work.precision, layout.fsdp_degree
    full = (busiest_rank_layers(m, layout) * m.block_params + m.embedding_params
            + m.head_params) / layout.tp
    gathers, syncs = fsdp_gathers(layout, microbatches), 1 if layout.pp > 1 else microbatches
    copy_out = gathers * 2 * full * prec.compute_bytes
    rest = gathers * 2 * full / n * prec.compute_bytes + syncs * 2 * (full + full / n) \
        * prec.reduce_bytes
    hidden = cluster.gpu.comm_overlaps_compute
    return (copy_out + (0.0 if hidden else rest)) / (cluster.gpu.hbm_tbps * 1e12)


def host_seconds(m: ModelShape, gpu: GPU, layout: Layout, microbatches: int) -> float:
    """The busiest GPU's host dispatch per step (module docstring), before any overlap."""
    layers = busiest_rank_layers(m, layout)
    recomputed = sum(checkpointed(layout.ac, layers))
    per_op = gpu.host_op_s * (gpu.host_compiled_share if layout.compile else 1.0)
    if layout.tp > 1 and not layout.compile:  # compiled blocks trace DTensor away
        per_op += gpu.host_dtensor_op_s
    blocks = (layers + recomputed / 3) * OPS_PER_BLOCK * per_op  # a recompute: a forward
    units = (layers + 2) * gpu.host_fsdp_unit_s if layout.fsdp_enabled else 0.0
    collectives = tp_collectives(m, layout, microbatches) * gpu.host_collective_s
    return microbatches * (blocks + units) + collectives
