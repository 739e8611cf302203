"""What the planner reads of a mixture-of-experts model, and the expert-parallel all-to-all.

Shapes: any registered model whose args carry ``moe`` (``MoEArgs``: routed experts, top_k,
shared experts) and an expert width (``moe_inter_dim``, DeepSeek-V2/V3; ``moe_hidden_dim``,
Qwen3-MoE). The MoE blocks are the last ``n_layers - n_dense_layers`` (DeepSeek's first blocks
are dense; Qwen3-MoE has none). Multi-head latent attention (DeepSeek) is read as full
multi-head attention over the query/key head size for its FLOPs and TP rules; its activations
are counted as what it keeps (attention.py).

Parameters: the *total* count (``num_params``: every expert) is what memory holds; the *active*
count (``num_active_params``: top_k routed experts per token, no embedding lookup) is what one
token's computation multiplies, so FLOPs per token, the GEMM time and MFU follow it, as the
trainer's MFU counts them. Routed-expert weights are stacked per MoE layer,
``num_experts x 3 x dim x expert width``.

Expert parallelism (distributed/expert_layout.py): the planner plans ETP = 1 under EP
(``expert_tensor_parallel``), as TorchTitan: EP borrows its ranks from dp_shard x cp x tp, so an
expert weight is split over ``ep`` and FSDP-sharded over ``efsdp = dp_shard x cp x tp / ep``:
its sharded bytes per GPU are those of a dense weight (P / (tp x dp_shard x cp)), but FSDP
gathers ``1/ep`` of the experts, not ``1/tp``. Without EP, under TP, every expert is split over
the TP ranks like the dense feed-forward (ETP = TP; the trainer refuses ETP = 1 without EP):
FSDP gathers ``1/tp`` of them, as of any dense weight. The same rule, ``validate_expert_layout``,
decides what the trainer would accept; ETP = TP with EP on top (EP over dp_shard x cp only),
which the trainer also runs, is not among the planned layouts.

The all-to-all (``all_to_all_bytes``): each MoE layer dispatches every token's hidden state to
its top_k experts and combines the k results back, so one microbatch of T tokens on a rank moves

    2 (dispatch + combine) x T x top_k x dim x bytes   per MoE layer, forward,

twice that with the backward (the gradients travel the same way back), plus one more forward
for every recomputed block; under ETP = 1 each TP rank dispatches only its own sequence shard,
T = microbatch tokens / (cp x tp). Of it, the share (ep - 1)/ep leaves the rank; across nodes
(EP wider than a node: the EP ranks are consecutive in the expert mesh, so a node holds
gpus_per_node of them) the share (ep - g)/ep crosses the network and sets the time at the
inter-node bandwidth, the NVLink part running beside it. Assumes balanced routing (dropless,
so an imbalanced layer sends more to its hottest rank), no dedup of tokens sent twice to one
node (DeepSeek's node-limited routing dedups up to 4 nodes per token: less traffic than this
count).
"""

from __future__ import annotations

from typing import Any


def expert_width(args: Any) -> int:
    """Hidden width of one routed expert (DeepSeek: moe_inter_dim; Qwen3: moe_hidden_dim)."""
    return int(getattr(args, "moe_inter_dim", None) or args.moe_hidden_dim)


def moe_fields(args: Any) -> dict[str, int]:
    """The MoE fields of ``ModelShape`` for ``args`` (zeros for a dense model)."""
    moe = getattr(args, "moe", None)
    if moe is None:
        return {}
    dense = int(getattr(args, "n_dense_layers", 0))
    return {"moe_layers": int(args.n_layers) - dense, "num_experts": int(moe.num_experts),
            "top_k": int(moe.top_k), "expert_dim": expert_width(args),
            "shared_experts": int(moe.num_shared_experts),
            "active_params": int(args.num_active_params())}


def attention_fields(args: Any) -> dict[str, int]:
    """head_dim / kv_heads / ffn_hidden_dim of models that name them otherwise: multi-head
    latent attention (kv_lora_rank) is read as ``n_heads`` heads of the query/key head size
    (its activations from ``ModelShape.latent``, attention.py);
    an MoE block's feed-forward width is that of the experts one token runs (top_k routed plus
    the shared ones), its dense blocks' ``inter_dim`` where it has no other."""
    fields: dict[str, int] = {}
    if hasattr(args, "kv_lora_rank"):
        fields |= {"head_dim": int(args.qk_head_dim), "kv_heads": int(args.n_heads)}
    moe = getattr(args, "moe", None)
    if moe is not None:
        fields["ffn_hidden_dim"] = (moe.top_k + moe.num_shared_experts) * expert_width(args)
    elif hasattr(args, "inter_dim"):
        fields["ffn_hidden_dim"] = int(args.inter_dim)
    return fields


def routed_forward_share(m: Any) -> float:
    """Share of the weight-GEMM FLOPs per token (6 per active weight) that is one forward of
    the routed experts a token runs (2 per weight, top_k x 3 x dim x width per MoE layer): what
    op-level selective checkpointing recomputes in backward, since the experts' grouped GEMMs
    are not among its saved ops (distributed/activation_checkpoint.py)."""
    routed = m.moe_layers * m.top_k * 3 * m.dim * m.expert_dim
    return 2 * routed / m.flops_per_token(0) if routed else 0.0


def expert_tensor_parallel(tp: int, ep: int) -> int:
    """The ETP the planner plans: 1 under expert parallelism (EP borrows the TP ranks, each
    dispatching its own sequence shard), ``tp`` without it (experts split like the dense
    feed-forward). Routed experts are split over ``ep x ETP`` ranks either way."""
    return 1 if ep > 1 else tp


def expert_split(layout: Any) -> int:
    """Ranks one MoE layer's routed-expert weights are split over (``Layout``): by expert over
    ``ep``, by hidden features over ETP."""
    return layout.ep * expert_tensor_parallel(layout.tp, layout.ep)


def all_to_all_bytes(tokens: float, top_k: int, dim: int, nbytes: int, moe_layers: int,
                     recomputed_moe_layers: float) -> float:
    """Bytes one rank's EP all-to-alls carry per microbatch of ``tokens`` tokens, before the
    share that stays on the rank: 2 (dispatch + combine) x tokens x top_k x dim x bytes per
    MoE layer and pass; passes: forward and backward of every MoE layer, plus one forward of
    each recomputed one."""
    per_pass = 2 * tokens * top_k * dim * nbytes
    return per_pass * (2 * moe_layers + recomputed_moe_layers)


def all_to_all_share(ep: int, gpus_per_node: int) -> tuple[bool, float]:
    """(crosses nodes, share of the volume on the slowest link): (ep - 1)/ep within a node,
    (ep - g)/ep across nodes (see the module docstring)."""
    if ep <= gpus_per_node:
        return False, (ep - 1) / ep
    return True, (ep - gpus_per_node) / ep
