"""Each part of the planner's step time against a hand-computed case, and the search's promises
(pinned degrees and options survive; TP stays in a node; the simpler layout wins a near tie).

The hand computations use Llama 3.1 8B's published shapes: 8,030,261,248 parameters, of which
the 128,256 x 4,096 = 525,336,576 embedding does no matmul, so 6 x 7,504,924,672 FLOPs per
token go to weight matmuls; attention is 12 x 32 layers x 4,096 x seq FLOPs per token.
"""

import dataclasses
import json

import pytest

from torchtitan_like.models.llama3.args import llama3_flavors
from torchtitan_like.tools import plan_cli
from torchtitan_like.tools.planner import (
    GPUS,
    Calibration,
    Cluster,
    Comm,
    Layout,
    ModelShape,
    Precision,
    StepTime,
    Workload,
    bubble_formula,
    communication,
    estimate_step_time,
    plan,
    search,
    why_better,
)
from torchtitan_like.tools.planner import step_time as st
from torchtitan_like.tools.planner.communication import tp_collectives
from torchtitan_like.tools.planner.links import rate_at
from torchtitan_like.tools.planner.search import complexity, rank

H100 = GPUS["H100"]
M8B = ModelShape.from_args(llama3_flavors["8B"])
SEQ = 4096
WORK = Workload(seq_len=SEQ, global_batch=1)  # one sequence: 4,096 tokens
ONE = Cluster(H100, gpus_per_node=1)
MATMUL_FLOPS = 6 * 7_504_924_672 * SEQ
ATTENTION_FLOPS = 12 * 32 * 4096 * SEQ * SEQ


NO_MEMORY_BOUND = Calibration(eager_passes=0.0, compiled_passes=0.0)
FLASH = ATTENTION_FLOPS / 6 * 3.5 / (989e12 * 0.35)
"""The causal forward is a sixth of the counted (full-score, 2x backward) FLOPs; forward and
backward of a flash kernel are 1 + 2.5 forwards."""


def parts(layout=None, comms=(), microbatches=1, cluster=ONE, work=WORK,
          calibration=NO_MEMORY_BOUND):
    return estimate_step_time(M8B, cluster, work, layout or Layout(), microbatches, list(comms),
                              calibration)


def test_gemm_at_the_gpus_measured_matmul_rate():
    assert M8B.num_params == 8_030_261_248
    assert parts().gemm == pytest.approx(MATMUL_FLOPS / (989e12 * 0.801))


def test_float8_runs_the_blocks_linears_at_fp8_and_the_head_in_bf16():
    """Float8 linears at the bf16 matmul efficiency's share of the fp8 peak (a fitted share
    was not justified by the held-out table)."""
    head = 6 * 128256 * 4096 * SEQ
    expected = head / (989e12 * 0.801) + (MATMUL_FLOPS - head) / (1979e12 * 0.801)
    assert parts(Layout(float8=True)).gemm == pytest.approx(expected)


def test_attention_forward_causal_backward_two_and_a_half_forwards():
    assert parts().attention == pytest.approx(FLASH)


def test_memory_bound_kernels_at_hbm_bandwidth():
    passes = Calibration(eager_passes=10.0, compiled_passes=5.0)
    # No TP, fused norms: 2 x (4,096 + 4,096) + 4 x 4,096 + 4 x 14,336 elements per layer.
    elements = (2 * 8192 + 4 * 4096 + 4 * 14336) * 32
    for compiled, n in ((False, 10), (True, 5)):
        extra = SEQ * elements * 2 * n / 3.35e12
        p = parts(Layout(compile=compiled), calibration=passes)
        assert (p.attention, p.memory_bound) == pytest.approx((FLASH, extra))


def test_recompute_one_forward_of_the_checkpointed_blocks():
    head = 6 * 128256 * 4096 * SEQ / (989e12 * 0.801)
    p = parts(Layout(ac="full"), calibration=Calibration(eager_passes=10.0))
    assert p.recompute == pytest.approx((p.gemm - head + p.memory_bound) / 3 + p.attention / 3.5)
    every_2nd = parts(Layout(ac="2"), calibration=Calibration(eager_passes=10.0))
    assert every_2nd.recompute == pytest.approx(p.recompute / 2)  # 16 of 32 blocks
    assert parts(Layout(ac="op")).recompute == 0


def test_torchtitans_op_policy_recomputes_every_other_matmul():
    """TorchTitan's op-level policy saves wq, wv, w1, w2 and recomputes wk, wo, w3: one more
    forward of (1,024 + 4,096 + 14,336) of a block's (2 x 4,096 + 2 x 1,024 + 3 x 14,336)
    weight columns per row of dim; it keeps 4,096 (input) + 4,096 (wq) + 1,024 (wv) + 4,096
    (attention) + 14,336 (w1) + 4,096 (w2) = 31,744 elements per token and block, where this
    platform's policy keeps every matmul output: 51,200."""
    from torchtitan_like.tools.planner.activations import alternate_matmul_share, layer_elements

    share = 19456 / 53248
    assert alternate_matmul_share(M8B) == pytest.approx(share)
    head = 6 * 128256 * 4096 * SEQ / (989e12 * 0.801)
    p = parts(Layout(ac="op", op_sac_every_other_matmul=True))
    assert p.recompute == pytest.approx((p.gemm - head) * share / 3)
    assert layer_elements(M8B, "op", 1, True) == 51200
    assert layer_elements(M8B, "op", 1, True, every_other_matmul=True) == 31744


def test_published_run_inputs_are_refused_where_they_would_mean_nothing():
    """The two inputs that describe another system (TorchTitan's op-level AC, DualPipe's
    overlap) are refused where the planner would silently ignore or misprice them."""
    from torchtitan_like.tools.planner import LayoutError, validate_layout

    cluster, work = Cluster(H100, 8), Workload(seq_len=SEQ, global_batch=8)
    with pytest.raises(LayoutError, match="needs ac op"):
        validate_layout(M8B, cluster, work, Layout(dp_shard=8, op_sac_every_other_matmul=True))
    with pytest.raises(LayoutError, match="needs ep > 1 and pp > 1"):
        validate_layout(M8B, cluster, work, Layout(dp_shard=8, ep_overlapped=True))
    validate_layout(M8B, cluster, work, Layout(dp_shard=8, ac="op",
                                               op_sac_every_other_matmul=True))


def test_collectives_exposure():
    base = parts()
    compute = base.compute
    tp = Comm("tp", 8, "intra-node", 450, 450e9)  # 1 s
    assert parts(comms=[tp]).tp == pytest.approx(1.0)
    async_tp = Layout(async_tp=True, compile=True, tp=8)  # not credited (step_time.ASYNC_TP)
    assert parts(async_tp, [tp]).tp == pytest.approx(1.0)
    fsdp = Comm("fsdp", 8, "intra-node", 450, 450e9 * (compute + 2.0))
    units = 32 + 2
    assert parts(comms=[fsdp]).fsdp == pytest.approx(2.0 + (compute + 2.0) / units)
    cpu_like = Cluster(dataclasses.replace(H100, comm_overlaps_compute=False), gpus_per_node=1)
    assert parts(comms=[fsdp], cluster=cpu_like).fsdp == pytest.approx(compute + 2.0)  # whole
    pp = Comm("pp", 2, "inter-node", 50, 50e9 * 0.25)
    assert parts(comms=[pp]).pp == pytest.approx(0.25)


def test_a_measured_synchronous_collective_cost_is_paid_per_tp_collective():
    """tools/sync_cost.py: each TP collective (per block 8 forward and backward, 4 more when
    the block is recomputed) adds ``host_collective_s`` to the host's dispatch (a CPU process
    pays it on the computing thread) and ``sync_skew_s`` to the exposed TP time; a GPU without
    them (every preset, a GPU profile) plans as before, and a layout without TP pays neither."""
    assert H100.host_collective_s == 0.0 and H100.sync_skew_s == 0.0
    tp = Comm("tp", 8, "intra-node", 450, 450e9)  # 1 s
    cpu_like = dataclasses.replace(H100, host_overlaps_device=False)
    measured = Cluster(dataclasses.replace(cpu_like, host_collective_s=1e-3, sync_skew_s=2e-3),
                       gpus_per_node=8)
    for layout, calls in ((Layout(tp=8), 8 * 32), (Layout(tp=8, ac="full"), 12 * 32)):
        assert tp_collectives(M8B, layout, 2) == 2 * calls
        plain = parts(layout, [tp], cluster=Cluster(cpu_like, gpus_per_node=8))
        paid = parts(layout, [tp], cluster=measured)
        assert paid.tp == pytest.approx(plain.tp + calls * 2e-3)
        assert paid.host == pytest.approx(plain.host + calls * 1e-3)
        assert paid.compute == plain.compute
    assert parts(cluster=measured) == parts(cluster=Cluster(cpu_like, gpus_per_node=8))


def test_a_measured_link_curve_prices_each_dimension_at_its_own_message_size():
    """Linear in log size between the points, the end points held beyond; each dimension's
    message is its bytes per ring step (a ring all-gather's shard)."""
    curve = ((2.0**20, 1.0), (2.0**26, 0.5))
    assert rate_at(curve, 2.0**23) == pytest.approx(0.75)
    assert (rate_at(curve, 1.0), rate_at(curve, 2.0**30), rate_at((), 2.0**22)) == (1.0, 0.5, 0.0)
    node = Cluster(dataclasses.replace(H100, intra_node_gbps_by_message=curve), gpus_per_node=8)
    layout = Layout(dp_shard=4, tp=2, ac="none")
    curved = {c.dim: c for c in communication(M8B, node, WORK, layout, 1)}
    flat = {c.dim: c for c in communication(M8B, Cluster(H100), WORK, layout, 1)}
    message = curved["tp"].bytes_per_step / curved["tp"].hops
    assert curved["tp"].bandwidth_gbps == pytest.approx(rate_at(curve, message))
    # FSDP's two gathers (bf16) and its reduction (fp32) each at their own shard's rate: as
    # many bytes each way, over two thirds and one third of the ring steps
    fsdp, hops = curved["fsdp"], curved["fsdp"].hops / 3
    half = fsdp.bytes_per_step / 2
    seconds = half / rate_at(curve, half / (2 * hops)) + half / rate_at(curve, half / hops)
    assert fsdp.bytes_per_step / fsdp.bandwidth_gbps == pytest.approx(seconds)
    for dim in ("tp", "fsdp"):
        assert flat[dim].bandwidth_gbps == H100.intra_node_gbps
    assert curved["tp"].bandwidth_gbps > curved["fsdp"].bandwidth_gbps  # 16 MiB vs larger shards


def test_bubble_and_its_printed_formula():
    layout = Layout(pp=4)
    work = Workload(seq_len=SEQ, global_batch=12)
    p = parts(layout, microbatches=12, cluster=Cluster(H100, 4), work=work)
    assert p.bubble == pytest.approx(p.compute * (3 / 15) / (1 - 3 / 15))
    assert bubble_formula(layout, 12) == "(pp-1)/(m+pp-1) with pp 4, m 12"
    interleaved = dataclasses.replace(layout, pp_schedule="Interleaved1F1B")
    assert bubble_formula(interleaved, 12) == "(pp-1)/(v*m+pp-1) with pp 4, v 2, m 12"


def test_tokens_per_second_and_mfu_follow_the_step():
    result = plan(M8B, Cluster(H100, 8), Workload(seq_len=8192, global_batch=16),
                  Layout(dp_shard=8, local_batch_size=2, ac="op"))
    per_gpu = 16 * 8192 / result.step_seconds / 8
    assert result.tokens_per_second_per_gpu == pytest.approx(per_gpu)
    assert result.mfu_estimate == pytest.approx(per_gpu * result.flops_per_token / 989e12)


def test_pinned_degrees_and_options_survive_search():
    cluster, work = Cluster(H100, 8, 4), Workload(seq_len=8192, global_batch=64)
    pins = {"tp": 2, "cp": 1, "compile": True, "ac": "full"}
    plans = search(M8B, cluster, work, pins=pins, top=10)
    assert plans
    for p in plans:
        assert (p.layout.tp, p.layout.cp, p.layout.compile, p.layout.ac) == (2, 1, True, "full")
    unpinned = search(M8B, cluster, work, top=50)
    assert all(p.layout.tp <= 8 for p in unpinned)  # TP within a node
    assert {p.layout.tp for p in unpinned} != {2}


def test_cli_search_keeps_pinned_flags(capsys):
    assert plan_cli.main(["--flavor", "8B", "--num_gpus", "16", "--search", "--tp", "8",
                          "--cp", "1", "--float8", "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)
    assert ranked and all(p["layout"]["tp"] == 8 and p["layout"]["cp"] == 1
                          and p["layout"]["float8"] for p in ranked)
    assert plan_cli.main(["--flavor", "8B", "--num_gpus", "16", "--search", "--pp", "2"]) == 0
    out = capsys.readouterr().out
    assert "pinned: pp 2" in out and "#1 over #2" in out


def test_search_prefers_the_simpler_layout_in_a_near_tie():
    cluster, work = Cluster(H100, 8, 2), Workload(seq_len=8192, global_batch=16)
    simple = plan(M8B, cluster, work, Layout(dp_shard=16, ac="full"))
    tp = plan(M8B, cluster, work, Layout(tp=2, dp_shard=8, ac="full"))
    assert complexity(simple.layout) < complexity(tp.layout)

    def taking(p, seconds):
        return dataclasses.replace(p, step=StepTime(seconds, 0, 0, 0, 0, 0, 0, 0, 0))

    # Within 3%: the simpler first, saying why; beyond it: the faster first.
    ranked = rank([taking(tp, 1.0), taking(simple, 1.02)])
    assert ranked[0].layout == simple.layout
    assert why_better(*ranked).startswith("simpler, within 3%")
    assert rank([taking(tp, 1.0), taking(simple, 1.10)])[0].layout == tp.layout


def test_pipelined_fsdp_folds_every_microbatch_into_unsharded_gradients():
    # PP 2 over 32 blocks (the embedding and head weigh a block each): 16 blocks a rank, each
    # (8,030,261,248 - 525,336,576 - 525,340,672) / 32 = 218,112,000 parameters. Per parameter,
    # 4 microbatches: a bf16 -> fp32 cast (2 + 4 bytes), then 3 additions (2 + 4 + 4 each).
    layout = Layout(pp=2, dp_shard=2)
    params = 16 * 218_112_000
    seconds = st.gradient_accumulation(M8B, ONE, WORK, layout, 4)
    assert seconds == pytest.approx(params * (6 + 3 * 10) / 3.35e12)
    bf16_reduce = dataclasses.replace(WORK, precision=Precision(reduce_bytes=2))
    assert st.gradient_accumulation(M8B, ONE, bf16_reduce, layout, 4) == pytest.approx(
        params * 3 * 2 * 3 / 3.35e12)  # autograd adds in place: read both, write one
    assert st.gradient_accumulation(M8B, ONE, WORK, Layout(dp_shard=2), 4) == 0  # no PP
    assert parts(layout, microbatches=4).grad_accumulation == pytest.approx(seconds)


def test_reducing_before_the_send_puts_every_stages_reduction_in_a_row():
    # Under PP the FSDP transfer (1 s here) is one gather (2 bytes) and one reduction (4 bytes)
    # per parameter: 2/3 s of reduction, exposed once; a runtime that reduces inside the last
    # backward, before sending it on, passes that chain through all 4 stages: 3 more.
    fsdp = Comm("fsdp", 2, "intra-node", 450, 450e9)
    layout = Layout(pp=4, dp_shard=2)
    deferred = parts(layout, [fsdp]).fsdp
    in_backward = parts(dataclasses.replace(layout, pp_reduce_before_send=True), [fsdp]).fsdp
    assert in_backward - deferred == pytest.approx(3 * 2 / 3)


def test_pipelined_fsdp_gathers_once_unless_resharding_after_forward():
    # PP 2, FSDP 2, 4 microbatches: per parameter 2 bytes per gather + 4 bytes for the one
    # reduction. The stage keeps its gathered weights across microbatches (1 gather); resharding
    # after each forward, its first action and each one right after a forward gathers (5).
    cluster, work = Cluster(H100, 8), Workload(seq_len=SEQ, global_batch=8)
    layout = Layout(pp=2, dp_shard=2, local_batch_size=1)

    def fsdp_bytes(reshard):
        comms = communication(M8B, cluster, work, dataclasses.replace(
            layout, reshard_after_forward=reshard), 4)
        return next(c.bytes_per_step for c in comms if c.dim == "fsdp")

    assert fsdp_bytes(None) == fsdp_bytes(False)  # the default under PP
    assert fsdp_bytes(True) / fsdp_bytes(False) == pytest.approx((5 * 2 + 4) / (2 + 4))
