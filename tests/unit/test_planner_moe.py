"""The planner's mixture-of-experts model (tools/planner/moe.py) against hand-computed cases:
total vs active parameters, GEMM time from the active ones, expert memory over EP, the EP
all-to-all volume and its link, its exposure, EP in the search (varied, and kept when pinned),
EP's start-up rules, and the seed example: DeepSeek-V3 671B's pre-training cost."""

import dataclasses
import json

import pytest

from torchtitan_like.models.deepseek_v3.args import deepseek_v3_flavors
from torchtitan_like.models.qwen3.args import qwen3_flavors
from torchtitan_like.tools import plan_cli
from torchtitan_like.tools.planner import (
    GPUS,
    Cluster,
    Comm,
    Layout,
    LayoutError,
    ModelShape,
    Workload,
    communication,
    estimate_step_time,
    plan,
    search,
)
from torchtitan_like.tools.planner import step_time as st
from torchtitan_like.tools.planner.moe import expert_split

V3 = ModelShape.from_args(deepseek_v3_flavors["671B"])
QWEN = ModelShape.from_args(qwen3_flavors["30B-A3B"])
H100 = GPUS["H100"]


def test_total_and_active_parameters():
    assert V3.num_params == deepseek_v3_flavors["671B"].num_params()
    assert V3.active_params == deepseek_v3_flavors["671B"].num_active_params()
    assert (V3.moe_layers, V3.num_experts, V3.top_k, V3.expert_dim) == (58, 256, 8, 2048)
    assert V3.expert_block_params * 61 == 58 * 256 * 3 * 7168 * 2048
    # 6 FLOPs per *active* weight: what the trainer's MFU counts.
    assert V3.flops_per_token(0) == 6 * V3.active_params
    assert V3.params_6nd == V3.active_params
    # One token's feed-forward activations: top_k routed + shared experts' width.
    assert V3.ffn_hidden_dim == (8 + 1) * 2048
    assert (QWEN.moe_layers, QWEN.top_k, QWEN.expert_dim, QWEN.ffn_hidden_dim) == \
        (48, 8, 768, 8 * 768)


def test_gemm_time_follows_the_active_parameters(monkeypatch):
    monkeypatch.setattr(st, "MEMORY_BOUND_PASSES", {"eager": 0.0, "compiled": 0.0})
    work = Workload(seq_len=4096, global_batch=1)
    step = estimate_step_time(QWEN, Cluster(H100, 1), work, Layout(), 1, [])
    assert step.gemm == pytest.approx(4096 * 6 * QWEN.active_params / (989e12 * 0.801))


def test_expert_weights_divide_over_ep():
    """Sharded state is P / (tp x dp_shard x cp) for experts too (EP borrows those ranks);
    what FSDP gathers is a dense block over TP plus 1/ep of the experts."""
    e, dense = QWEN.expert_block_params, QWEN.block_params - QWEN.expert_block_params
    assert QWEN.gathered_block_params(1, 8) == pytest.approx(dense + e / 8)
    assert QWEN.gathered_block_params(2, 4) == pytest.approx(dense / 2 + e / 4)
    # Routed experts split over ep x ETP: ETP = 1 under EP, = TP without EP.
    assert [expert_split(Layout(tp=2, ep=ep)) for ep in (1, 2, 4)] == [2, 2, 4]
    cluster, work = Cluster(H100, 8), Workload(seq_len=8192, global_batch=16)
    one, eight = (plan(QWEN, cluster, work, Layout(dp_shard=8, ac="none", ep=ep,
                                                   local_batch_size=2,
                                                   reshard_after_forward=False))
                  for ep in (1, 8))
    assert eight.memory.optimizer == pytest.approx(one.memory.optimizer)
    assert one.memory.moment == eight.memory.moment == "backward of the loss"
    # Without reshard every block stays gathered (bf16): the experts 1/ep of them.
    saved = (one.memory.parameters - eight.memory.parameters) / 2
    assert saved == pytest.approx(48 * 128 * 3 * 2048 * 768 * (1 - 1 / 8))


def test_all_to_all_volume_and_link():
    """2 (dispatch + combine) x tokens x top_k x dim x 2 bytes per MoE layer, forward and
    backward (and one more forward per recomputed layer); the share leaving the rank."""
    per_pass = 2 * 4096 * 8 * 2048 * 2
    node = Cluster(H100, 8)
    comms = communication(QWEN, node, Workload(4096, 8), Layout(dp_shard=8, ep=8, ac="none"), 1)
    ep = next(c for c in comms if c.dim == "ep")
    assert (ep.link, ep.group) == ("intra-node", 8)
    assert ep.bytes_per_step == pytest.approx(per_pass * 2 * 48 * 7 / 8)
    two = Cluster(H100, 8, 2)
    comms = communication(QWEN, two, Workload(4096, 16), Layout(dp_shard=16, ep=16, ac="full"), 1)
    ep = next(c for c in comms if c.dim == "ep")
    assert ep.link == "inter-node"  # half of each rank's copies cross the network
    assert ep.bytes_per_step == pytest.approx(per_pass * 3 * 48 * 8 / 16)
    # ETP = 1 under TP: each TP rank dispatches its own half of the sequence.
    comms = communication(QWEN, node, Workload(4096, 8), Layout(dp_shard=4, tp=2, ep=8), 1)
    ep = next(c for c in comms if c.dim == "ep")
    assert (ep.link, ep.group) == ("intra-node", 8)
    assert ep.bytes_per_step == pytest.approx(per_pass / 2 * 2 * 48 * 7 / 8)
    dense_only = communication(QWEN, node, Workload(4096, 8), Layout(dp_shard=8), 1)
    assert all(c.dim != "ep" for c in dense_only)


def test_all_to_all_is_exposed_and_stretches_the_bubble(monkeypatch):
    monkeypatch.setattr(st, "MEMORY_BOUND_PASSES", {"eager": 0.0, "compiled": 0.0})
    work, layout = Workload(seq_len=4096, global_batch=12), Layout(pp=4, dp_shard=1)
    cluster = Cluster(H100, 4)
    base = estimate_step_time(QWEN, cluster, work, layout, 12, [])
    a2a = Comm("ep", 4, "intra-node", 450, 450e9 * 0.5)
    step = estimate_step_time(QWEN, cluster, work, layout, 12, [a2a])
    assert step.ep == pytest.approx(0.5)
    assert step.bubble == pytest.approx((base.compute + 0.5) * (3 / 15) / (1 - 3 / 15))


def test_an_overlapping_schedule_hides_the_all_to_all_behind_compute(monkeypatch):
    """``ep_overlapped`` (DeepSeek's DualPipe, a published run's input): the all-to-all costs
    only what exceeds the compute of the microbatch it overlaps, and the bubble no longer
    carries it."""
    monkeypatch.setattr(st, "MEMORY_BOUND_PASSES", {"eager": 0.0, "compiled": 0.0})
    work, cluster = Workload(seq_len=4096, global_batch=12), Cluster(H100, 4)
    layout = Layout(pp=4, dp_shard=1, ep_overlapped=True)
    base = estimate_step_time(QWEN, cluster, work, layout, 12, [])
    for seconds, exposed in ((0.5, 0.0), (base.compute + 0.25, 0.25)):
        a2a = Comm("ep", 4, "intra-node", 450, 450e9 * seconds)
        step = estimate_step_time(QWEN, cluster, work, layout, 12, [a2a])
        assert step.ep == pytest.approx(exposed)
        assert step.bubble == pytest.approx((base.compute + exposed) * (3 / 15) / (1 - 3 / 15))


def test_ep_rules_are_the_trainers():
    cluster, work = Cluster(H100, 8), Workload(seq_len=4096, global_batch=8)
    with pytest.raises(LayoutError, match="must divide the ranks it borrows"):
        plan(QWEN, cluster, work, Layout(dp_shard=4, pp=2, ep=8, ac="full"))
    dense = ModelShape.from_args(qwen3_flavors["0.6B"])
    with pytest.raises(LayoutError, match="no mixture-of-experts layers"):
        plan(dense, cluster, work, Layout(dp_shard=8, ep=2))
    plan(QWEN, cluster, work, Layout(dp_shard=4, tp=2))  # MoE under TP, no EP: ETP = TP
    plan(QWEN, cluster, work, Layout(dp_shard=4, tp=2, compile=True))
    plan(QWEN, cluster, work, Layout(dp_shard=4, tp=2, ep=8))  # ETP = 1: EP borrows TP too
    with pytest.raises(LayoutError, match="no FSDP sums their gradients"):
        plan(QWEN, Cluster(H100, 4), work, Layout(tp=4, ep=2))


def test_search_varies_ep_and_keeps_a_pinned_one():
    cluster, work = Cluster(H100, 8, 2), Workload(seq_len=4096, global_batch=16)
    pins = {"tp": 1, "cp": 1, "pp": 1}
    free = search(QWEN, cluster, work, pins=pins, top=50)
    eps = {p.layout.ep for p in free}
    assert len(eps) > 1 and all(128 % ep == 0 and p.layout.dp_shard % ep == 0
                                for p in free for ep in [p.layout.ep])
    pinned = search(QWEN, cluster, work, pins={**pins, "ep": 4}, top=50)
    assert pinned and {p.layout.ep for p in pinned} == {4}


def test_cli_plans_an_moe_flavor_with_ep(capsys):
    assert plan_cli.main(["--model", "qwen3", "--flavor", "30B-A3B", "--num_gpus", "8",
                          "--ep", "8", "--seq_len", "4096", "--json"]) in (0, 1)
    result = json.loads(capsys.readouterr().out)
    assert result["layout"]["ep"] == 8 and result["step_breakdown_seconds"]["ep"] > 0
    assert plan_cli.main(["--model", "qwen3", "--flavor", "30B-A3B", "--num_gpus", "8",
                          "--ep", "4", "--seq_len", "4096"]) in (0, 1)
    out = capsys.readouterr().out
    assert "active per token: 128 routed experts top-8 in 48 MoE blocks" in out
    assert "ep 4" in out and "+ ep " in out


def test_seed_example_deepseek_v3_pre_training_cost():
    """DeepSeek-V3 671B on 2,048 H800 for 14.8T tokens at about 340 TFLOP/s per GPU (the
    rate its report implies: 6 x 37B x 14.8T = 3.3e24 FLOPs in 2.664M GPU-hours, 344 TFLOP/s)
    gives about 2.7M GPU-hours. Tolerance 3%: "about 340" carries +-1.5% (two significant
    figures), the published 37B active parameters are rounded from our exact 36.63B (1%)."""
    cluster = Cluster(GPUS["H800"], 8, 256)
    work = Workload(seq_len=4096, global_batch=15360, tokens=14.8e12)
    layout = Layout(pp=16, dp_shard=128, ep=64, ac="op", pp_schedule="DualPipeV")
    result = plan(V3, cluster, work, layout, mfu=340 / 989)
    assert 6 * V3.params_6nd * 14.8e12 == pytest.approx(3.3e24, rel=0.03)
    assert result.gpu_hours_6nd == pytest.approx(2.664e6, rel=0.03)
    # The trainer's layout rules accept it; with 1F1B and full AC it fits an 80 GB H800, and
    # EP 32 gathers twice the experts per GPU that EP 64 does.
    runs = dataclasses.replace(layout, pp_schedule="1F1B", ac="full")
    assert plan(V3, cluster, work, runs).fits
    more = plan(V3, cluster, work, dataclasses.replace(runs, ep=32)).memory
    assert more.total > plan(V3, cluster, work, runs).memory.total
