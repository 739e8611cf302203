"""Which dtype the tensors a block keeps have, by how the trainer casts (activations.py counts
them in the compute dtype; this adds what differs).

**FSDP's mixed precision** (``MixedPrecisionPolicy(param_dtype=compute)``) all-gathers the
weights in the compute dtype: the embedding's output, the residual stream, the norms and every
matmul run in it, so every kept tensor has the compute dtype's bytes c (activations.py's count).

**torch's composite RMSNorm** (a CPU: ``GPU.fused_rms_norm`` False) computes a 16-bit input
in fp32, its opmath type, and keeps the upcast input and the normalised tensor in fp32 (4
bytes each); the fused kernel keeps its input as it came.

**Autocast without FSDP** (``distributed/utils.py: maybe_autocast``, one device, TP or PP
without data parallelism, a compute dtype below the weights'): the weights stay in the master
dtype m. The embedding's output is an m-byte tensor and every residual add promotes the
c-byte block output back to m, so the block input, each norm's input and (composite RMSNorm)
its normalised tensor take m bytes; autocast then casts a matmul's input for that matmul alone
(it caches casts of weights, never of activations), so a norm read by k matmuls keeps k
c-byte copies of its output (Llama: wq, wk, wv read the attention norm, w1 and w3 the
feed-forward's; under sequence parallelism each copy is of the all-gathered, full-length
input): per norm ``norm_bytes``, against (1 + f) h/t c + h c in the count (f = 1 for the
composite RMSNorm), and the checkpointed blocks' inputs h/t (m - c) more. The weights' c-byte
casts, cached for the forward and saved by their matmuls, are memory.py's. Checked against
what autograd keeps in a block (tests/unit/test_planner_mixed_precision.py) and by
scripts/validate_plan_memory.py's bf16 rows (within 1.6%).

**This project's CPU attention** (models/attention.py, ``GPU.attention_fp32``) attends 16-bit
q, k and v in fp32: SDPA keeps the fp32 copies of q, k, v and its fp32 output, and ``wo``
keeps the output's cast back: 4 q/t (4 - c) + q/t c beyond the count of q, k, v and output at
c bytes. Grouped-query and Qwen3 attention; latent attention (MLA) is left at the count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchtitan_like.tools.planner.inputs import GPU, Layout, ModelShape, Precision

NORM_READERS = (3, 2)
"""Matmuls that read the attention norm's output (wq, wk, wv; MLA's two down-projections are
counted as three) and the feed-forward norm's (w1, w3)."""

OPMATH_BYTES = 4
"""torch's composite RMSNorm computes 16-bit inputs in fp32 (its opmath type) and keeps the
upcast input and the normalised tensor in fp32."""


def autocast(layout: Layout, prec: Precision) -> bool:
    """The trainer runs the blocks under autocast: no FSDP, a compute dtype below the
    weights' (distributed/utils.py: maybe_autocast)."""
    return not layout.fsdp_enabled and prec.compute_bytes < prec.master_bytes


def norm_bytes(m: ModelShape, gpu: GPU, prec: Precision, layout: Layout, readers: int
               ) -> float:
    """Bytes per token one RMSNorm and the inputs of the ``readers`` matmuls after it keep
    (module docstring): its own tensors (a fused kernel its input, in the residual stream's
    dtype; the composite one its input and normalised tensor, in fp32) and the matmuls' input
    (one shared tensor in the compute dtype; under autocast one cast per matmul), full length
    under sequence parallelism."""
    h, t, c = m.dim, layout.tp, prec.compute_bytes
    cast = autocast(layout, prec)
    if gpu.fused_rms_norm:
        own = h / t * (prec.master_bytes if cast else c)
    else:
        own = 2 * h / t * max(c, OPMATH_BYTES)
    return own + (readers if cast else 1) * h * c


def layer_extra_bytes(m: ModelShape, gpu: GPU, prec: Precision, layout: Layout) -> float:
    """Bytes per token one block without checkpointing keeps beyond its compute-dtype count
    (activations.layer_elements x c; module docstring): the norms' dtypes and autocast's
    per-matmul casts, the CPU attention's fp32 copies (and Qwen3's composite q/k norms in
    fp32)."""
    t, c = layout.tp, prec.compute_bytes
    counted = ((1 if gpu.fused_rms_norm else 2) * m.dim / t + m.dim) * c
    extra = sum(norm_bytes(m, gpu, prec, layout, k) - counted for k in NORM_READERS)
    if c < OPMATH_BYTES and not gpu.fused_rms_norm and m.qk_norm:
        extra += 2 * (m.q_dim + m.kv_heads * m.head_dim) / t * (OPMATH_BYTES - c)
    if gpu.attention_fp32 and c < 4 and m.latent is None:
        extra += 4 * m.q_dim / t * (4 - c) + m.q_dim / t * c
    return extra


def block_input_extra_bytes(m: ModelShape, prec: Precision, layout: Layout) -> float:
    """Bytes per token a checkpointed block's input (the residual stream, a stage's edge)
    takes beyond the compute dtype's: m - c under autocast."""
    return m.dim / layout.tp * (prec.master_bytes - prec.compute_bytes) \
        if autocast(layout, prec) else 0.0
