"""The parallelism planner: memory per GPU, communication, time and cost of a training layout.

Everything is arithmetic on the model's shapes; nothing is allocated. Per GPU and per step:

Memory (bytes). With P_s the parameters of pipeline stage s, split over tp and sharded by FSDP
over n = dp_shard x cp ranks (ZeRO-3), and Adam's two states:

    parameters  P_s/tp/n x master        (+ gathered compute copies: one unit with FSDP's
                                          reshard, every unit of the stage without it)
    gradients   P_s/tp/n x master        (+ the unsharded gradient of the unit in backward;
                                          under PP: P_s/tp x reduce, see Pipelines)
    optimizer   P_s/tp/n x 2 x master

master = 4 (fp32 weights and states, ``training.dtype``); compute = 2 (bf16,
``mixed_precision_param``); reduce = 4 (``mixed_precision_reduce``): 16 bytes per parameter
before sharding, the figure of ZeRO (Rajbhandari et al., 2020).

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (2022): count, per layer and token, the tensors autograd keeps for backward. Their
GPT-3 block keeps sbh(34 + 5as/h) bytes (16-bit), 34sbh when the attention core is recomputed
(selective) and 2sbh with full recomputation; ``korthikanti_layer_bytes`` is that formula. The
planner applies the same counting to the block the model really has (``layer_elements``):
Llama's RMSNorm / grouped-query attention / SwiGLU block keeps

    2 x [(1 + c) h/t + h]   each norm's input (+ its normalised tensor when RMSNorm is not one
                            fused kernel, c = 1 on CPU) and its output, the input of the next
                            matmuls, which sequence parallelism all-gathers to full length
    4 q/t                   q, k, v (k and v repeated to every query head) and the attention
                            output; a flash/memory-efficient kernel keeps no s x s scores, so
                            Korthikanti's 5as/h term is absent (it *is* their selective case)
    4 f/t                   SwiGLU's w1 and w3 outputs, silu(w1 x) and the product

elements per token (h = dim, q = heads x head_dim, f = FFN width, t = TP degree), times the
compute dtype's bytes, times the tokens of a microbatch on this rank (b x s / cp). Op-level
selective checkpointing keeps the block input, the matmul/attention outputs and collective
outputs; full checkpointing keeps the block input (and recomputes one block in backward);
every-N checkpoints every N-th block of each pipeline stage. The last stage keeps the final
norm's tensors and the fp32 log-probabilities (b s V/t x 4 bytes); the loss's backward adds two
logit-sized fp32 gradients, three under loss parallel (DTensor's fused nll/log-softmax backward
builds zeros, exp(x) and their product at once).

Pipelines (the trainer's torch.distributed.pipelining stages, as this module models them):
stages are the trainer's split (``balance_layers``: embedding and head weigh one block each by
default), rank r holding stage r (1F1B, GPipe) or stages r, r + pp, ... (interleaved). The
peak is found by walking the rank's schedule in torch's order (``schedule_order``): 1F1B keeps
at most pp - r microbatches in flight on rank r, GPipe all m, interleaved 1F1B (v - 1) k +
2 (pp - 1 - r) + 1 model chunks (k = microbatches per round, pp when m is a multiple of pp;
Narayanan et al., 2021). Three things torch's stages hold beside the activations: one receive
buffer per microbatch for the input (all but the first stage) and for the output gradient
(all but the last), allocated at the first step and kept (a stage's input *is* its buffer);
each stage output (the logits on the last stage) until that microbatch's backward; and, under
the multi-stage schedules, which wait for their sends only at the end of a schedule step,
every output and input gradient sent until then. Gradients exist from the first backward that
reaches a parameter (so rank 0 of 1F1B peaks with all its gradients and pp microbatches in
flight when m > pp); FSDP under PP skips the reduce-scatter until the last microbatch, so its
gradients accumulate unsharded in the reduce dtype (FSDP2's ``set_requires_gradient_sync``).
Not modelled: V-shaped placements (ZBVZeroBubble, DualPipeV: modelled as interleaved, which
places stages r and r + pp instead of r and 2pp - 1 - r) and the zero-bubble split backward;
an explicit ``pipeline_parallel_module_fqns_per_stage``; pipelined FSDP over several schedule
steps per optimizer step (modelled as one).

The peak is the largest of three kinds of moment: the loss's backward (every activation of the
microbatch kept, the head's tensors), the backward of a block (its recomputed activations and
gradients, the weight gradients so far), and the optimizer step (a temporary per parameter in
the foreach kernels).

Validation: scripts/validate_plan_memory.py measures every rank's peak with MemTracker for 20
layouts of the debug model on CPU (FSDP, HSDP, TP, CP, PP 1F1B/GPipe/interleaved, FSDP x TP,
PP x TP, PP x FSDP; AC modes; bf16), each pipeline rank apart: all within 3.1% (README). Not
measured: GPU allocator fragmentation (what ``headroom`` is for), float8, the V-shaped and
zero-bubble schedules (MemTracker cannot follow their ``autograd.grad`` backward).

Communication per step (bytes each GPU sends, ring algorithms: (n-1)/n of the data for an
all-gather or reduce-scatter, twice that for an all-reduce): FSDP all-gathers parameters (twice
with reshard) and reduce-scatters gradients; HSDP all-reduces the shard across replicas; TP with
sequence parallelism all-gathers and reduce-scatters sbh twice per layer forward and twice
backward (Korthikanti); CP passes K and V around the ring and their gradients back; PP sends a
microbatch's activations forward and its gradient back. A group whose ranks fit in one node (the
mesh is [pp, dp_replicate, dp_shard, cp, tp], TP innermost) uses the intra-node link.

Time: model FLOPs per token come from the model (``flops_per_token``: 6N plus attention);
compute time assumes ``kernel_efficiency`` of peak, recomputation adds its forward FLOPs, the
pipeline bubble idles (pp - 1)/(m + pp - 1) of the time (1F1B, GPipe; interleaved:
(pp - 1)/(v m + pp - 1)), TP and PP transfers are exposed, FSDP and CP transfers hide behind
compute up to its length. Cost: GPU-hours = tokens x flops_per_token / (peak x MFU).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import TYPE_CHECKING, Any, Literal

from torchtitan_like.components.metrics import GPU_PEAK_TFLOPS
from torchtitan_like.distributed.pipeline import balance_layers, stages_per_rank

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.models.registry import BaseModelArgs

GiB = 2**30
PPSchedule = Literal["1F1B", "GPipe", "Interleaved1F1B"]
AC_MODES = ("none", "op", "full")
"""Activation checkpointing as the planner names it: none, op (selective per op), full, or a
number N (selective: every N-th block)."""


# ---------------------------------------------------------------------------------- inputs


@dataclasses.dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    """Device memory as the driver reports it (nvidia-smi / rocm-smi total)."""
    peak_tflops: float
    """Dense bf16 TFLOP/s, no sparsity."""
    intra_node_gbps: float
    """GB/s one GPU sends to the GPUs of its node, one direction (NVLink, Infinity Fabric)."""
    inter_node_gbps: float
    """GB/s one GPU sends to other nodes, one direction (its own NIC, rail-optimised fabric)."""
    fused_rms_norm: bool = True
    """RMSNorm is one kernel keeping only its input (CUDA, ROCm); the composite CPU version
    also keeps the normalised tensor."""


GPUS: dict[str, GPU] = {
    "A100": GPU("A100 SXM 80GB", 80.0, GPU_PEAK_TFLOPS["A100"], 300.0, 25.0),  # NVLink3, HDR
    "H100": GPU("H100 SXM 80GB", 79.6, GPU_PEAK_TFLOPS["H100"], 450.0, 50.0),  # NVLink4, NDR
    "H200": GPU("H200 SXM 141GB", 140.4, GPU_PEAK_TFLOPS["H200"], 450.0, 50.0),
    "B200": GPU("B200 180GB", 179.1, GPU_PEAK_TFLOPS["B200"], 900.0, 50.0),  # NVLink5, NDR
    "MI300X": GPU("MI300X 192GB", 192.0, GPU_PEAK_TFLOPS["MI300X"], 448.0, 50.0),  # 7 xGMI
}

CPU = GPU("CPU", memory_gib=1024.0, peak_tflops=1.0, intra_node_gbps=1.0, inter_node_gbps=1.0,
          fused_rms_norm=False)
"""This machine, for checking the memory model against measurement (scripts/
validate_plan_memory.py); only its memory model means anything."""


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
    optimizer_states: int = 2
    """Tensors the optimizer keeps per parameter: Adam's exp_avg and exp_avg_sq."""


@dataclasses.dataclass(frozen=True)
class Workload:
    seq_len: int
    global_batch: int
    """Sequences per optimizer step, over all data-parallel ranks."""
    tokens: float = 0.0
    """Training budget in tokens; 0 = no time or cost estimate."""
    precision: Precision = Precision()


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
    pp_schedule: PPSchedule = "1F1B"
    pp_virtual_stages: int = 2
    """Model chunks per pipeline rank, for Interleaved1F1B."""
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
    """FSDP frees gathered weights after forward; None = yes unless pipelined (the trainer's
    default)."""

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
        return self.pp == 1 if self.reshard_after_forward is None else self.reshard_after_forward

    def label(self) -> str:
        dp = f"dp {self.dp_replicate}x{self.dp_shard}" if self.dp_replicate > 1 else \
            f"dp {self.dp_shard}"
        parts = [f"tp {self.tp}", f"cp {self.cp}", f"pp {self.pp}", dp]
        return ", ".join(parts) + f", mbs {self.local_batch_size}, ac {ac_label(self.ac)}"


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

    @classmethod
    def from_args(cls, args: BaseModelArgs) -> ModelShape:
        needed = ("n_layers", "dim", "n_heads", "head_dim", "kv_heads", "ffn_hidden_dim",
                  "vocab_size")
        missing = [name for name in needed if not hasattr(args, name)]
        if missing:
            raise ValueError(f"{type(args).__name__} lacks {', '.join(missing)}: the planner "
                             "needs a Llama-like decoder's shapes (see ModelShape)")
        return cls(**{name: int(getattr(args, name)) for name in needed},
                   tie_word_embeddings=bool(getattr(args, "tie_word_embeddings", False)),
                   num_params=args.num_params(), args=args)

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
        return (self.num_params - self.embedding_params - self.head_params) / self.n_layers

    def flops_per_token(self, seq_len: int) -> int:
        return self.args.flops_per_token(seq_len)


# ------------------------------------------------------------------------------ formulas


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, *, ac: str = "none", tp: int = 1,
                            sequence_parallel: bool = True, cp: int = 1) -> float:
    """Activation bytes of one GPT-3 layer in 16-bit (Korthikanti et al. 2022, Table 2):
    sbh(34 + 5as/h) without recomputation, 34sbh with selective recomputation of attention,
    2sbh with full recomputation; tensor parallelism divides everything with sequence
    parallelism (only the attention part without it: sbh(10 + 24/t + 5as/(ht)));
    context parallelism divides the sequence."""
    s_local = s / cp
    sbh = s_local * b * h
    if ac == "full":
        return 2 * sbh / (tp if sequence_parallel else 1)
    scores = 0.0 if ac == "selective" else 5 * a * s_local / h
    if sequence_parallel:
        return sbh * (34 + scores) / tp
    return sbh * (10 + (24 + scores) / tp)


def layer_elements(m: ModelShape, ac: str, tp: int, fused_norm: bool) -> float:
    """Activation elements one block keeps per token of its input (see the module docstring);
    under op-level checkpointing: the block input, every matmul, attention and collective
    output. The attention's logsumexp (n_heads fp32 per token) is added by the caller."""
    h, q, kv, f, t = m.dim, m.q_dim, m.kv_heads * m.head_dim, m.ffn_hidden_dim, tp
    if ac == "full" or ac.isdigit():  # the checkpointed block keeps its input
        return h / t
    if ac == "op":
        gathered = 2 * h if t > 1 else 0  # all-gather outputs (SP) are saved collectives
        partial_sums = 2 * h if t > 1 else 0  # wo/w2 outputs before their reduce-scatter
        reduced = 2 * h / t  # wo/w2 outputs after it (plain matmul outputs without TP)
        return h / t + gathered + (q + 2 * kv) / t + q / t + partial_sums + reduced + 2 * f / t
    norm = (1 if fused_norm else 2) * h / t + h
    return 2 * norm + 4 * q / t + 4 * f / t


def bubble_fraction(pp: int, microbatches: int, schedule: PPSchedule = "1F1B",
                    virtual_stages: int = 2) -> float:
    """Idle share of a pipelined step: (pp - 1)/(m + pp - 1); interleaved with v chunks per
    rank, (pp - 1)/(v m + pp - 1)."""
    if pp == 1:
        return 0.0
    m = microbatches * (virtual_stages if schedule == "Interleaved1F1B" else 1)
    return (pp - 1) / (m + pp - 1)


def pp_stages_per_rank(layout: Layout) -> int:
    """Pipeline stages (model chunks) on each PP rank: v for Interleaved1F1B, else 1."""
    return layout.pp_virtual_stages if layout.pp > 1 and layout.pp_schedule == "Interleaved1F1B" \
        else 1


def stage_split(n_layers: int, layout: Layout) -> list[int]:
    """Blocks of each of the pp x v pipeline stages, as the trainer cuts them
    (distributed/pipeline.py: ``balance_layers``, the embedding and the head weighing
    ``pp_embedding_weight`` and ``pp_output_weight`` blocks)."""
    stages = layout.pp * pp_stages_per_rank(layout)
    if stages > n_layers:
        raise LayoutError(f"pp {layout.pp} x {stages // layout.pp} stages per rank exceeds the "
                          f"{n_layers} layers")
    return list(_balanced(n_layers, stages, layout.pp_embedding_weight,
                          layout.pp_output_weight))


@functools.lru_cache(maxsize=1024)
def _balanced(n_layers: int, stages: int, first: float, last: float) -> tuple[int, ...]:
    return tuple(balance_layers(n_layers, stages, first, last)) if stages > 1 else (n_layers,)


def rank_layers(m: ModelShape, layout: Layout, rank: int) -> int:
    """Blocks PP rank ``rank`` holds, over its stages."""
    split = stage_split(m.n_layers, layout)
    return sum(split[i] for i in rank_stages(layout, rank))


def rank_stages(layout: Layout, rank: int) -> list[int]:
    """The stages PP rank ``rank`` holds, looped as torch places them: r, r + pp, ..."""
    return [rank + i * layout.pp for i in range(pp_stages_per_rank(layout))]


def schedule_order(layout: Layout, rank: int, microbatches: int) -> list[tuple[str, int]]:
    """The forwards ("F") and full backwards ("B") PP rank ``rank`` runs in one step, in
    order, each with the index of the local stage it runs (0 .. v-1), as
    torch.distributed.pipelining's schedules order them (Narayanan et al., 2021):

    - without PP, gradient accumulation: F B, m times;
    - GPipe: m forwards, then m backwards;
    - 1F1B: w = min(m, pp - r) warm-up forwards, then B F pairs, then the last w backwards,
      so rank r holds at most pp - r microbatches;
    - Interleaved1F1B with v stages per rank: microbatches go in rounds of
      k = m / max(1, m // pp); forward i runs local stage (i // k) mod v, backward j local stage
      v - 1 - (j // k) mod v; w = min((v - 1) k + 2 (pp - 1 - r), m v) warm-up forwards, then
      F B pairs, then the last w backwards.
    """
    m, pp = microbatches, layout.pp
    if pp == 1:
        return [("F", 0), ("B", 0)] * m
    if layout.pp_schedule == "GPipe":
        return [("F", 0)] * m + [("B", 0)] * m
    if pp_stages_per_rank(layout) == 1:  # 1F1B
        warmup = min(m, pp - rank)
        return [("F", 0)] * warmup + [("B", 0), ("F", 0)] * (m - warmup) + [("B", 0)] * warmup
    v = pp_stages_per_rank(layout)
    per_round = m // max(1, m // pp)
    total = m * v
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), total)
    order = [("F", (i // per_round) % v) for i in range(warmup)]
    for i in range(warmup, total):
        order += [("F", (i // per_round) % v), ("B", v - 1 - ((i - warmup) // per_round) % v)]
    return order + [("B", v - 1 - (j // per_round) % v) for j in range(total - warmup, total)]


def in_flight_peak(layout: Layout, rank: int, microbatches: int) -> list[int]:
    """Per local stage, the microbatches it holds when this rank holds the most in all."""
    counts = [0] * pp_stages_per_rank(layout)
    best = list(counts)
    for kind, chunk in schedule_order(layout, rank, microbatches):
        counts[chunk] += 1 if kind == "F" else -1
        if sum(counts) > sum(best):
            best = list(counts)
    return best


def ring_volume(n: int, nbytes: float) -> float:
    """Bytes each rank sends in a ring all-gather or reduce-scatter of ``nbytes`` in total."""
    return (n - 1) / n * nbytes


# ------------------------------------------------------------------------------- results


@dataclasses.dataclass
class Memory:
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    moment: str
    """When the peak happens."""
    stage: int = 0

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.activations


@dataclasses.dataclass
class Comm:
    dim: str
    group: int
    link: str
    bandwidth_gbps: float
    bytes_per_step: float
    exposed: bool
    """Whether the transfer sits on the critical path (else it overlaps compute)."""

    @property
    def seconds(self) -> float:
        return self.bytes_per_step / (self.bandwidth_gbps * 1e9)


@dataclasses.dataclass
class Plan:
    layout: Layout
    memory: Memory
    """The peak of the fullest pipeline rank."""
    stage_totals: list[float]
    """Peak bytes of each pipeline rank (one entry without PP)."""
    capacity_gib: float
    usable_gib: float
    comms: list[Comm]
    microbatches: int
    bubble: float
    flops_per_token: int
    tokens_per_step: int
    compute_seconds: float
    step_seconds: float
    mfu_estimate: float
    mfu: float
    """The MFU time and cost use: the given one, else the estimate."""
    gpu_hours: float
    gpu_hours_6nd: float
    days: float
    notes: list[str]

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.usable_gib * GiB

    def to_dict(self) -> dict[str, Any]:
        m = self.memory
        return {
            "layout": dataclasses.asdict(self.layout),
            "memory_gib": {"parameters": m.parameters / GiB, "gradients": m.gradients / GiB,
                           "optimizer": m.optimizer / GiB, "activations": m.activations / GiB,
                           "total": m.total / GiB, "peak_moment": m.moment, "stage": m.stage,
                           "per_pipeline_rank": [total / GiB for total in self.stage_totals]},
            "capacity_gib": self.capacity_gib,
            "usable_gib": self.usable_gib,
            "fits": self.fits,
            "communication": [{**dataclasses.asdict(c), "seconds": c.seconds}
                              for c in self.comms],
            "microbatches": self.microbatches,
            "bubble_fraction": self.bubble,
            "flops_per_token": self.flops_per_token,
            "tokens_per_step": self.tokens_per_step,
            "compute_seconds_per_step": self.compute_seconds,
            "step_seconds": self.step_seconds,
            "mfu_estimate": self.mfu_estimate,
            "mfu": self.mfu,
            "gpu_hours": self.gpu_hours,
            "gpu_hours_6nd": self.gpu_hours_6nd,
            "days": self.days,
            "notes": self.notes,
        }


class LayoutError(ValueError):
    """A layout that cannot run this model/cluster/batch; the message says why."""


# -------------------------------------------------------------------------------- planning


def validate_layout(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout) -> int:
    """Raise LayoutError if the layout cannot run; return the microbatches per step per rank."""
    check_ac(layout.ac)
    if layout.num_gpus != cluster.num_gpus:
        raise LayoutError(f"{layout.label()} uses {layout.num_gpus} GPUs, the cluster has "
                          f"{cluster.num_gpus}")
    if layout.tp > cluster.gpus_per_node:
        raise LayoutError(f"tp {layout.tp} spans more than a node ({cluster.gpus_per_node} GPUs)")
    for name, size in (("n_heads", m.n_heads), ("kv_heads", m.kv_heads),
                       ("ffn_hidden_dim", m.ffn_hidden_dim)):
        if size % layout.tp:
            raise LayoutError(f"tp {layout.tp} does not divide {name} {size}")
    if work.seq_len % (2 * layout.cp) and layout.cp > 1:
        raise LayoutError(f"cp {layout.cp}: seq_len {work.seq_len} must be a multiple of "
                          f"2 x cp (load-balanced chunks)")
    stage_split(m.n_layers, layout)  # raises when the stages outnumber the layers
    per_microbatch = layout.dp * layout.local_batch_size
    if work.global_batch % per_microbatch:
        raise LayoutError(f"global batch {work.global_batch} is not a multiple of dp x "
                          f"local_batch_size = {per_microbatch}")
    microbatches = work.global_batch // per_microbatch
    if layout.pp > 1 and microbatches < layout.pp:
        raise LayoutError(f"pp {layout.pp} needs at least {layout.pp} microbatches per step, "
                          f"the batch gives {microbatches}")
    rounds = max(1, microbatches // layout.pp)
    if pp_stages_per_rank(layout) > 1 and microbatches % rounds:
        raise LayoutError(f"Interleaved1F1B runs {microbatches} microbatches in {rounds} equal "
                          f"rounds (m // pp): use a multiple of pp {layout.pp}")
    return microbatches


def _checkpointed(ac: str, layers: int) -> list[bool]:
    if ac == "full":
        return [True] * layers
    if ac.isdigit():
        return [i % int(ac) == 0 for i in range(layers)]
    return [False] * layers


def stage_memory(m: ModelShape, gpu: GPU, work: Workload, layout: Layout, stage: int,
                 microbatches: int) -> Memory:
    """Peak bytes on one GPU of pipeline rank ``stage`` (see the module docstring): the
    largest moment of its schedule (``schedule_order``), walked forward by forward and
    backward by backward."""
    prec, t, cb = work.precision, layout.tp, work.precision.compute_bytes
    split = stage_split(m.n_layers, layout)
    chunks = [(split[i], i == 0, i == len(split) - 1) for i in rank_stages(layout, stage)]
    has_last = any(last for _, _, last in chunks)
    # Parameters of this GPU's share of its stages, before FSDP sharding.
    unit = m.block_params / t

    def params(layers: int, first: bool, last: bool) -> float:
        return (layers * m.block_params + (m.embedding_params if first else 0)
                + (m.head_params if last else 0)) / t

    local = sum(params(*chunk) for chunk in chunks)
    n = layout.fsdp_degree
    master = local / n * prec.master_bytes
    optimizer = master * prec.optimizer_states

    # Weights in compute dtype beside the master copy, and unsharded gradients. Gradients
    # accumulate per parameter from the first backward that reaches it: sharded, in the master
    # dtype; but pipelined FSDP skips the reduce-scatter until the last microbatch, so there
    # they accumulate unsharded, in the reduce dtype.
    grad_bytes = prec.master_bytes / n
    gathered_always = gathered_loss = gathered_layer = unit_grads = 0.0
    if layout.fsdp_enabled:
        if layout.reshard:  # only the unit that runs is gathered
            gathered_layer = unit * cb
            gathered_loss = (m.head_params / t if has_last else unit) * cb
        else:
            gathered_always = local * cb
        # In backward a unit's gradients exist unsharded and again as the reduce-scatter
        # input (except under PP, see above).
        if layout.pp > 1:
            grad_bytes = prec.reduce_bytes
        else:
            unit_grads = unit * (cb + prec.reduce_bytes)
    elif cb != prec.master_bytes:  # autocast keeps compute-dtype weight casts
        gathered_always = local * cb

    # Activations of one microbatch on this rank, per block and at the edges of a stage.
    tokens = layout.local_batch_size * work.seq_len / layout.cp
    lse = 4 * m.n_heads / t  # the attention's fp32 logsumexp per token
    full_layer = (layer_elements(m, "none", t, gpu.fused_rms_norm) * cb + lse) * tokens
    kept_ckpt = layer_elements(m, layout.ac, t, gpu.fused_rms_norm) * cb * tokens
    kept_op = (layer_elements(m, "op", t, gpu.fused_rms_norm) * cb + lse) * tokens
    working = (2 * m.dim + m.ffn_hidden_dim) / t * cb * tokens  # gradients alive in a block
    pipelined = layout.pp > 1
    vocab = m.vocab_size / t
    norm = ((1 if gpu.fused_rms_norm else 2) * m.dim / t + m.dim) * cb
    # The last stage keeps the final norm's tensors and the fp32 log-probabilities; a stage
    # also keeps its output (logits, or the hidden states it sends on) until that
    # microbatch's backward (PipelineStage's forward cache). The loss's backward adds two
    # logit-sized fp32 gradients, three under loss parallel (DTensor's fused nll/log-softmax
    # backward builds zeros, exp(x) and their product).
    head_kept = (norm + 4 * vocab + (cb * vocab if pipelined else 0)) * tokens
    loss_grads = (12 if t > 1 and layout.loss_parallel else 8) * vocab * tokens
    # Pipeline edges: the hidden states a stage sends (its output) or receives (its input),
    # and their gradients. torch keeps one receive buffer per microbatch for each (allocated
    # at the first step, kept); a stage's input *is* its receive buffer, so in-flight
    # microbatches do not count it again. The multi-stage schedules wait for their sends only
    # at the end of the step, so every output and input gradient sent stays alive until
    # then; 1F1B and GPipe keep an output only until its backward (the forward cache).
    edge = m.dim / t * cb * tokens if pipelined else 0.0
    multi = len(chunks) > 1
    per_schedule = layout.pp_microbatches or microbatches
    buffers = sum((0 if first else edge) + (0 if last else edge)
                  for _, first, last in chunks) * per_schedule

    block_grads = m.block_params / t * grad_bytes
    stored, kept, grads = [], [], []
    for layers, first, last in chunks:
        ckpt = _checkpointed(layout.ac, layers)
        stored.append([kept_ckpt if c else (kept_op if layout.ac == "op" else full_layer)
                       for c in ckpt])
        output = head_kept if last else (0.0 if multi else edge)
        kept.append(sum(stored[-1]) + output - (0.0 if first else edge))
        grads.append(params(layers, first, last) * grad_bytes)

    moments: list[Memory] = []

    def backward(c: int, others: float, other_grads: float, accumulated: bool) -> None:
        """The moments of one backward of local stage ``c`` while ``others`` bytes of other
        microbatches' activations and ``other_grads`` of other stages' gradients exist."""
        layers, first, last = chunks[c]
        done = grads[c] if accumulated else 0.0
        others -= 0.0 if first else edge  # stored[c] has the stage input: a receive buffer
        if last:  # the loss's backward: every activation of the microbatch is alive
            moments.append(Memory(
                parameters=master + gathered_always + gathered_loss,
                gradients=other_grads + done,
                optimizer=optimizer,
                activations=others + sum(stored[c]) + head_kept + loss_grads,
                moment="backward of the loss",
                stage=stage,
            ))
        # The backward of block k: earlier blocks' activations, block k's (recomputed if
        # checkpointed, and under op-level SAC for its element-wise ops), the gradients of
        # the blocks from k on (and of the head).
        ckpt = _checkpointed(layout.ac, layers)
        head = m.head_params / t * grad_bytes if last else 0.0
        for k in range(layers):
            recomputes = ckpt[k] or layout.ac == "op"
            act = others + sum(stored[c][:k]) + (full_layer if recomputes else stored[c][k]) \
                + working
            partial = (layers - k) * block_grads + head
            moments.append(Memory(
                parameters=master + gathered_always + gathered_layer,
                gradients=other_grads + max(done, partial) + unit_grads,
                optimizer=optimizer,
                activations=act,
                moment=f"backward of layer {k} of the stage" if len(chunks) == 1 else
                f"backward of layer {k} of stage {rank_stages(layout, stage)[c]}",
                stage=stage,
            ))

    # Walk the schedule (once per schedule step when a training step runs several).
    in_flight = [0] * len(chunks)
    has_grads = [False] * len(chunks)
    for _ in range(microbatches // per_schedule):
        sent = 0.0  # the multi-stage schedules wait for their sends at the end of a step
        for kind, c in schedule_order(layout, stage, per_schedule):
            _, first, last = chunks[c]
            if kind == "F":
                in_flight[c] += 1
                sent += edge if multi and not last else 0.0
                continue
            others = sum(count * kept[i] for i, count in enumerate(in_flight)) - kept[c]
            other_grads = sum(g for i, g in enumerate(grads) if has_grads[i] and i != c)
            backward(c, buffers + sent + others, other_grads, has_grads[c])
            in_flight[c] -= 1
            has_grads[c] = True
            sent += edge if multi and not first else 0.0
    # The optimizer step (sharded gradients, as many bytes as the master weights): foreach
    # kernels make one temporary per parameter; the pipeline's receive buffers stay.
    moments.append(Memory(
        parameters=master,
        gradients=master,
        optimizer=optimizer + master,
        activations=buffers,
        moment="optimizer step",
        stage=stage,
    ))
    return max(moments, key=lambda mem: mem.total)


def _link(cluster: Cluster, span: int) -> tuple[str, float]:
    if span <= cluster.gpus_per_node:
        return "intra-node", cluster.gpu.intra_node_gbps
    return "inter-node", cluster.gpu.inter_node_gbps


def communication(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout,
                  microbatches: int) -> list[Comm]:
    """Bytes each GPU sends per step, per parallel dimension, and the link it uses."""
    prec, t, cp, pp = work.precision, layout.tp, layout.cp, layout.pp
    layers = rank_layers(m, layout, 0)
    local = (layers * m.block_params + m.embedding_params) / t
    tokens = layout.local_batch_size * work.seq_len  # per microbatch, before CP
    sbh = tokens * m.dim * prec.compute_bytes
    recomputed = sum(_checkpointed(layout.ac, layers))
    comms: list[Comm] = []

    def add(dim: str, group: int, span: int, nbytes: float, exposed: bool) -> None:
        if group > 1:
            link, bandwidth = _link(cluster, span)
            comms.append(Comm(dim, group, link, bandwidth, nbytes, exposed))

    # Innermost first: [pp, dp_replicate, dp_shard, cp, tp].
    add("tp", t, t, microbatches * (8 * layers + 4 * recomputed) * ring_volume(t, sbh / cp),
        exposed=True)
    kv = tokens / cp * m.q_dim / t * prec.compute_bytes  # K or V chunk (repeated heads)
    add("cp", cp, t * cp,
        microbatches * (6 * layers + 2 * recomputed) * (cp - 1) * kv, exposed=False)
    n = layout.fsdp_degree
    syncs = 1 if pp > 1 else microbatches  # pipelined FSDP reduces once per step
    gathers = 1 if pp > 1 else microbatches * (2 if layout.reshard else 1)
    fsdp = ring_volume(n, local * (gathers * prec.compute_bytes + syncs * prec.reduce_bytes))
    add("fsdp", n, t * n, fsdp, exposed=False)
    r = layout.dp_replicate
    add("dp_replicate", r, t * n * r,
        syncs * 2 * ring_volume(r, local / n * prec.reduce_bytes), exposed=False)
    chunks = layout.pp_virtual_stages if layout.pp_schedule == "Interleaved1F1B" else 1
    add("pp", pp, cluster.num_gpus, microbatches * chunks * 2 * sbh / (t * cp), exposed=True)
    return comms


def plan(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout, *,
         mfu: float | None = None, kernel_efficiency: float = 0.55,
         headroom: float = 0.10) -> Plan:
    """Memory, communication, time and cost of ``layout``; LayoutError if it cannot run."""
    microbatches = validate_layout(m, cluster, work, layout)
    gpu = cluster.gpu
    stages = [stage_memory(m, gpu, work, layout, s, microbatches) for s in range(layout.pp)]
    memory = max(stages, key=lambda mem: mem.total)
    comms = communication(m, cluster, work, layout, microbatches)

    fpt = m.flops_per_token(work.seq_len)
    tokens_per_step = work.global_batch * work.seq_len
    replica_tokens = tokens_per_step / layout.dp
    model_flops = replica_tokens * fpt / (layout.tp * layout.cp * layout.pp)
    recomputed = sum(_checkpointed(layout.ac, m.n_layers)) / m.n_layers
    block_share = 1 - 6 * m.head_params / fpt
    recompute_flops = model_flops * recomputed * block_share / 3  # one more block forward
    peak = gpu.peak_tflops * 1e12
    compute = (model_flops + recompute_flops) / (peak * kernel_efficiency)
    bubble = bubble_fraction(layout.pp, microbatches, layout.pp_schedule,
                             layout.pp_virtual_stages)
    busy = compute / (1 - bubble)
    attention_share = 12 * m.n_layers * m.q_dim * work.seq_len / fpt
    exposed = 0.0
    hidden_fsdp = sum(c.seconds for c in comms if c.dim in ("fsdp", "dp_replicate"))
    for c in comms:
        if c.exposed:
            exposed += c.seconds
        elif c.dim == "cp":
            exposed += max(0.0, c.seconds - compute * attention_share)
    exposed += max(0.0, hidden_fsdp - compute)
    step = busy + exposed
    mfu_estimate = model_flops / (step * peak)
    used = mfu if mfu is not None else mfu_estimate

    gpu_seconds = work.tokens * fpt / (peak * used)
    gpu_hours = gpu_seconds / 3600
    notes = []
    if layout.pp > 1:
        held = in_flight_peak(layout, 0, layout.pp_microbatches or microbatches)
        notes.append(f"pipeline rank 0 holds up to {sum(held)} microbatch(es) in flight"
                     + (f" over its {len(held)} stages" if len(held) > 1 else ""))
        if layout.fsdp_enabled:
            notes.append("under PP, FSDP accumulates unsharded gradients in the reduce dtype "
                         "until the last microbatch")
    return Plan(
        layout=layout,
        memory=memory,
        stage_totals=[mem.total for mem in stages],
        capacity_gib=gpu.memory_gib,
        usable_gib=gpu.memory_gib * (1 - headroom),
        comms=comms,
        microbatches=microbatches,
        bubble=bubble,
        flops_per_token=fpt,
        tokens_per_step=tokens_per_step,
        compute_seconds=compute,
        step_seconds=step,
        mfu_estimate=mfu_estimate,
        mfu=used,
        gpu_hours=gpu_hours,
        gpu_hours_6nd=6 * m.num_params * work.tokens / (peak * used) / 3600,
        days=gpu_hours / cluster.num_gpus / 24,
        notes=notes,
    )


def ac_candidates(m: ModelShape, layers_per_stage: int) -> list[str]:
    """Checkpointing choices from the least recomputation to the most."""
    every = [str(n) for n in (8, 4, 3, 2) if n < layers_per_stage]
    return ["none", "op", *every, "full"]


def plan_fitting(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout,
                 **kwargs: Any) -> Plan:
    """``layout`` with ``ac = "auto"`` resolved to the least recomputation that fits (the last
    choice, full, when nothing fits)."""
    if layout.ac != "auto":
        return plan(m, cluster, work, layout, **kwargs)
    layers = max(stage_split(m.n_layers, layout))
    result = None
    for ac in ac_candidates(m, layers):
        result = plan(m, cluster, work, dataclasses.replace(layout, ac=ac), **kwargs)
        if result.fits:
            break
    assert result is not None
    return result


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(limit)) + 1)] if limit >= 1 else [1]


def search(m: ModelShape, cluster: Cluster, work: Workload, *, local_batch_size: int = 1,
           pp_schedule: PPSchedule = "1F1B", top: int = 5, **kwargs: Any) -> list[Plan]:
    """The ``top`` fitting layouts by estimated MFU: TP within a node, CP and PP powers of
    two, FSDP over the rest of the ranks or HSDP with one shard group per node; each with
    the least activation checkpointing that fits."""
    n = cluster.num_gpus
    plans: list[Plan] = []
    for tp, cp, pp in itertools.product(_powers_of_two(cluster.gpus_per_node),
                                        _powers_of_two(16), _powers_of_two(min(n, 64))):
        if n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        shards = {dp}
        per_node = cluster.gpus_per_node // (tp * cp)
        if 1 < per_node < dp and dp % per_node == 0:
            shards.add(per_node)
        for dp_shard in sorted(shards):
            layout = Layout(dp_replicate=dp // dp_shard, dp_shard=dp_shard, cp=cp, tp=tp,
                            pp=pp, local_batch_size=local_batch_size, ac="auto",
                            pp_schedule=pp_schedule)
            try:
                result = plan_fitting(m, cluster, work, layout, **kwargs)
            except LayoutError:
                continue
            if result.fits:
                plans.append(result)
    plans.sort(key=lambda p: (-p.mfu_estimate, p.memory.total))
    return plans[:top]


# ------------------------------------------------------------------------ from a job config

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def planned_schedule(name: str) -> PPSchedule:
    """The modelled schedule closest to a torch.distributed.pipelining one: the multi-stage
    schedules (interleaved, looped, zero-bubble V, DualPipeV) hold about what interleaved 1F1B
    holds; the rest what 1F1B holds."""
    if name in ("1F1B", "GPipe", "Interleaved1F1B"):
        return name  # type: ignore[return-value]
    multi = ("Interleaved", "Looped", "ZBV", "DualPipe")
    return "Interleaved1F1B" if any(key in name for key in multi) else "1F1B"


def ac_of(config: JobConfig) -> str:
    """The planner's name for ``[activation_checkpoint]``: none, full, op or N."""
    ac = config.activation_checkpoint
    return ac.selective_ac_option if ac.mode == "selective" else ac.mode


def predict_peak(config: JobConfig, num_gpus: int, gpu: GPU) -> Memory:
    """The planner's peak memory per rank for a job config (all ranks on one node): that of
    the fullest pipeline rank."""
    return max(predict_stage_peaks(config, num_gpus, gpu), key=lambda mem: mem.total)


def predict_stage_peaks(config: JobConfig, num_gpus: int, gpu: GPU) -> list[Memory]:
    """The planner's peak memory of each pipeline rank for a job config (one entry without
    PP); global rank r is on pipeline rank r // (num_gpus / pp)."""
    model, work, layout = from_job_config(config, num_gpus)
    microbatches = validate_layout(model, Cluster(gpu, gpus_per_node=num_gpus), work, layout)
    return [stage_memory(model, gpu, work, layout, s, microbatches) for s in range(layout.pp)]


def from_job_config(config: JobConfig, num_gpus: int) -> tuple[ModelShape, Workload, Layout]:
    """Model, workload and layout of a job config run on ``num_gpus`` GPUs."""
    from torchtitan_like.models.registry import model_spec_and_args
    from torchtitan_like.validate import parallel_dims_of

    _, args = model_spec_and_args(config)
    t, p = config.training, config.parallelism
    dims = parallel_dims_of(config, num_gpus)
    precision = Precision(master_bytes=_DTYPE_BYTES[t.dtype],
                          compute_bytes=_DTYPE_BYTES[t.mixed_precision_param],
                          reduce_bytes=_DTYPE_BYTES[t.mixed_precision_reduce])
    pipelined = dims.pp > 1
    microbatch = p.pipeline_parallel_microbatch_size if pipelined else t.local_batch_size
    global_batch = t.global_batch_size if t.global_batch_size != -1 else \
        t.local_batch_size * dims.dp
    reshard = {"default": None, "always": True, "never": False}[p.fsdp_reshard_after_forward]
    layout = Layout(dp_replicate=dims.dp_replicate, dp_shard=dims.dp_shard, cp=dims.cp,
                    tp=dims.tp, pp=dims.pp, local_batch_size=microbatch, ac=ac_of(config),
                    pp_schedule=planned_schedule(p.pipeline_parallel_schedule),
                    pp_virtual_stages=max(2, stages_per_rank(p)),
                    pp_microbatches=t.local_batch_size // microbatch if pipelined else 0,
                    pp_embedding_weight=p.pipeline_parallel_embedding_weight,
                    pp_output_weight=p.pipeline_parallel_output_weight,
                    loss_parallel=not p.disable_loss_parallel,
                    reshard_after_forward=reshard)
    workload = Workload(seq_len=t.seq_len, global_batch=global_batch, precision=precision)
    return ModelShape.from_args(args), workload, layout
