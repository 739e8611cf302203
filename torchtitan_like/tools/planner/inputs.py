"""What the planner is given: the GPU and cluster, the model's shapes, the workload and the
layout (degrees, batch, schedule, checkpointing and kernel options)."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Literal

from torchtitan_like.components.metrics import GPU_PEAK_TFLOPS
from torchtitan_like.components.optim.registry import StateFootprint
from torchtitan_like.distributed.fsdp import reshard_after_forward
from torchtitan_like.tools.planner.latent import LatentAttention, latent_attention
from torchtitan_like.tools.planner.moe import attention_fields, moe_fields

if TYPE_CHECKING:
    from torchtitan_like.protocols.model_args import BaseModelArgs

GiB = 2**30
ModelledSchedule = Literal["1F1B", "GPipe", "Interleaved1F1B"]
AC_MODES = ("none", "op", "full")
"""Activation checkpointing as the planner names it: none, op (selective per op), full, or a
number N (selective: every N-th block)."""


class LayoutError(ValueError):
    """A layout that cannot run this model/cluster/batch; the message says why."""


@dataclasses.dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    """Device memory as the driver reports it (nvidia-smi / rocm-smi total)."""
    peak_tflops: float
    """Dense bf16 TFLOP/s, no sparsity (the MFU denominator)."""
    intra_node_gbps: float
    """GB/s one GPU sends to the GPUs of its node, one direction (NVLink, Infinity Fabric)."""
    inter_node_gbps: float
    """GB/s one GPU sends to other nodes, one direction (its own NIC, rail-optimised fabric)."""
    gemm_efficiency: float = 0.8
    """Share of ``peak_tflops`` the best large bf16 matmul reaches (MAMF; see step_time.py)."""
    hbm_tbps: float = 3.35
    """TB/s of device memory bandwidth (datasheet), for the memory-bound kernels."""
    fp8_tflops: float = 0.0
    """Dense fp8 TFLOP/s (0: no fp8 tensor cores; Float8 is timed at the bf16 rate)."""
    fused_rms_norm: bool = True
    """RMSNorm is one kernel keeping only its input (CUDA, ROCm); the composite CPU version
    also keeps the normalised tensor."""
    fused_attention_any_v_dim: bool = True
    """SDPA's fused kernels take a value head size unlike the query/key one (CUDA's
    memory-efficient kernel); torch's CPU flash kernel does not, so MLA runs the math path
    there (tools/planner/attention.py)."""
    attention_fp32: bool = False
    """16-bit queries, keys and values are attended in fp32 and the output cast back (this
    project's CPU attention, models/attention.py): op-level AC then keeps the kernel's fp32
    output."""
    attention_efficiency: float = 0.35
    """Share of ``peak_tflops`` the attention kernels reach, forward and backward (the
    backward counted at 2.5 x the forward's FLOPs): FlashAttention-2 reaches about 35% of an
    H100's bf16 peak (Shah et al., "FlashAttention-3", 2024, section 1), PyTorch's SDPA runs
    FA2-class kernels; every GPU preset takes it (no per-GPU source)."""
    comm_overlaps_compute: bool = True
    """Whether data-parallel traffic (FSDP's gathers and reductions, HSDP's all-reduce) runs
    beside compute, as a GPU's copy engines and NICs let it. False for a CPU process: gloo's
    transfers and FSDP's copies run on the cores that compute (a 100M block's all-gather
    over two processes: 24 ms of CPU in its 29 ms, docs/measurements.md), so they add to the
    step whole."""
    intra_node_latency_s: float = 5e-6
    """Seconds each ring step (hop) in a node costs beside its bytes; with
    ``inter_node_latency_s``, an assumption of the order of NCCL's per-hop latency over NVLink
    and InfiniBand, not a measurement: what makes a ring over thousands of ranks slow even
    when its bytes are few."""
    inter_node_latency_s: float = 15e-6
    """The same between nodes."""
    intra_node_gbps_by_message: tuple[tuple[float, float], ...] = ()
    """Measured (bytes a rank sends in one ring step, GB/s) points of the intra-node link,
    ascending in size: when given, a collective in the node runs at the rate interpolated at
    its own step's message size (linear in log size, the end points held beyond) instead of
    ``intra_node_gbps``. For a link whose rate falls as messages grow: gloo on a CPU moves
    its messages by copies through memory, measured here at 1.2 GB/s for 1 MiB a rank and
    0.55 for 32 MiB (scripts/bench_planner_structure.py, docs/measurements.md); a GPU preset
    has no curve (an nccl-tests sweep would be one)."""
    collective_gbps: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    """Measured (bytes per ring step, GB/s a rank sends) curves per collective and link,
    keyed "all_gather/intra", "reduce_scatter/inter", ... (``ttl-plan --calibrate``,
    tools/planner/hardware.py): a collective with its own curve runs at it; without, at
    ``intra_node_gbps_by_message`` / the nominal rates."""
    gemm_tflops_by_dtype: tuple[tuple[str, float], ...] = ()
    """Measured TFLOP/s of the job's own weight matmuls (forward and both backward shapes,
    FLOPs-weighted), by compute dtype ("float32", "bfloat16", "float8"): when the compute
    dtype has one, the gemm term runs at it instead of ``peak_tflops x gemm_efficiency``."""
    host_op_s: float = 3.9e-6
    """Host seconds to issue one eager op (Python, autograd, dispatcher, launch): measured on
    a Sapphire Rapids core with torch 2.13 (docs/measurements.md, ``ttl-plan --calibrate``'s
    host figures; tools/host_dispatch.py); the GPU presets take it with the launch included
    (an assumption: a CUDA launch costs the host about what the CPU's tiny kernel does)."""
    host_dtensor_op_s: float = 1.9e-5
    """Host seconds one op of a tensor-parallel block adds going through DTensor (measured as
    ``host_op_s``, the block's TP plan on a one-rank mesh)."""
    host_compiled_share: float = 0.72
    """Share of the eager dispatch a compiled block still costs the host (measured as
    ``host_op_s``, the block compiled)."""
    host_fsdp_unit_s: float = 9.0e-4
    """Host seconds of FSDP's hooks per unit and microbatch, its calls of the (one-rank)
    collectives included (measured as ``host_op_s``, the block under fully_shard on a one-rank
    mesh)."""
    host_overlaps_device: bool = True
    """The device runs the ops the host queued (a GPU): host dispatch delays the step only
    by what exceeds the device's own time. False for a CPU process, which dispatches on the
    thread that computes."""
    attention_tflops_by_seq: tuple[tuple[float, float], ...] = ()
    """Measured (sequence length, TFLOP/s) of the attention kernels, forward and backward,
    FLOPs counted as step_time.py counts them, in the job's compute dtype: when given, the
    attention term runs at the rate interpolated at the job's sequence length (linear in log
    length) instead of ``peak_tflops x attention_efficiency``."""
    host_collective_s: float = 0.0
    """Main-thread seconds one synchronous TP collective costs a CPU process beside its
    transfer (DTensor's redistribution: its Python, gloo's input clone, the gathered shards'
    copy into place), measured by ``ttl-plan --calibrate`` (tools/sync_cost.py); 0: not
    measured (the presets, a GPU profile)."""
    sync_skew_s: float = 0.0
    """Seconds each synchronous TP collective waits for the slower rank beyond its transfer
    (the ranks' skew at it), measured likewise; 0: not measured."""


# Peaks: vendor datasheets (dense, no sparsity). gemm_efficiency: the "Maximum Achievable
# Matmul FLOPS" table of S. Bekman, ml-engineering (compute/accelerator/README.md): A100 SXM
# 267.9/312 = 85.9%, H100 SXM 792.1/989 = 80.1% (H200: same die, 794.5/989 = 80.3%), B200
# 1745/2250 = 77.6%, MI300X 781.9/1300 = 60.1%, all bf16, CUDA 12 / ROCm 6.2.
GPUS: dict[str, GPU] = {
    "A100": GPU("A100 SXM 80GB", 80.0, GPU_PEAK_TFLOPS["A100"], 300.0, 25.0,  # NVLink3, HDR
                gemm_efficiency=0.859, hbm_tbps=2.04),
    "H100": GPU("H100 SXM 80GB", 79.6, GPU_PEAK_TFLOPS["H100"], 450.0, 50.0,  # NVLink4, NDR
                gemm_efficiency=0.801, hbm_tbps=3.35, fp8_tflops=1979.0),
    # H800 SXM: the H100 SXM's die and clocks (same bf16/fp8 peaks and HBM) with NVLink cut to
    # 400 GB/s both ways (200 one way; NVIDIA H800 datasheet; DeepSeek-V3 report, section 3.1,
    # measures about 160 GB/s) and 400 Gb/s InfiniBand per GPU (50 GB/s); its matmul efficiency
    # is taken as the H100 SXM's (same die; no MAMF measurement of its own).
    "H800": GPU("H800 SXM 80GB", 79.6, GPU_PEAK_TFLOPS["H800"], 200.0, 50.0,
                gemm_efficiency=0.801, hbm_tbps=3.35, fp8_tflops=1979.0),
    "H200": GPU("H200 SXM 141GB", 140.4, GPU_PEAK_TFLOPS["H200"], 450.0, 50.0,
                gemm_efficiency=0.803, hbm_tbps=4.8, fp8_tflops=1979.0),
    "B200": GPU("B200 180GB", 179.1, GPU_PEAK_TFLOPS["B200"], 900.0, 50.0,  # NVLink5, NDR
                gemm_efficiency=0.776, hbm_tbps=8.0, fp8_tflops=4500.0),
    "MI300X": GPU("MI300X 192GB", 192.0, GPU_PEAK_TFLOPS["MI300X"], 448.0, 50.0,  # 7 xGMI
                  gemm_efficiency=0.601, hbm_tbps=5.3, fp8_tflops=2615.0),
}

CPU = GPU("CPU", memory_gib=1024.0, peak_tflops=1.0, intra_node_gbps=1.0, inter_node_gbps=1.0,
          fused_rms_norm=False, fused_attention_any_v_dim=False, attention_fp32=True,
          comm_overlaps_compute=False, host_overlaps_device=False)
"""This machine, for checking the memory model against measurement (scripts/
validate_plan_memory.py) and, with the rates measured in the same run, the step-time model's
structure (scripts/bench_planner_structure.py); its own rates are placeholders."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    gpu: GPU
    gpus_per_node: int = 8
    num_nodes: int = 1

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes


@dataclasses.dataclass(frozen=True)
class Precision:
    master_bytes: int = 4
    """Weights the optimizer updates, their gradients and its states (training.dtype)."""
    compute_bytes: int = 2
    """Gathered weights and activations (training.mixed_precision_param)."""
    reduce_bytes: int = 4
    """Gradient reduce-scatter / all-reduce (training.mixed_precision_reduce)."""
    state_bytes: int = 0
    """Bytes of one optimizer state element: 2 with bf16 moments (optimizer.state_dtype);
    0 = master_bytes (torch keeps Adam's states in the parameters' dtype)."""
    fused_optimizer: bool = False
    """The optimizer step is torch's fused kernel (one pass over parameters, gradients and
    states: tools/planner/overheads.py), not the foreach one."""
    step_temporary: bool = True
    """The optimizer step allocates one master-dtype temporary per parameter: torch's foreach
    Adam (``_foreach_sqrt`` of the second moments, optimizer.implementation "foreach", the
    default). False for the fused kernel (no temporary), the one-tensor-at-a-time loop and the
    chunked bf16-moments step (components/bf16_moments.py: bounded by a chunk)."""

    @property
    def optimizer_state_bytes(self) -> int:
        return self.state_bytes or self.master_bytes


@dataclasses.dataclass(frozen=True)
class Workload:
    seq_len: int
    global_batch: int
    """Sequences per optimizer step, over all data-parallel ranks."""
    tokens: float = 0.0
    """Training budget in tokens; 0 = no time or cost estimate."""
    precision: Precision = Precision()
    attn_mask_type: str = "causal"
    """[model] attn_mask_type: block_causal rules out context parallelism."""
    optimizer: StateFootprint = dataclasses.field(default_factory=StateFootprint)
    """What the optimizer keeps and does (its registry entry's; default Adam's):
    tools/planner/optimizer.py."""


@dataclasses.dataclass(frozen=True)
class Layout:
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    local_batch_size: int = 1
    """Sequences per microbatch on each data-parallel rank."""
    ac: str = "none"
    """none | op | full | N (every N-th block); see AC_MODES."""
    pp_schedule: str = "1F1B"
    """The torch.distributed.pipelining schedule (``modelled_schedule`` is how it is timed)."""
    pp_virtual_stages: int = 2
    """Model chunks per pipeline rank, for the multi-stage schedules."""
    pp_microbatches: int = 0
    """Microbatches per pipeline schedule step; a training step runs several such steps
    (gradient accumulation) when it has more. 0 = all of a step's in one schedule."""
    pp_embedding_weight: float = 1.0
    """The embedding's cost in blocks when layers are balanced over stages (as the trainer)."""
    pp_output_weight: float = 1.0
    """The final norm and head's cost in blocks when balancing stages (as the trainer)."""
    loss_parallel: bool = True
    """Under TP, the loss runs on vocab-sharded logits (parallelism.disable_loss_parallel)."""
    reshard_after_forward: bool | None = None
    """FSDP frees gathered weights after forward; None = the trainer's default."""
    cp_load_balancer: str = "headtail"
    """parallelism.context_parallel_load_balancer: headtail (equal causal work per rank,
    needs seq_len % 2cp) or none (the last rank does the most: tools/planner/ring.py)."""
    cp_rotate_method: str = "allgather"
    """parallelism.context_parallel_rotate_method: how ring attention moves K/V, one
    all-gather (allgather) or one chunk per step (alltoall); ring.py prices either."""
    cp_algorithm: str = "ring"
    """How CP attends: ring (torch's ring attention, this platform's: cp steps, one K/V
    chunk each, merged through the logsumexp) or gathered_kv (Llama 3's: the grouped-query K
    and V of the whole sequence all-gathered, each rank attending its query chunks in one
    kernel, the K/V gradients reduce-scattered; Llama 3 report, section 3.3.2): an input for
    pricing a published run (tools/planner/ring.py)."""
    compile: bool = False
    """The blocks are compiled (fused element-wise kernels)."""
    float8: bool = False
    """The blocks' linear layers run Float8 GEMMs (torchao; the output head stays bf16)."""
    async_tp: bool = False
    """TP's collectives overlap the matmuls (needs compile)."""
    ep: int = 1
    """Expert parallel degree: borrows dp_shard x cp x tp ranks (MoE models only)."""
    pp_reduce_before_send: bool = False
    """The pipeline runtime reduces a stage's FSDP gradients inside its last backward, before
    sending that backward's gradient to the previous stage: torch.distributed.pipelining
    before its REDUCE_GRAD action (pytorch/pytorch#166449, 2025-10), i.e. the runs of 2024.
    This platform's torch sends first (False); step_time.py prices the difference."""
    op_sac_every_other_matmul: bool = False
    """Op-level selective checkpointing saves every other matmul output and recomputes the
    rest (TorchTitan's policy, activations.alternate_matmul_share), not every one (this
    platform's, distributed/activation_checkpoint.py): an input for pricing a published run."""
    ep_overlapped: bool = False
    """The pipeline schedule hides the EP all-to-all behind another microbatch's compute, as
    DeepSeek's DualPipe does (each overlapped forward-backward pair dispatches and combines
    one microbatch's tokens while the other computes: DeepSeek-V3 report, section 3.2.1).
    This platform does not (torch's DualPipeV runs a pair's forward and backward one after the
    other unless an overlap function is registered; none is): an input for pricing a published
    run, never set by the search or a config. step_time.py prices the difference."""

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_degree(self) -> int:
        """Ranks a parameter is sharded over (CP ranks share FSDP's sharding)."""
        return self.dp_shard * self.cp

    @property
    def num_gpus(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def fsdp_enabled(self) -> bool:
        return self.dp * self.cp > 1

    @property
    def reshard(self) -> bool:
        """FSDP reshards after forward: the trainer's rule (distributed/fsdp.py)."""
        policy = {None: "default", True: "always", False: "never"}[self.reshard_after_forward]
        return reshard_after_forward(policy, self.pp > 1)

    @property
    def modelled_schedule(self) -> ModelledSchedule:
        """The timed and walked schedule closest to ``pp_schedule``: the multi-stage schedules
        (interleaved, looped, zero-bubble, DualPipeV) hold about what interleaved 1F1B holds;
        the other single-stage ones what 1F1B holds."""
        name = self.pp_schedule
        if name in ("1F1B", "GPipe", "Interleaved1F1B"):
            return name  # type: ignore[return-value]
        multi = ("Interleaved", "Looped", "ZBV", "DualPipe")
        return "Interleaved1F1B" if any(key in name for key in multi) else "1F1B"

    @property
    def stages_per_rank(self) -> int:
        """Pipeline stages (model chunks) on each PP rank: v for multi-stage schedules."""
        multi = self.pp > 1 and self.modelled_schedule == "Interleaved1F1B"
        return self.pp_virtual_stages if multi else 1

    def label(self) -> str:
        dp = f"dp {self.dp_replicate}x{self.dp_shard}" if self.dp_replicate > 1 else \
            f"dp {self.dp_shard}"
        parts = [f"tp {self.tp}", f"cp {self.cp}", f"pp {self.pp}", dp]
        parts += [f"ep {self.ep}"] if self.ep > 1 else []
        kernels = [name for name in ("compile", "float8", "async_tp") if getattr(self, name)]
        return (", ".join(parts) + f", mbs {self.local_batch_size}, ac {ac_label(self.ac)}"
                + "".join(f", {name}" for name in kernels))


def ac_label(ac: str) -> str:
    return f"every {ac}" if ac.isdigit() else ac


def check_ac(ac: str) -> str:
    if ac not in AC_MODES and not (ac.isdigit() and int(ac) >= 1):
        raise ValueError(f"activation checkpointing {ac!r}: use none, op, full or a number N "
                         "(every N-th block)")
    return ac


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the planner reads of a decoder-only transformer; built from a model's args."""

    n_layers: int
    dim: int
    n_heads: int
    head_dim: int
    kv_heads: int
    ffn_hidden_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    num_params: int
    args: BaseModelArgs
    moe_layers: int = 0
    """Blocks whose feed-forward is a mixture of experts (tools/planner/moe.py)."""
    num_experts: int = 0
    """Routed experts per MoE block."""
    top_k: int = 0
    """Routed experts each token runs."""
    expert_dim: int = 0
    """Hidden width of one routed expert's SwiGLU."""
    shared_experts: int = 0
    """Experts every token runs beside its routed ones."""
    active_params: int = 0
    """Parameters one token's computation multiplies (0: all of them, a dense model)."""
    qk_norm: bool = False
    """Queries and keys are RMS-normalised per head before RoPE (Qwen3)."""
    latent: LatentAttention | None = None
    """Multi-head latent attention's sizes (DeepSeek); None: plain heads
    (tools/planner/attention.py)."""

    @classmethod
    def from_args(cls, args: BaseModelArgs) -> ModelShape:
        needed = ("n_layers", "dim", "n_heads", "head_dim", "kv_heads", "ffn_hidden_dim",
                  "vocab_size")
        fields = attention_fields(args)
        missing = [n for n in needed if n not in fields and not hasattr(args, n)]
        if missing:
            raise ValueError(f"{type(args).__name__} lacks {', '.join(missing)}: the planner "
                             "needs a Llama-like decoder's shapes (see ModelShape)")
        shapes = {n: fields.get(n, int(getattr(args, n, 0))) for n in needed}
        return cls(**shapes, tie_word_embeddings=bool(getattr(args, "tie_word_embeddings", False)),
                   num_params=args.num_params(), args=args, **moe_fields(args),
                   qk_norm=bool(getattr(args, "qk_norm", False)), latent=latent_attention(args))

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.dim

    @property
    def head_params(self) -> int:
        """Final norm and output projection (none of its own when tied to the embedding)."""
        return self.dim + (0 if self.tie_word_embeddings else self.vocab_size * self.dim)

    @property
    def block_params(self) -> float:
        """Parameters of an average block (MoE models: experts averaged over all blocks)."""
        return (self.num_params - self.embedding_params - self.head_params) / self.n_layers

    @property
    def is_moe(self) -> bool:
        return self.moe_layers > 0

    @property
    def expert_block_params(self) -> float:
        """Routed-expert parameters of an average block (num_experts x 3 x dim x width per
        MoE block, spread over all blocks as ``block_params`` is)."""
        return self.moe_layers * self.num_experts * 3 * self.dim * self.expert_dim \
            / self.n_layers

    def gathered_block_params(self, tp: int, ep: int) -> float:
        """Parameters of a block FSDP gathers on one GPU: the dense ones split over TP, the
        routed experts over EP (moe.py)."""
        experts = self.expert_block_params
        return (self.block_params - experts) / tp + experts / ep

    @property
    def moe_share(self) -> float:
        """Share of the blocks that are MoE blocks."""
        return self.moe_layers / self.n_layers

    def flops_per_token(self, seq_len: int) -> int:
        if seq_len not in self._flops:
            self._flops[seq_len] = self.args.flops_per_token(seq_len)
        return self._flops[seq_len]

    @functools.cached_property
    def _flops(self) -> dict[int, int]:
        """``flops_per_token`` per sequence length, counted once (the step-time fit asks
        for it thousands of times)."""
        return {}

    def attention_flops_per_token(self, seq_len: int) -> int:
        """QK^T and AV, forward and backward, full (not causal-halved) scores: the part of
        ``flops_per_token`` that grows with the sequence (12 x layers x q_dim x seq_len for
        Llama), i.e. all but the 6 FLOPs per active weight."""
        return self.flops_per_token(seq_len) - self.flops_per_token(0)

    @property
    def params_6nd(self) -> int:
        """N of C = 6ND: every parameter of a dense model, the active ones of an MoE (its cost
        follows the weights a token multiplies: DeepSeek-V3's 6 x 37B x 14.8T)."""
        return self.active_params if self.is_moe else self.num_params

    @property
    def matmul_params(self) -> float:
        """Weights one token multiplies: the active ones (6 FLOPs each per token)."""
        return self.flops_per_token(0) / 6
