"""Activation bytes one transformer block keeps for its backward.

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
                            Korthikanti's 5as/h term is absent (it *is* their selective case);
                            other families' attention (Qwen3's q/k norms, DeepSeek's latent
                            attention) keeps what attention.py counts
    4 f/t                   SwiGLU's w1 and w3 outputs, silu(w1 x) and the product

elements per token (h = dim, q = heads x head_dim, f = FFN width, t = TP degree), times the
compute dtype's bytes, times the tokens of a microbatch on this rank (b x s / cp). Op-level
selective checkpointing keeps the block input, the matmul/attention outputs and collective
outputs; full checkpointing keeps the block input (and recomputes one block in backward);
every-N checkpoints every N-th block of each pipeline stage.

An MoE block (tools/planner/moe.py) keeps the same tensors with f the width of the experts one
token runs (top_k routed + shared), plus 2 top_k h/t: the token copies the dispatch builds
(sorted by expert, kept for the experts' weight gradients) and the k expert outputs kept for
the weighted combine, over the share of blocks that are MoE blocks; under op-level
checkpointing only its shared experts' matmul outputs (``op_feed_forward_elements``). Measured
(scripts/validate_plan_memory.py --moe, docs/planner-throughput.md): within 3.4%.
"""

from __future__ import annotations

from torchtitan_like.tools.planner.attention import attention_elements
from torchtitan_like.tools.planner.inputs import ModelShape


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


def routed_elements(m: ModelShape, tp: int) -> float:
    """An average block's MoE tensors per token on one TP rank: the dispatched copies and the
    expert outputs, top_k x dim each, over the share of blocks that are MoE blocks."""
    return 2 * m.top_k * m.dim / tp * m.moe_share


def op_feed_forward_elements(m: ModelShape, tp: int) -> float:
    """An average block's feed-forward matmul outputs per token on one TP rank that op-level
    checkpointing keeps, beside the w2 outputs ``layer_elements`` counts with wo's: a dense
    block's w1 and w3 outputs; an MoE block's only for its shared experts, since the routed
    experts' grouped GEMMs are not among the saved ops (distributed/activation_checkpoint.py)
    and are recomputed with the dispatched copies; without shared experts an MoE block's
    output is the combine, not a matmul, so its w2 output is not kept either. (The router's
    logits, num_experts fp32 per token, are not counted.)"""
    dense = 2 * m.ffn_hidden_dim / tp
    if not m.is_moe:
        return dense
    shared = 2 * m.shared_experts * m.expert_dim / tp if m.shared_experts else -m.dim
    return dense * (1 - m.moe_share) + shared * m.moe_share


def layer_elements(m: ModelShape, ac: str, tp: int, fused_norm: bool,
                   every_other_matmul: bool = False, math_attention: bool = False) -> float:
    """Activation elements one block keeps per token of its input (see the module docstring);
    under op-level checkpointing: the block input, every matmul, attention and collective
    output (``every_other_matmul``: TorchTitan's policy instead, ``alternate_matmul_share``).
    The attention's part is its family's (attention.py; ``math_attention``: SDPA's math
    path); what its kernel keeps beside (logsumexp or probabilities) is added by the caller
    (``attention.kernel_bytes``)."""
    h, kv, f, t = m.dim, m.kv_heads * m.head_dim, m.ffn_hidden_dim, tp
    if ac == "full" or ac.isdigit():  # the checkpointed block keeps its input
        return h / t
    if ac == "op":
        gathered = 2 * h if t > 1 else 0  # all-gather outputs (SP) are saved collectives
        partial_sums = 2 * h if t > 1 else 0  # wo/w2 outputs before their reduce-scatter
        reduced = 2 * h / t  # wo/w2 outputs after it (plain matmul outputs without TP)
        kept = (h / t + gathered + attention_elements(m, "op", t, fused_norm) + partial_sums
                + reduced + op_feed_forward_elements(m, t))
        if every_other_matmul:  # wk, wo (its reduce-scatter output stays) and w3 recomputed
            kept -= kv / t + f / t + (h if t > 1 else h / t)
        return kept
    norm = (1 if fused_norm else 2) * h / t + h
    return (2 * norm + attention_elements(m, "none", t, fused_norm, math_attention)
            + 4 * f / t + routed_elements(m, t))


def alternate_matmul_share(m: ModelShape) -> float:
    """Share of a block's forward matmul FLOPs that TorchTitan's op-level selective
    checkpointing recomputes in backward. Its policy (torchtitan ``_custom_policy``, 2024 on)
    counts a block's ``aten.mm`` calls in forward order and saves every other one: of Llama's
    wq, wk, wv, wo, w1, w3, w2 it saves wq, wv, w1 and w2 (with the attention and
    reduce-scatter outputs) and recomputes wk, wo and w3:
    (kv + q + f) / (2q + 2kv + 3f) of the block's weights (0.365 for Llama 3.1 8B).
    This platform's op policy saves every matmul output (recomputes none)."""
    q, kv, f = m.q_dim, m.kv_heads * m.head_dim, m.ffn_hidden_dim
    return (kv + q + f) / (2 * q + 2 * kv + 3 * f)
