"""Attention under context parallelism: its steps' compute, the K/V traffic each step waits
for, its element-wise merges and its working memory.

**Ring** (``Layout.cp_algorithm = "ring"``: this platform's, counted from torch's
``_templated_ring_attention`` and its backward in torch.distributed.tensor.experimental, of the
same structure in the torch of the published CP runs, 2024-12). A CP rank holds c = s/cp
tokens of each of the b sequences of a microbatch (the headtail balancer gives it chunks r and
2cp-1-r) and attends in cp steps, one per K/V chunk, with q the query width on its TP rank
(heads x head dim / tp):

- step 0, its own chunk, causal: 4 b c^2 q / 2 FLOPs forward;
- steps 1 .. cp-1, a received chunk: balanced, half of it is needed (every query against the
  first half of the keys, or the second half of the queries against every key): 4 b c (c/2) q,
  the same as step 0; without a balancer (``cp_load_balancer = "none"``) rank r computes r
  whole chunks (4 b c^2 q each) and skips the others, so rank cp-1 does (2cp - 1)/cp of a
  balanced rank's work and every rank waits for it.

A balanced rank computes 1/cp of the causal attention, in cp equal steps. The flash kernel's
backward recomputes the scores and runs four more matmuls of their size: 2.5 x the forward's
FLOPs (FLASH_BACKWARD_FLOPS); a fully checkpointed block runs the ring forward again.

Traffic per step: K and V of one chunk, 2 b c k x bytes, k = q (this platform's and
TorchTitan's models repeat grouped K/V heads before SDPA). With the rotate method "allgather"
(torch's default) one all-gather of the other cp - 1 chunks is issued before step 0 and
waited for before step 1: exposed by what it exceeds step 0. With "alltoall" each chunk is
passed on during a step and waited for before the next: exposed by what each transfer exceeds
a step. The backward moves K/V the same way against its own steps and passes the K/V
gradients, accumulated in fp32, on after every step (point-to-point whatever the rotate
method): each is waited for after the next step's compute, the last at once (exposed whole).

Element-wise work, bytes per element of one step (16-bit compute dtype, cb bytes; torch's
``convert_to_f32``): forward, concatenating K and V to send them (read and write both: 4 cb
per K/V element), the output cast to fp32 (cb + 4) and merged into the running fp32 output
through its logsumexp, ``out - sigmoid(lse_i - lse) * (out - out_i)``: three fp32 kernels of
12, 8 and 12 bytes, 32 + cb + 4 per output element; backward, the same concatenation, each
K/V gradient added to its fp32 accumulator over half its length and the whole re-concatenated
(``_partial_update``: (8 + cb)/2 + 8 per element, for K and V), both concatenated in fp32 to
be sent (16), and the query gradient accumulated (8 + cb). A pass also casts and allocates
once (forward 2 (cb + 4) per output element; backward fp32 zeros for q, k, v, the first
step's additions and the final casts). Every count is the busiest rank's (rank cp-1: no
partial steps in forward, partial K/V updates in backward).

**Gathered K/V** (``"gathered_kv"``, Llama 3's, report section 3.3.2): each rank all-gathers
the grouped-query K and V of the whole sequence (kv_heads x head dim / tp wide: GQA makes them
small), then attends its two load-balanced query chunks in one kernel each, and reduce-scatters
the K/V gradients in backward; the gather and the reduce-scatter are waited for (the report:
exposed, but an order of magnitude below the attention). No merges; the same FLOPs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from torchtitan_like.tools.planner.inputs import Layout, ModelShape, Workload
from torchtitan_like.tools.planner.schedule import busiest_rank_layers, checkpointed

if TYPE_CHECKING:
    from torchtitan_like.tools.planner.links import Comm

FLASH_BACKWARD_FLOPS = 2.5
"""A flash attention backward's FLOPs over its forward's: it recomputes QK^T and runs dV,
dP, dQ and dK, five matmuls of the forward's two sizes (the convention of FlashAttention's
benchmarks, Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py)."""


@dataclasses.dataclass(frozen=True)
class RingShape:
    """One microbatch's CP attention on one GPU."""

    steps: int
    """cp: one per K/V chunk."""
    step_forward_flops: float
    """FLOPs of one balanced ring step's forward, one layer: 2 b c^2 q."""
    kv_bytes: float
    """K and V of one chunk in the compute dtype: what one ring step sends."""
    kv_grad_bytes: float
    """The fp32 K and V gradients one backward ring step sends."""
    out_elements: float
    """Attention output elements of the rank's chunk: b c q."""
    kv_elements: float
    """K (or V) elements of one chunk: b c k."""


def ring_shape(m: ModelShape, work: Workload, layout: Layout) -> RingShape:
    """The CP attention of one microbatch (see the module docstring)."""
    cp, t, cb = layout.cp, layout.tp, work.precision.compute_bytes
    tokens = layout.local_batch_size * work.seq_len / cp  # b c
    gathered = layout.cp_algorithm == "gathered_kv"
    q = m.q_dim / t
    k = (m.kv_heads * m.head_dim if gathered else m.q_dim) / t
    per_token_forward = m.attention_flops_per_token(work.seq_len) / 6 / m.n_layers / t
    return RingShape(
        steps=cp, step_forward_flops=tokens * per_token_forward / cp,
        kv_bytes=2 * tokens * k * cb, kv_grad_bytes=2 * tokens * k * (cb if gathered else 4),
        out_elements=tokens * q, kv_elements=tokens * k)


def attention_factor(layout: Layout, ring_efficiency: float) -> float:
    """The busiest CP rank's attention time over 1/cp of the attention in one kernel: the
    ring's step 0 (its own chunk) at the kernels' rate, each later step (a received chunk,
    half of it needed) at ``ring_efficiency`` of it (calibration.py); without a balancer the
    last rank's later steps are whole chunks, twice the work. 1 without CP or with gathered
    K/V (one kernel)."""
    cp = layout.cp
    if cp == 1 or layout.cp_algorithm == "gathered_kv":
        return 1.0
    later = 1 if layout.cp_load_balancer == "headtail" else 2
    return (1 + later * (cp - 1) / ring_efficiency) / cp


def merge_bytes(ring: RingShape, cb: int) -> tuple[float, float]:
    """HBM bytes of one layer's ring forward and backward passes (module docstring): every
    step but the last concatenates K and V to send them; every step but the first merges (or,
    in backward, accumulates) into fp32."""
    later, out, kv = ring.steps - 1, ring.out_elements, ring.kv_elements
    concatenate = later * 4 * cb * kv
    forward = concatenate + later * (36 + cb) * out + 2 * (cb + 4) * out
    kv_step = 2 * ((8 + cb) / 2 + 8) + 16  # K and V: half added, re-concatenated; fp32 send
    first = (2 * (8 + cb) + 16) * kv  # step 0: K and V added whole, concatenated to send
    backward = (concatenate + later * (kv_step * kv + (8 + cb) * out) + first + (8 + cb) * out
                + (4 + 4 + cb) * (out + 2 * kv))  # fp32 zeros for q, k, v; the final casts
    return forward, backward


@dataclasses.dataclass(frozen=True)
class RingTime:
    """Seconds per optimizer step on the busiest GPU."""

    exposed: float
    """CP traffic no step's compute hides."""
    merge: float
    """The ring's element-wise merges and accumulations."""

    @property
    def total(self) -> float:
        return self.exposed + self.merge


def _exposed_pass(link: Comm, layout: Layout, ring: RingShape, step: float,
                  backward: bool) -> float:
    """Seconds one layer's CP pass waits for its traffic over ``link`` (the CP group's),
    each ring step computing ``step``."""
    others = ring.steps - 1
    if layout.cp_algorithm == "gathered_kv":  # gathered before, reduce-scattered after
        gather = link.transfer(others * ring.kv_bytes, others)
        return gather + (link.transfer(others * ring.kv_grad_bytes, others) if backward else 0)
    if layout.cp_rotate_method == "allgather":
        kv = max(0.0, link.transfer(others * ring.kv_bytes, others) - step)
    else:
        kv = others * max(0.0, link.transfer(ring.kv_bytes, 1) - step)
    if not backward:
        return kv
    grads = link.transfer(ring.kv_grad_bytes, 1)
    return kv + others * max(0.0, grads - step) + grads


def ring_time(m: ModelShape, work: Workload, layout: Layout, microbatches: int,
              attention_rate: float, ring_efficiency: float, link: Comm | None,
              hbm_tbps: float) -> RingTime:
    """CP attention's exposed traffic over the CP group's ``link`` and the ring's
    element-wise work at ``hbm_tbps``, per step on the busiest pipeline rank, its step 0
    computing at ``attention_rate`` FLOP/s, the later ones at ``ring_efficiency`` of it
    (zero without CP)."""
    if layout.cp == 1 or link is None:
        return RingTime(0.0, 0.0)
    ring = ring_shape(m, work, layout)
    layers = busiest_rank_layers(m, layout)
    forwards = layers + sum(checkpointed(layout.ac, layers))  # a checkpointed block: again
    first = ring.step_forward_flops / attention_rate  # the all-gather hides behind step 0
    step = first if layout.cp_rotate_method == "allgather" else first / ring_efficiency
    exposed = (forwards * _exposed_pass(link, layout, ring, step, False)
               + layers * _exposed_pass(link, layout, ring, FLASH_BACKWARD_FLOPS * step, True))
    merge = 0.0
    if layout.cp_algorithm == "ring":
        forward, backward = merge_bytes(ring, work.precision.compute_bytes)
        merge = (forwards * forward + layers * backward) / (hbm_tbps * 1e12)
    return RingTime(exposed * microbatches, merge * microbatches)


def cp_traffic(m: ModelShape, work: Workload, layout: Layout, microbatches: int,
               layers: int, recomputed: int) -> tuple[float, float]:
    """(bytes, ring steps) one GPU sends per step for CP attention over ``layers`` blocks,
    ``recomputed`` of them fully checkpointed (communication.py)."""
    ring = ring_shape(m, work, layout)
    forwards, others = layers + recomputed, layout.cp - 1
    if layout.cp_algorithm == "gathered_kv":
        sends = microbatches * others * (forwards + 2 * layers)
        return (microbatches * others * (forwards + layers) * ring.kv_bytes
                + microbatches * others * layers * ring.kv_grad_bytes, sends)
    kv_sends = microbatches * (forwards + layers) * others
    grad_sends = microbatches * layers * layout.cp
    return kv_sends * ring.kv_bytes + grad_sends * ring.kv_grad_bytes, kv_sends + grad_sends


def ring_working_bytes(m: ModelShape, work: Workload, layout: Layout) -> float:
    """Bytes one layer's CP attention holds in backward beside the saved activations (zero
    without CP). Ring: the K/V it attends (every chunk with "allgather", the current and the
    next one with "alltoall"), the fp32 gradient accumulators of q, k and v, the fp32 K/V
    gradients in flight (the one sent and the one received) and one step's 16-bit gradients
    of q, k and v. Gathered K/V: the whole sequence's K/V and their gradients."""
    if layout.cp == 1:
        return 0.0
    ring = ring_shape(m, work, layout)
    cb = work.precision.compute_bytes
    if layout.cp_algorithm == "gathered_kv":
        return ring.steps * (ring.kv_bytes + ring.kv_grad_bytes)
    chunks = ring.steps if layout.cp_rotate_method == "allgather" else 2
    return (chunks * ring.kv_bytes + 4 * (ring.out_elements + 2 * ring.kv_elements)
            + 2 * ring.kv_grad_bytes + cb * (ring.out_elements + 2 * ring.kv_elements))
