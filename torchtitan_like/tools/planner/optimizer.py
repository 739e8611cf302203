"""The optimizer's share of a plan: its states' bytes, and Muon's orthogonalization time and
traffic. What the optimizer keeps and does comes from its registry entry's ``StateFootprint``
(components/optim/registry.py), ``Workload.optimizer``; the default is Adam's.

States (memory.py). The blocks' parameters are the hidden matrices (their norm gains, a few
thousandths of them, are counted with them), the embedding and head the rest:

    states = matrices x matrix_states x matrix_state_bytes + rest x other_states x state_bytes

Adam: 2 x 4 bytes everywhere (2 x 2 with bf16 moments); Muon: one momentum per matrix element
in the parameters' dtype, AdamW's two moments on the rest.

Newton-Schulz (Muon; the step-time's optimizer term, overheads.py adds it to the step). Each
k-step iteration of an a x b matrix (a <= b, after torch's transpose) costs k (4 a^2 b + 2 a^3)
FLOPs: X X^T, the Gram polynomial's product, and its product with X. Every matrix of the stage
is iterated once per replica, by one owner among the dp_shard x cp x tp ranks that hold its
shards (components/optim/newton_schulz.py; routed experts are split over the same ranks by EP
and expert FSDP), so a GPU iterates 1/(dp_shard x cp x tp) of its stage's matrices, at the bf16
matmul rate, or a hardware profile's measured rate in the iteration's dtype (an fp32 iteration
without one at 1/FP32_SLOWDOWN of the bf16 rate). Matrices sharded over those ranks
travel to their owners and back in the iteration's dtype: an all-to-all on NCCL, each GPU
sending (N - 1)/N of its shards of the stage's dense matrices each way (experts need no gather).
Both are exposed: the step runs after backward, before the next forward.
"""

from __future__ import annotations

from torchtitan_like.tools.planner.hardware import DTYPE_NAMES, gemm_rate
from torchtitan_like.tools.planner.inputs import Cluster, Layout, ModelShape, Workload
from torchtitan_like.tools.planner.links import link, ring_volume
from torchtitan_like.tools.planner.schedule import busiest_rank_layers

FP32_SLOWDOWN = 15.0
"""bf16 / fp32 dense matmul peak without TF32 (H100 SXM 989 / 67 TFLOP/s; A100 312 / 19.5):
an fp32 iteration's rate where no hardware profile measured fp32."""


def optimizer_state_bytes(work: Workload, params: float, matrices: float) -> float:
    """Bytes of optimizer state for ``params`` parameters of which ``matrices`` are the
    blocks' (module docstring)."""
    f, state = work.optimizer, work.precision.optimizer_state_bytes
    return (matrices * f.matrix_states * (f.matrix_state_bytes or state)
            + (params - matrices) * f.other_states * state)


def state_bytes_per_parameter(m: ModelShape, work: Workload) -> float:
    """Optimizer state bytes per parameter of the whole model, on average."""
    return optimizer_state_bytes(work, m.num_params, m.n_layers * m.block_params) / m.num_params


def block_matrices(m: ModelShape) -> list[tuple[float, int, int]]:
    """(matrices per block, rows, columns) of an average block: the attention projections
    (Llama's shapes; latent attention's are approximated by them), the dense feed-forward's
    three, each MoE block's routed and shared experts' three each."""
    kv = m.kv_heads * m.head_dim
    matrices = [(1.0, m.q_dim, m.dim), (2.0, kv, m.dim), (1.0, m.dim, m.q_dim),
                (3.0 * (1 - m.moe_share), m.ffn_hidden_dim, m.dim)]
    if m.is_moe:
        experts = m.num_experts + m.shared_experts
        matrices.append((3.0 * m.moe_share * experts, m.expert_dim, m.dim))
    return matrices


def newton_schulz_flops(m: ModelShape, steps: int) -> float:
    """FLOPs of one iteration of every matrix of an average block."""
    return sum(count * steps * (4 * min(r, c) ** 2 * max(r, c) + 2 * min(r, c) ** 3)
               for count, r, c in block_matrices(m))


def orthogonalization_seconds(m: ModelShape, cluster: Cluster, work: Workload,
                              layout: Layout) -> float:
    """Muon's Newton-Schulz time and exposed owner traffic per step on the busiest GPU
    (module docstring); 0 for an optimizer without it."""
    f = work.optimizer
    if not f.newton_schulz_steps:
        return 0.0
    owners = layout.fsdp_degree * layout.tp
    layers = busiest_rank_layers(m, layout)
    dtype = DTYPE_NAMES[f.newton_schulz_bytes]
    rate = gemm_rate(cluster.gpu, dtype)  # measured by --calibrate, or the preset's bf16 share
    if dtype not in dict(cluster.gpu.gemm_tflops_by_dtype) and dtype == "float32":
        rate /= FP32_SLOWDOWN
    compute = layers * newton_schulz_flops(m, f.newton_schulz_steps) / owners / rate
    if owners == 1:
        return compute
    dense = layers * (m.block_params - m.expert_block_params) / owners * f.newton_schulz_bytes
    sent = 2 * ring_volume(owners, dense)
    _, gbps, latency = link(cluster, owners, sent / owners, "all_to_all")
    return compute + sent / (gbps * 1e9) + 2 * (owners - 1) * latency
