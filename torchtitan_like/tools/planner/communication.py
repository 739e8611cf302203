"""Bytes each GPU sends per step, per parallel dimension, over the link each group uses (links.py).

Ring algorithms: (n-1)/n of the data for an all-gather or reduce-scatter, twice that for an
all-reduce. FSDP all-gathers parameters (twice with reshard: forward and backward) and
reduce-scatters gradients; HSDP all-reduces the shard across replicas; TP with sequence
parallelism all-gathers and reduce-scatters sbh twice per layer forward and twice backward
(Korthikanti et al., 2022), again in a recomputed forward; CP passes K and V around the ring
in every forward and backward and the fp32 K/V gradients back (ring.py); PP sends a
microbatch's activations forward and its gradient back,
once per model chunk; EP's all-to-alls dispatch and combine every MoE layer's routed tokens
(tools/planner/moe.py: its formula), and FSDP gathers routed experts over the expert-FSDP ranks
(efsdp = dp_shard x cp x tp / (ep x ETP)), 1/(ep x ETP) of them per GPU. Each ring step also
costs a hop latency (``GPU.intra_node_latency_s`` / ``inter_node_latency_s``); a link with a
measured rate curve (``GPU.intra_node_gbps_by_message``) runs each dimension at the rate of its
own ring step's message (bytes per step over hops). A group whose
ranks fit in one node (the mesh is [pp, dp_replicate, dp_shard, cp, tp], TP innermost) uses
the intra-node link. How much of each
transfer the step waits for is step_time.py's business.
"""

from __future__ import annotations

from torchtitan_like.tools.planner.inputs import Cluster, Layout, ModelShape, Workload
from torchtitan_like.tools.planner.links import Comm, link, ring_volume
from torchtitan_like.tools.planner.moe import all_to_all_bytes, all_to_all_share, expert_split
from torchtitan_like.tools.planner.ring import cp_traffic
from torchtitan_like.tools.planner.schedule import busiest_rank_layers, checkpointed, rank_layers


def communication(m: ModelShape, cluster: Cluster, work: Workload, layout: Layout,
                  microbatches: int) -> list[Comm]:
    """Bytes each GPU of the busiest pipeline rank sends per step, per parallel dimension
    (FSDP: rank 0's stage with the embedding, and the head without PP)."""
    prec, t, cp, pp = work.precision, layout.tp, layout.cp, layout.pp
    layers = busiest_rank_layers(m, layout)
    experts = rank_layers(m, layout, 0) * m.expert_block_params  # rank 0's routed experts
    head = m.head_params if pp == 1 else 0.0  # rank 0 holds the last stage too without PP
    local = (rank_layers(m, layout, 0) * m.block_params - experts + m.embedding_params
             + head) / t
    tokens = layout.local_batch_size * work.seq_len  # per microbatch, before CP
    sbh = tokens * m.dim * prec.compute_bytes
    recomputed = sum(checkpointed(layout.ac, layers))
    comms: list[Comm] = []

    def add(dim: str, group: int, span: int, *parts: tuple[str, float, float]) -> None:
        """One dimension's traffic: (collective, bytes, hops) parts, each at its own
        collective's rate for its ring step's message; the Comm carries their total bytes at
        the rate that gives their summed seconds."""
        nbytes, hops = sum(p[1] for p in parts), sum(p[2] for p in parts)
        if group == 1 or nbytes <= 0:
            return
        seconds, name, latency = 0.0, "", 0.0
        for kind, part_bytes, part_hops in parts:
            name, rate, latency = link(cluster, span, part_bytes / max(part_hops, 1.0), kind)
            seconds += part_bytes / rate
        comms.append(Comm(dim, group, name, nbytes / seconds, nbytes, hops, latency))

    # Innermost first: [pp, dp_replicate, dp_shard, cp, tp].
    tp_calls = tp_collectives(m, layout, microbatches)  # half gathers, half reductions
    tp_half = (tp_calls / 2 * ring_volume(t, sbh / cp), tp_calls / 2 * (t - 1))
    add("tp", t, t, ("all_gather", *tp_half), ("reduce_scatter", *tp_half))
    if cp > 1:  # K/V forward and backward, their gradients back (ring.py)
        rotate = "all_gather" if layout.cp_rotate_method == "allgather" else "all_to_all"
        add("cp", cp, t * cp,
            (rotate, *cp_traffic(m, work, layout, microbatches, layers, recomputed)))
    n = layout.fsdp_degree
    syncs = 1 if pp > 1 else microbatches  # pipelined FSDP reduces once per step
    gathers = fsdp_gathers(layout, microbatches)
    split = expert_split(layout)  # ep x ETP ranks hold different experts' weights
    efsdp = n * t // split
    units = layers + 2  # one FSDP unit per block, the embedding and the head

    def fsdp(calls: int, nbytes: int) -> tuple[float, float]:
        return (ring_volume(n, local * calls * nbytes)
                + ring_volume(efsdp, experts / split * calls * nbytes), units * calls * (n - 1))

    add("fsdp", n, t * n, ("all_gather", *fsdp(gathers, prec.compute_bytes)),
        ("reduce_scatter", *fsdp(syncs, prec.reduce_bytes)))
    r = layout.dp_replicate
    add("dp_replicate", r, t * n * r,
        ("all_reduce", syncs * 2 * ring_volume(r, local / n * prec.reduce_bytes),
         units * syncs * 2 * (r - 1)))
    _add_all_to_all(comms, m, cluster, work, layout, microbatches, layers)
    sends = microbatches * layout.stages_per_rank * 2
    add("pp", pp, cluster.num_gpus, ("send_recv", sends * sbh / (t * cp), sends))
    return comms


def tp_collectives(m: ModelShape, layout: Layout, microbatches: int) -> int:
    """TP/SP collectives the busiest pipeline rank issues per step (0 without TP): per block
    two all-gathers and two reduce-scatters forward, as many backward, a recomputed forward's
    four again (the embedding's and head's few left out)."""
    if layout.tp == 1:
        return 0
    layers = busiest_rank_layers(m, layout)
    return microbatches * (8 * layers + 4 * sum(checkpointed(layout.ac, layers)))


def fsdp_gathers(layout: Layout, microbatches: int) -> int:
    """FSDP all-gathers of each parameter per step. Without PP, one per microbatch forward and,
    resharding after forward, one more per backward. Under PP the stage keeps its parameters
    gathered after a backward until the last (``set_reshard_after_backward(False)``): without
    resharding after forward (the default) it gathers once a step; with it, each forward frees
    them, so the stage's first action and every action right after a forward gathers: m + 1
    per stage in any schedule order (each of the m forwards has a successor)."""
    if layout.pp == 1:
        return microbatches * (2 if layout.reshard else 1)
    return microbatches + 1 if layout.reshard else 1


def _add_all_to_all(comms: list[Comm], m: ModelShape, cluster: Cluster, work: Workload,
                    layout: Layout, microbatches: int, layers: int) -> None:
    """EP's dispatch and combine on the busiest pipeline rank (moe.py): each TP rank routes
    its 1/tp of the sequence-parallel tokens; one call per MoE layer and pass."""
    if layout.ep == 1 or not m.is_moe:
        return
    tokens = layout.local_batch_size * work.seq_len / (layout.cp * layout.tp)
    moe_layers = layers * m.moe_share
    recomputed = sum(checkpointed(layout.ac, layers)) * m.moe_share
    volume = all_to_all_bytes(tokens, m.top_k, m.dim, work.precision.compute_bytes,
                              moe_layers, recomputed) * microbatches
    _, share = all_to_all_share(layout.ep, cluster.gpus_per_node)
    calls = 2 * microbatches * (2 * moe_layers + recomputed)
    sent = volume * share
    name, bandwidth, latency = link(cluster, layout.ep, sent / calls,  # consecutive ranks
                                    "all_to_all")
    comms.append(Comm("ep", layout.ep, name, bandwidth, sent, calls, latency))
