"""The planner's mixture-of-experts model (tools/planner/moe.py) against hand-computed cases:
total vs active parameters, GEMM time from the active ones, expert memory over EP, the EP
all-to-all volume and its link, its exposure, EP in the search (varied, and kept when pinned),
EP's start-up rules, the seed example (DeepSeek-V3 671B's pre-training cost), and the
activations of Qwen3's and DeepSeek's attention (tools/planner/attention.py) and of an MoE
block under op-level checkpointing, checked against what autograd saves on this CPU."""

import dataclasses
import json

import pytest
import torch

from torchtitan_like.models.deepseek_v3.args import DeepSeekV3Args, deepseek_v3_flavors
from torchtitan_like.models.deepseek_v3.model import MultiHeadLatentAttention
from torchtitan_like.models.deepseek_v3.model import rope_cache as deepseek_rope_cache
from torchtitan_like.models.llama3.model import rope_cache as llama_rope_cache
from torchtitan_like.models.moe import MoEArgs
from torchtitan_like.models.qwen3.args import Qwen3Args, qwen3_flavors
from torchtitan_like.models.qwen3.model import Qwen3Attention
from torchtitan_like.tools import plan_cli
from torchtitan_like.tools.planner import (
    CPU,
    GPUS,
    Calibration,
    Cluster,
    Comm,
    Layout,
    LayoutError,
    ModelShape,
    Workload,
    communication,
    estimate_step_time,
    layer_elements,
    plan,
    search,
)
from torchtitan_like.tools.planner import step_time as st
from torchtitan_like.tools.planner.attention import attention_elements, kernel_bytes, math_attention
from torchtitan_like.tools.planner.moe import expert_split, routed_forward_share

NO_MEMORY_BOUND = Calibration(eager_passes=0.0, compiled_passes=0.0)

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


def test_gemm_time_follows_the_active_parameters():
    work = Workload(seq_len=4096, global_batch=1)
    step = estimate_step_time(QWEN, Cluster(H100, 1), work, Layout(), 1, [], NO_MEMORY_BOUND)
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


def test_all_to_all_is_exposed_and_stretches_the_bubble():
    work, layout = Workload(seq_len=4096, global_batch=12), Layout(pp=4, dp_shard=1)
    cluster = Cluster(H100, 4)
    base = estimate_step_time(QWEN, cluster, work, layout, 12, [], NO_MEMORY_BOUND)
    a2a = Comm("ep", 4, "intra-node", 450, 450e9 * 0.5)
    step = estimate_step_time(QWEN, cluster, work, layout, 12, [a2a], NO_MEMORY_BOUND)
    assert step.ep == pytest.approx(0.5)
    assert step.bubble == pytest.approx((base.compute + 0.5) * (3 / 15) / (1 - 3 / 15))


def test_an_overlapping_schedule_hides_the_all_to_all_behind_compute():
    """``ep_overlapped`` (DeepSeek's DualPipe, a published run's input): the all-to-all costs
    only what exceeds the compute of the microbatch it overlaps, and the bubble no longer
    carries it."""
    work, cluster = Workload(seq_len=4096, global_batch=12), Cluster(H100, 4)
    layout = Layout(pp=4, dp_shard=1, ep_overlapped=True)
    base = estimate_step_time(QWEN, cluster, work, layout, 12, [], NO_MEMORY_BOUND)
    for seconds, exposed in ((0.5, 0.0), (base.compute + 0.25, 0.25)):
        a2a = Comm("ep", 4, "intra-node", 450, 450e9 * seconds)
        step = estimate_step_time(QWEN, cluster, work, layout, 12, [a2a], NO_MEMORY_BOUND)
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


# Attention activations per family (tools/planner/attention.py), hand-computed on small shapes.
SMALL_QWEN3 = Qwen3Args(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                        hidden_dim=128, vocab_size=256)
SMALL_MLA = DeepSeekV3Args(
    dim=64, n_layers=2, n_dense_layers=0, n_heads=2, vocab_size=256, inter_dim=128,
    moe_inter_dim=32, moe=MoEArgs(num_experts=4, top_k=2, num_shared_experts=1),
    q_lora_rank=16, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=8,
    rope_scaling=None)


def test_qwen3_counts_its_per_head_q_and_k_norms():
    """h 64, q = 4 x 16 = 64, kv = 2 x 16 = 32, f 128. Without AC: two norms (input, output;
    + the normalised tensor on CPU), q/k/v/out 4q, the q/k norms' inputs (+ normalised on
    CPU) q + kv, SwiGLU 4f; under op SAC the norms are recomputed: Llama's count."""
    m = ModelShape.from_args(SMALL_QWEN3)
    assert m.qk_norm and m.latent is None
    assert attention_elements(m, "none", 1, fused_norm=True) == 4 * 64 + (64 + 32)
    assert attention_elements(m, "none", 1, fused_norm=False) == 4 * 64 + 2 * (64 + 32)
    assert attention_elements(m, "none", 2, fused_norm=True) == (4 * 64 + 64 + 32) / 2
    assert layer_elements(m, "none", 1, fused_norm=True) == 2 * (64 + 64) + 352 + 4 * 128
    assert layer_elements(m, "none", 1, fused_norm=False) == 2 * (128 + 64) + 448 + 4 * 128
    assert layer_elements(m, "op", 1, fused_norm=False) == 64 + (64 + 64) + 64 + 128 + 256
    plain = dataclasses.replace(m, qk_norm=False)  # Llama's block of the same shape
    assert layer_elements(m, "none", 1, True) - layer_elements(plain, "none", 1, True) == 96
    assert layer_elements(m, "op", 1, True) == layer_elements(plain, "op", 1, True)


def test_latent_attention_counts_its_latents_and_value_heads():
    """r_q 16, r_kv 32, RoPE 8, nope 16 (d_qk 24), d_v 8, 2 heads. Fused (GPU): latents
    (2 + c)(r_q + r_kv) + r_rope = 104, kernel h (2 d_qk + (d_nope + d_v) + d_v) = 160; CPU
    (c = 1, math path: d_v != d_qk): 152 + h (2 d_qk + 2 d_v) = 128, and the probabilities
    h x seq fp32 beside; op SAC: r_q + r_kv + r_rope + h (d_qk + d_nope + d_v + d_v) = 168."""
    m = ModelShape.from_args(SMALL_MLA)
    assert math_attention(m, CPU) and not math_attention(m, GPUS["H100"])
    assert attention_elements(m, "none", 1, fused_norm=True) == 104 + 160
    assert attention_elements(m, "none", 2, fused_norm=True) == 104 + 160 / 2
    assert attention_elements(m, "none", 1, fused_norm=False, math=True) == 152 + 128
    assert attention_elements(m, "op", 1, fused_norm=True) == 56 + 112
    assert kernel_bytes(m, 512, 1) == 4 * 2 and kernel_bytes(m, 512, 1, math=True) == 4 * 2 * 512
    # The block (MoE, 1 shared expert, f = 3 x 32): norms 2 x 2h, SwiGLU 4f, routed 2 top_k h;
    # op SAC keeps wo's and the shared expert's w2 output (2h) and its w1/w3 outputs only.
    assert layer_elements(m, "none", 1, fused_norm=True) == 256 + 264 + 384 + 256
    assert layer_elements(m, "op", 1, fused_norm=True) == 64 + 168 + 128 + 2 * 32


def test_moe_without_shared_experts_keeps_no_expert_tensors_under_op_sac():
    """Qwen3-MoE under op SAC: the routed experts' grouped GEMMs are recomputed and the
    block's output is the combine (no w2 output kept): block input, attention, wo output."""
    m = ModelShape.from_args(qwen3_flavors["debugmodel_moe"])
    assert layer_elements(m, "op", 1, fused_norm=True) == 128 + (256 + 2 * 128 + 256) + 128


def _saved_elements_per_token(module, x, rope) -> float:
    """Elements (fp32) per token of the tensors autograd saves in ``module``'s forward,
    parameters and buffers aside, each storage once (a view keeps its whole storage)."""
    own = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers(), rope]}
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x, rope)
    return sum(saved.values()) / 4 / (x.shape[0] * x.shape[1])


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3", "deepseek_v3 q_lora"])
def test_attention_count_is_what_autograd_saves_on_cpu(family):
    """The debug flavors' attention on this CPU (fp32, composite RMSNorm; MLA's math path):
    autograd saves the attention's input (counted with the norms), the planner's count, the
    kernel's logsumexp or probabilities, and one fp32 rstd per normalised row."""
    seq = 8
    if family == "qwen3":
        args = qwen3_flavors["debugmodel"]
        module = Qwen3Attention(args)
        rope = llama_rope_cache(args.head_dim, seq, args.rope_theta, None)
        rstd_rows = args.n_heads + args.n_kv_heads
    else:
        args = dataclasses.replace(deepseek_v3_flavors["debugmodel"], max_seq_len=seq,
                                   q_lora_rank=16 if "q_lora" in family else 0)
        module, rope = MultiHeadLatentAttention(args), deepseek_rope_cache(args)
        rstd_rows = 1 + bool(args.q_lora_rank)
    m = ModelShape.from_args(args)
    x = torch.randn(2, seq, args.dim, requires_grad=True)
    math = math_attention(m, CPU)
    planned = (args.dim + attention_elements(m, "none", 1, fused_norm=False, math=math)
               + kernel_bytes(m, seq, 1, math) / 4 + rstd_rows)
    assert _saved_elements_per_token(module, x, rope) == planned


def test_op_sac_recomputes_the_routed_experts():
    """Op-level SAC keeps no routed-expert tensor, so backward reruns their grouped GEMMs: one
    forward, 2 x 58 MoE layers x top-8 x 3 x 7168 x 2048 FLOPs per token, a share of the
    6 FLOPs per active weight the GEMM time is made of."""
    share = 2 * 58 * 8 * 3 * 7168 * 2048 / (6 * V3.active_params)
    assert routed_forward_share(V3) == pytest.approx(share)
    assert routed_forward_share(ModelShape.from_args(SMALL_QWEN3)) == 0.0
    work, cluster = Workload(seq_len=4096, global_batch=8), Cluster(H100, 1)
    gemm, _, _, recompute = st.compute_times(V3, cluster, work, Layout(dp_shard=8, ac="op"),
                                         NO_MEMORY_BOUND)
    assert recompute == pytest.approx(gemm * share)
