"""Peak memory per GPU of one pipeline rank: weights, gradients, optimizer states and the
activations its schedule keeps alive, walked forward by forward and backward by backward.

With P_s the parameters of pipeline stage s, split over tp and sharded by FSDP over
n = dp_shard x cp ranks (ZeRO-3), and Adam's two states:

    parameters  P_s/tp/n x master        (+ gathered compute copies: one unit with FSDP's
                                          reshard, every unit of the stage without it)
    gradients   P_s/tp/n x master        (+ the unsharded gradient of the unit in backward;
                                          under PP: P_s/tp x reduce, see below)
    optimizer   P_s/tp/n x 2 x state     (state = master; 2 with bf16 moments; another
                                          optimizer's states: tools/planner/optimizer.py)

master = 4 (fp32 weights and states, ``training.dtype``); compute = 2 (bf16,
``mixed_precision_param``); reduce = 4 (``mixed_precision_reduce``): 16 bytes per parameter
before sharding, the figure of ZeRO (Rajbhandari et al., 2020). Activations per block:
activations.py. The last stage keeps the final norm's tensors and the fp32 log-probabilities
(b s V/t x 4 bytes); the loss's backward adds two logit-sized fp32 gradients, three under loss
parallel (DTensor's fused nll/log-softmax backward builds zeros, exp(x) and their product).

Three things torch's pipeline stages hold beside the activations: one receive buffer per
microbatch for the input (all but the first stage) and for the output gradient (all but the
last), allocated at the first step and kept (a stage's input *is* its buffer); each stage
output (the logits on the last stage) until that microbatch's backward; and, under the
multi-stage schedules, which wait for their sends only at the end of a schedule step, every
output and input gradient sent until then. Gradients exist from the first backward that
reaches a parameter (so rank 0 of 1F1B peaks with all its gradients and pp microbatches in
flight when m > pp); FSDP under PP skips the reduce-scatter until the last microbatch, so its
gradients accumulate unsharded in the reduce dtype (FSDP2's ``set_requires_gradient_sync``).

The peak is the largest of three kinds of moment: the loss's backward (every activation of the
microbatch kept, the head's tensors), the backward of a block (its recomputed activations and
gradients, the weight gradients so far; under CP, ring attention's working set when it is the
larger: every K/V chunk with the all-gather rotation, fp32 accumulators of the q/k/v
gradients, the K/V gradients in flight, ring.py), and the optimizer step (a temporary per
parameter in the foreach kernels, none with the fused one or the chunked bf16-moments step).

Each tensor is counted in the dtype the trainer holds it in: mixed_precision.py (autocast
without FSDP: fp32 residual stream, a cast per matmul input, the weights' casts until their
backward, none held for a checkpointed block; the composite RMSNorm's and the CPU attention's
fp32 tensors).

Validation: scripts/validate_plan_memory.py measures every rank's peak with MemTracker for 29
layouts of the debug model on CPU (FSDP, HSDP, TP, CP, PP 1F1B/GPipe/interleaved, FSDP x TP,
PP x TP, PP x FSDP; AC modes; bf16 under autocast and under FSDP; bf16 moments), each pipeline
rank apart: all within 3.1%. Not measured: GPU allocator fragmentation (what ``headroom`` is
for), FSDP's float8 all-gather (torchao's Float8Linear otherwise keeps what a linear keeps:
measured equal on CPU), the V-shaped and zero-bubble
schedules (MemTracker cannot follow their ``autograd.grad`` backward); an explicit
``pipeline_parallel_module_fqns_per_stage``; pipelined FSDP over several schedule steps per
optimizer step (modelled as one).
"""

from __future__ import annotations

import dataclasses

from torchtitan_like.tools.planner.activations import layer_elements
from torchtitan_like.tools.planner.attention import kernel_bytes, math_attention, output_elements
from torchtitan_like.tools.planner.inputs import GPU, Layout, ModelShape, Workload
from torchtitan_like.tools.planner.mixed_precision import (
    autocast,
    block_input_extra_bytes,
    layer_extra_bytes,
    norm_bytes,
)
from torchtitan_like.tools.planner.moe import expert_split
from torchtitan_like.tools.planner.optimizer import optimizer_state_bytes
from torchtitan_like.tools.planner.ring import ring_working_bytes
from torchtitan_like.tools.planner.schedule import (
    checkpointed,
    rank_stages,
    schedule_order,
    stage_split,
)


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


def stage_params(m: ModelShape, tp: int, layers: int, first: bool, last: bool) -> float:
    """Parameters of one stage on one TP rank, before FSDP sharding."""
    return (layers * m.block_params + (m.embedding_params if first else 0)
            + (m.head_params if last else 0)) / tp


@dataclasses.dataclass
class _Weights:
    """Bytes of the weight side on this GPU (see the module docstring)."""

    master: float
    optimizer: float
    grad_bytes: float
    """Bytes per local (TP-split) parameter of accumulated gradient."""
    gathered_always: float = 0.0
    gathered_loss: float = 0.0
    gathered_layer: float = 0.0
    unit_grads: float = 0.0
    unsharded_grads: bool = False
    """Gradients accumulate per gathered parameter (pipelined FSDP), not per shard."""
    casts_recomputed_only: bool = False
    """``gathered_layer`` exists only in the backward of a recomputed block (autocast's
    weight casts), not of every block (FSDP's gathered unit)."""


def stage_gathered(m: ModelShape, layout: Layout, layers: int, first: bool, last: bool
                   ) -> float:
    """Parameters of one stage on one GPU once FSDP gathers them: ``stage_params``, with the
    routed experts split over EP x ETP instead of TP (tools/planner/moe.py)."""
    experts = layers * m.expert_block_params
    return stage_params(m, layout.tp, layers, first, last) - experts / layout.tp \
        + experts / expert_split(layout)


def _weights(m: ModelShape, work: Workload, layout: Layout, local: float, gathered: float,
             has_last: bool, matrices: float) -> _Weights:
    """Weights in compute dtype beside the master copy, and unsharded gradients. Gradients
    accumulate per parameter from the first backward that reaches it: sharded, in the master
    dtype; but pipelined FSDP skips the reduce-scatter until the last microbatch, so there
    they accumulate unsharded, in the reduce dtype. ``local``: the stage's parameters on one
    TP rank (sharded state: local / n, experts included, moe.py); ``gathered``: once gathered;
    ``matrices``: the blocks' share of ``local`` (the optimizer's states, optimizer.py)."""
    prec, cb, n = work.precision, work.precision.compute_bytes, layout.fsdp_degree
    unit = m.gathered_block_params(layout.tp, expert_split(layout))
    master = local / n * prec.master_bytes
    w = _Weights(master, optimizer_state_bytes(work, local, matrices) / n, prec.master_bytes / n)
    if layout.fsdp_enabled:
        if layout.reshard:  # only the unit that runs is gathered
            w.gathered_layer = unit * cb
            w.gathered_loss = (m.head_params / layout.tp if has_last else unit) * cb
        else:
            w.gathered_always = gathered * cb
        # In backward a unit's gradients exist unsharded and again as the reduce-scatter
        # input (except under PP, see above).
        if layout.pp > 1:
            w.grad_bytes = prec.reduce_bytes
            w.unsharded_grads = True
        else:
            w.unit_grads = unit * (cb + prec.reduce_bytes)
    return w


@dataclasses.dataclass
class _Activations:
    """Bytes of one microbatch on this rank, per block and at the edges of a stage."""

    full_layer: float
    kept_ckpt: float
    kept_op: float
    working: float
    """Gradients alive inside a block's backward: the feed-forward's, or, under CP, ring
    attention's K/V chunks and fp32 accumulators when they are more (ring.py)."""
    head_kept: float
    loss_grads: float
    edge: float
    """The hidden states a stage sends or receives (0 without PP)."""


def _activations(m: ModelShape, gpu: GPU, work: Workload, layout: Layout) -> _Activations:
    """The last stage keeps the final norm's tensors and the fp32 log-probabilities; a stage
    also keeps its output (logits, or the hidden states it sends on) until that microbatch's
    backward (PipelineStage's forward cache)."""
    t, cb, fused = layout.tp, work.precision.compute_bytes, gpu.fused_rms_norm
    tokens = layout.local_batch_size * work.seq_len / layout.cp
    math = math_attention(m, gpu)
    kernel = kernel_bytes(m, work.seq_len, t, math)  # logsumexp, or the math path's softmax
    # Op-level AC saves the kernel's output as the kernel wrote it: fp32 where 16-bit inputs
    # are attended in fp32 (the compute-dtype share is in layer_elements).
    wide_output = (4 - cb) * output_elements(m, t) if gpu.attention_fp32 and cb < 4 else 0.0
    pipelined = layout.pp > 1
    vocab = m.vocab_size / t
    prec = work.precision
    block_input = block_input_extra_bytes(m, prec, layout)  # m - c bytes under autocast
    return _Activations(
        full_layer=(layer_elements(m, "none", t, fused, math_attention=math) * cb
                    + kernel + layer_extra_bytes(m, gpu, prec, layout)) * tokens,
        kept_ckpt=(layer_elements(m, layout.ac, t, fused) * cb + block_input) * tokens,
        kept_op=(layer_elements(m, "op", t, fused, layout.op_sac_every_other_matmul) * cb
                 + kernel + wide_output + block_input) * tokens,
        working=max((2 * m.dim + m.ffn_hidden_dim) / t * cb * tokens,
                    ring_working_bytes(m, work, layout)),
        head_kept=(norm_bytes(m, gpu, prec, layout, 1) + 4 * vocab
                   + (cb * vocab if pipelined else 0)) * tokens,
        loss_grads=(12 if t > 1 and layout.loss_parallel else 8) * vocab * tokens,
        edge=(m.dim / t * cb + block_input) * tokens if pipelined else 0.0,
    )


class _StageWalk:
    """The moments of one pipeline rank's step, and their peak."""

    def __init__(self, m: ModelShape, gpu: GPU, work: Workload, layout: Layout, stage: int,
                 microbatches: int) -> None:
        self.m, self.layout, self.stage, self.microbatches = m, layout, stage, microbatches
        self.step_temporary = work.precision.step_temporary
        split = stage_split(m.n_layers, layout)
        self.chunks = [(split[i], i == 0, i == len(split) - 1) for i in rank_stages(layout, stage)]
        t = layout.tp
        local = sum(stage_params(m, t, *chunk) for chunk in self.chunks)
        gathered = sum(stage_gathered(m, layout, *chunk) for chunk in self.chunks)
        matrices = sum(layers * m.block_params / t for layers, _, _ in self.chunks)
        self.w = _weights(m, work, layout, local, gathered,
                          any(last for _, _, last in self.chunks), matrices)
        if autocast(layout, work.precision):
            self._autocast_casts(work.precision.compute_bytes)
        self.a = a = _activations(m, gpu, work, layout)
        self.multi = len(self.chunks) > 1
        self.per_schedule = layout.pp_microbatches or microbatches
        # torch keeps one receive buffer per microbatch for each edge (allocated at the first
        # step, kept); a stage's input *is* its receive buffer, so in-flight microbatches do
        # not count it again.
        self.buffers = sum((0 if first else a.edge) + (0 if last else a.edge)
                           for _, first, last in self.chunks) * self.per_schedule
        self.block_grads = self._grad_params(1, False, False) * self.w.grad_bytes
        self.stored: list[list[float]] = []
        self.kept: list[float] = []
        self.grads: list[float] = []
        for layers, first, last in self.chunks:
            stored = [a.kept_ckpt if c else (a.kept_op if layout.ac == "op" else a.full_layer)
                      for c in checkpointed(layout.ac, layers)]
            output = a.head_kept if last else (0.0 if self.multi else a.edge)
            self.stored.append(stored)
            self.kept.append(sum(stored) + output - (0.0 if first else a.edge))
            self.grads.append(self._grad_params(layers, first, last) * self.w.grad_bytes)

    def _autocast_casts(self, cb: int) -> None:
        """Autocast's compute-dtype casts of the weights (mixed_precision.py): cached for the
        forward and saved by their matmuls, so alive until each matmul's backward; the
        embedding's lookup takes no cast (a tied head casts the shared weight). A
        checkpointed block saves nothing in forward, so its casts go with the forward's
        autocast cache and come back for its recomputation: one block's at a time."""
        m, t, ac = self.m, self.layout.tp, self.layout.ac
        blocks = sum(layers for layers, _, _ in self.chunks)
        recomputed = blocks if ac == "op" else \
            sum(sum(checkpointed(ac, layers)) for layers, _, _ in self.chunks)
        head = m.vocab_size * m.dim if any(last for _, _, last in self.chunks) else 0.0
        self.w.gathered_always = ((blocks - recomputed) * m.block_params + head) / t * cb
        self.w.gathered_layer = m.block_params / t * cb if recomputed else 0.0
        self.w.casts_recomputed_only = True

    def _grad_params(self, layers: int, first: bool, last: bool) -> float:
        """Parameters whose gradients this GPU holds for ``layers`` blocks (and the edges):
        the gathered ones when they accumulate unsharded, else the TP-local ones."""
        if self.w.unsharded_grads:
            return stage_gathered(self.m, self.layout, layers, first, last)
        return stage_params(self.m, self.layout.tp, layers, first, last)

    def _memory(self, gathered: float, gradients: float, activations: float, moment: str
                ) -> Memory:
        w = self.w
        return Memory(parameters=w.master + w.gathered_always + gathered, gradients=gradients,
                      optimizer=w.optimizer, activations=activations, moment=moment,
                      stage=self.stage)

    def backward(self, c: int, others: float, other_grads: float, accumulated: bool
                 ) -> list[Memory]:
        """The moments of one backward of local stage ``c`` while ``others`` bytes of other
        microbatches' activations and ``other_grads`` of other stages' gradients exist."""
        layers, first, last = self.chunks[c]
        w, a, ac = self.w, self.a, self.layout.ac
        done = self.grads[c] if accumulated else 0.0
        others -= 0.0 if first else a.edge  # stored[c] has the stage input: a receive buffer
        moments = []
        if last:  # the loss's backward: every activation of the microbatch is alive
            moments.append(self._memory(
                w.gathered_loss, other_grads + done,
                others + sum(self.stored[c]) + a.head_kept + a.loss_grads, "backward of the loss"))
        # The backward of block k: earlier blocks' activations, block k's (recomputed if
        # checkpointed, and under op-level SAC for its element-wise ops), the gradients of
        # the blocks from k on (and of the head).
        ckpt = checkpointed(ac, layers)
        head = self.m.head_params / self.layout.tp * w.grad_bytes if last else 0.0
        where = "" if len(self.chunks) == 1 else \
            f" {rank_stages(self.layout, self.stage)[c]}"
        for k in range(layers):
            recomputes = ckpt[k] or ac == "op"
            act = others + sum(self.stored[c][:k]) + a.working \
                + (a.full_layer if recomputes else self.stored[c][k])
            partial = (layers - k) * self.block_grads + head
            gathered = w.gathered_layer if recomputes or not w.casts_recomputed_only else 0.0
            moments.append(self._memory(
                gathered, other_grads + max(done, partial) + w.unit_grads, act,
                f"backward of layer {k} of the stage" if not where else
                f"backward of layer {k} of stage{where}"))
        return moments

    def peak(self) -> Memory:
        """Walk the schedule (once per schedule step when a training step runs several);
        then the optimizer step (sharded gradients, as many bytes as the master weights:
        foreach kernels make one temporary per parameter; the receive buffers stay)."""
        edge, moments = self.a.edge, []
        in_flight = [0] * len(self.chunks)
        has_grads = [False] * len(self.chunks)
        for _ in range(self.microbatches // self.per_schedule):
            sent = 0.0  # the multi-stage schedules wait for their sends at the end of a step
            for kind, c in schedule_order(self.layout, self.stage, self.per_schedule):
                _, first, last = self.chunks[c]
                if kind == "F":
                    in_flight[c] += 1
                    sent += edge if self.multi and not last else 0.0
                    continue
                others = sum(n * k for n, k in zip(in_flight, self.kept, strict=True)) \
                    - self.kept[c]
                other_grads = sum(g for i, g in enumerate(self.grads) if has_grads[i] and i != c)
                moments += self.backward(c, self.buffers + sent + others, other_grads,
                                         has_grads[c])
                in_flight[c] -= 1
                has_grads[c] = True
                sent += edge if self.multi and not first else 0.0
        w = self.w
        temporary = w.master if self.step_temporary else 0.0
        moments.append(Memory(parameters=w.master, gradients=w.master,
                              optimizer=w.optimizer + temporary, activations=self.buffers,
                              moment="optimizer step", stage=self.stage))
        return max(moments, key=lambda mem: mem.total)


def stage_memory(m: ModelShape, gpu: GPU, work: Workload, layout: Layout, stage: int,
                 microbatches: int) -> Memory:
    """Peak bytes on one GPU of pipeline rank ``stage`` (see the module docstring): the
    largest moment of its schedule (``schedule_order``), walked forward by forward and
    backward by backward."""
    return _StageWalk(m, gpu, work, layout, stage, microbatches).peak()
