"""The activations one block's attention keeps for its backward, per model family.

Counted per token on one TP rank, in elements, from the attention's input (its norm's output,
counted with the norms in activations.py) to the input of ``wo``, by reading what autograd
saves in each family's forward (models/llama3, qwen3, deepseek_v3; checked by counting saved
tensors with ``torch.autograd.graph.saved_tensors_hooks`` on the debug flavors). With h heads,
q = h x head_dim, kv = kv_heads x head_dim, TP degree t and c = 1 where RMSNorm is composite
(CPU: it also keeps its normalised tensor), 0 where it is one fused kernel:

    grouped-query (Llama)   4 q/t              the kernel's q, k and v (k and v repeated to
                                               every query head) and its output
    + per-head q/k norms    (1 + c)(q + kv)/t  Qwen3 normalises each head of q and k before
                                               RoPE: each norm keeps its input (the wq/wk
                                               output) and, composite, its normalised tensor
    multi-head latent       (2 + c)(r_q + r_kv) + r_rope
    attention (DeepSeek)      + h (2 d_qk + (d_nope + d_v) + d_v)/t

For MLA (DeepSeek-V2 section 2.1): the latents are replicated on every TP rank. The kv latent
norm keeps its input, a view of ``wkv_a``'s whole output (r_kv latent + r_rope shared RoPE
key), its normalised tensor (composite) and its output (``wkv_b``'s input); the query latent
(r_q = q_lora_rank, 0 when queries are projected directly) the same, without a RoPE part. The
kernel keeps the concatenated q and k (d_qk = d_nope + d_rope per head), v, a view of
``wkv_b``'s output that holds the whole per-head (d_nope + d_v) storage alive, and its output
(d_v per head: V's head size is not the query/key one). The pre-RoPE parts are views of
those projection outputs and RoPE keeps only its cos/sin table, so nothing else survives.

Where the fused kernels cannot run, SDPA takes its math path (``math_attention``): torch's CPU
flash kernel needs one head size for q, k and v, so MLA on a CPU keeps scaled copies of q and
k, a contiguous copy of v and of the output (2 h (d_qk + d_v)/t), plus the softmax
probabilities, h x seq per token, which ``kernel_bytes`` counts beside the fused kernels'
logsumexp (CUDA's memory-efficient kernel takes a value head size of its own).

Op-level selective checkpointing keeps only matmul, attention and collective outputs: the
projections (Llama and Qwen3: wq, wk, wv, (q + 2 kv)/t; MLA: the latents r_q + r_kv +
r_rope, wq/wq_b's h d_qk/t and wkv_b's h (d_nope + d_v)/t) and the kernel's output (q/t; MLA
h d_v/t); norms, RoPE and concatenations are recomputed. Not counted: each norm's one fp32
rstd per normalised row (1/head_dim of its input).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchtitan_like.tools.planner.inputs import GPU, ModelShape


def math_attention(m: ModelShape, gpu: GPU) -> bool:
    """SDPA runs its math path: the device's fused kernels need one head size for q, k and v
    and the model's values have their own (MLA)."""
    mla = m.latent
    return (mla is not None and not gpu.fused_attention_any_v_dim
            and mla.v_head_dim != mla.nope_dim + mla.rope_dim)


def attention_elements(m: ModelShape, ac: str, tp: int, fused_norm: bool,
                       math: bool = False) -> float:
    """Elements per token one block's attention keeps on one TP rank without checkpointing
    (``ac`` "none") or under op-level selective checkpointing ("op"); see the module
    docstring. ``math``: SDPA's math path (``math_attention``)."""
    t, c, h = tp, 0 if fused_norm else 1, m.n_heads
    mla = m.latent
    if mla is None:
        q, kv = m.q_dim, m.kv_heads * m.head_dim
        if ac == "op":
            return (q + 2 * kv) / t + q / t
        return 4 * q / t + ((1 + c) * (q + kv) / t if m.qk_norm else 0.0)
    qk, kv_up, v = mla.nope_dim + mla.rope_dim, mla.nope_dim + mla.v_head_dim, mla.v_head_dim
    latents = mla.q_lora_rank + mla.kv_lora_rank
    if ac == "op":
        return latents + mla.rope_dim + h * (qk + kv_up + v) / t
    kernel = 2 * qk + 2 * v if math else 2 * qk + kv_up + v
    return (2 + c) * latents + mla.rope_dim + h * kernel / t


def output_elements(m: ModelShape, tp: int) -> float:
    """Elements per token of the attention kernel's output on one TP rank (V's head size)."""
    mla = m.latent
    return (m.n_heads * mla.v_head_dim if mla is not None else m.q_dim) / tp


def kernel_bytes(m: ModelShape, seq_len: int, tp: int, math: bool = False) -> float:
    """Bytes per token the attention kernel keeps beside its inputs and output on one TP rank:
    the fused kernels' fp32 logsumexp (n_heads), or the math path's softmax probabilities
    (n_heads x seq_len; this project's CPU attention computes in fp32, models/attention.py)."""
    return 4 * m.n_heads * (seq_len if math else 1) / tp
