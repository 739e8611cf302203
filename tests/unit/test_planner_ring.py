"""Attention under context parallelism (tools/planner/ring.py) against hand-computed cases:
the steps' FLOPs, the load balancer, the traffic each rotate method exposes, the element-wise
merges, the working memory, and Llama 3's gathered-K/V variant; the CLI flags that set them.

Llama 3.1 8B: 32 layers, 32 heads x 128 = 4,096 query width, 8 KV heads (1,024), counted
attention 12 x 32 x 4,096 x s FLOPs per token (full scores, backward 2x: the MFU count).
"""

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
    LayoutError,
    ModelShape,
    Workload,
    estimate_step_time,
    validate_layout,
)
from torchtitan_like.tools.planner.ring import (
    attention_factor,
    merge_bytes,
    ring_shape,
    ring_time,
    ring_working_bytes,
)

M8B = ModelShape.from_args(llama3_flavors["8B"])
SEQ = 32768
WORK = Workload(seq_len=SEQ, global_batch=1)
CP4 = Layout(cp=4, dp_shard=1)


def test_a_balanced_step_is_a_cp_squared_th_of_the_causal_attention():
    """c = 8,192 tokens a rank; each step's forward is 2 b c^2 q = 2 x 8,192^2 x 4,096 FLOPs a
    layer, cp of them: 1/cp of the causal forward, 4 x 32,768^2 x 4,096 / 2 / 4."""
    ring = ring_shape(M8B, WORK, CP4)
    assert ring.step_forward_flops == pytest.approx(2 * 8192**2 * 4096)
    assert ring.steps * ring.step_forward_flops == pytest.approx(4 * SEQ**2 * 4096 / 2 / 4)
    # K and V of one chunk, repeated to every query head (bf16), and their fp32 gradients.
    assert ring.kv_bytes == 2 * 8192 * 4096 * 2
    assert ring.kv_grad_bytes == 2 * 8192 * 4096 * 4


def test_later_steps_at_the_ring_efficiency_and_the_unbalanced_last_rank():
    # Step 0 at the kernels' rate, the 3 later steps at half of it: (1 + 3 / 0.5) / 4.
    assert attention_factor(CP4, 0.5) == pytest.approx(7 / 4)
    # Without a balancer rank 3 computes three whole chunks and its causal one: (2cp - 1)/cp.
    unbalanced = Layout(cp=4, dp_shard=1, cp_load_balancer="none")
    assert attention_factor(unbalanced, 1.0) == pytest.approx(7 / 4)
    assert attention_factor(Layout(), 0.5) == 1.0
    assert attention_factor(Layout(cp=4, cp_algorithm="gathered_kv"), 0.5) == 1.0
    # In the step time: 1/cp of the single-GPU attention, times the factor.
    one = estimate_step_time(M8B, Cluster(GPUS["H100"], 1), WORK, Layout(), 1, [])
    four = estimate_step_time(M8B, Cluster(GPUS["H100"], 4), WORK, CP4, 1, [],
                              Calibration(ring_efficiency=0.5))
    assert four.attention == pytest.approx(one.attention / 4 * 7 / 4)


def _link(seconds_per_chunk: float) -> Comm:
    """A CP link over which one chunk's K/V takes ``seconds_per_chunk`` (no hop latency)."""
    chunk = ring_shape(M8B, WORK, CP4).kv_bytes
    return Comm("cp", 4, "intra-node", chunk / seconds_per_chunk / 1e9, 0.0)


def test_each_rotate_method_exposes_what_exceeds_the_compute_beside_it():
    """Seconds a step (the hop latencies, 5 us each, add about 1 ms over the ~200 transfers)."""
    ring = ring_shape(M8B, WORK, CP4)
    rate = ring.step_forward_flops  # one step's forward takes 1 s
    link = _link(0.5)  # a chunk's K/V 0.5 s, its fp32 gradients 1 s
    no_merges = 1e30  # HBM so fast the merges cost nothing
    # allgather: 3 chunks (1.5 s) against step 0 (1 s): 0.5 s per forward; in backward the
    # steps take 2.5 s: the gather hides, the gradients (1 s each) hide but the last one.
    t = ring_time(M8B, WORK, CP4, 1, rate, 1.0, link, no_merges)
    assert t.exposed == pytest.approx(32 * 0.5 + 32 * 1.0, abs=1e-2)
    full = Layout(cp=4, dp_shard=1, ac="full")  # the forward again in every block
    t = ring_time(M8B, WORK, full, 1, rate, 1.0, link, no_merges)
    assert t.exposed == pytest.approx(64 * 0.5 + 32 * 1.0, abs=1e-2)
    # alltoall: each chunk (0.5 s) against one step (1 s, or 2 s at ring efficiency 0.5):
    # hidden; a slower link (2 s a chunk): 3 x 1 s exposed a forward, 3 x (4 - 2.5) + 4 in
    # backward (the gradients: 4 s each against 2.5 s steps, the last one whole).
    alltoall = Layout(cp=4, dp_shard=1, cp_rotate_method="alltoall")
    assert ring_time(M8B, WORK, alltoall, 1, rate, 0.5, link, no_merges).exposed == \
        pytest.approx(32 * 1.0, abs=1e-2)  # only the last gradient transfer
    slow = ring_time(M8B, WORK, alltoall, 1, rate, 1.0, _link(2.0), no_merges)
    assert slow.exposed == pytest.approx(32 * 3 * 1.0 + 32 * (3 * 1.5 + 4.0), abs=1e-2)


def test_the_merges_count_torchs_element_wise_kernels():
    """CP 2, bf16 (cb 2): 1 concatenation of K and V (4 cb = 8 bytes per K/V element), 1
    merge of (36 + cb) = 38 bytes per output element, a cast each way (2 x 6); backward: the
    concatenation, 1 later step of 2 x ((8 + cb)/2 + 8) + 16 = 42 per K/V element and
    (8 + cb) = 10 per output element, step 0's 2 x 10 + 16 = 36 per K/V element and 10 per
    output element, fp32 zeros and final casts (4 + 4 + cb) = 10 per q, k and v element."""
    ring = ring_shape(M8B, WORK, Layout(cp=2, dp_shard=1))
    out, kv = ring.out_elements, ring.kv_elements
    forward, backward = merge_bytes(ring, 2)
    assert forward == pytest.approx(8 * kv + 38 * out + 12 * out)
    assert backward == pytest.approx(8 * kv + 42 * kv + 10 * out + 36 * kv + 10 * out
                                     + 10 * (out + 2 * kv))


def test_working_memory_of_the_ring_and_of_gathered_kv():
    ring = ring_shape(M8B, WORK, CP4)
    out, kv = ring.out_elements, ring.kv_elements
    allgather = 4 * ring.kv_bytes + 4 * (out + 2 * kv) + 2 * ring.kv_grad_bytes \
        + 2 * (out + 2 * kv)
    assert ring_working_bytes(M8B, WORK, CP4) == pytest.approx(allgather)
    alltoall = Layout(cp=4, dp_shard=1, cp_rotate_method="alltoall")
    assert ring_working_bytes(M8B, WORK, alltoall) == pytest.approx(
        allgather - 2 * ring.kv_bytes)
    # Llama 3's CP gathers the grouped K/V (1,024 wide, not 4,096) and reduce-scatters them.
    gathered = Layout(cp=4, dp_shard=1, cp_algorithm="gathered_kv")
    g = ring_shape(M8B, WORK, gathered)
    assert g.kv_bytes == 2 * 8192 * 1024 * 2
    assert ring_working_bytes(M8B, WORK, gathered) == pytest.approx(4 * 2 * g.kv_bytes)
    assert ring_working_bytes(M8B, WORK, Layout()) == 0


def test_cp_inputs_are_checked_and_reach_the_plan(capsys):
    cluster, work = Cluster(GPUS["H100"], 4), Workload(seq_len=SEQ, global_batch=1)
    with pytest.raises(LayoutError, match="gathered_kv"):
        validate_layout(M8B, Cluster(GPUS["H100"], 1), work, Layout(cp_algorithm="gathered_kv"))
    with pytest.raises(LayoutError, match="allgather or alltoall"):
        validate_layout(M8B, cluster, work, Layout(cp=4, cp_rotate_method="ring"))
    assert plan_cli.main(["--flavor", "8B", "--num_gpus", "4", "--cp", "4", "--seq_len", "32768",
                          "--global_batch", "1", "--ac", "full", "--cp_rotate_method",
                          "alltoall", "--cp_load_balancer", "none", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["layout"]["cp_rotate_method"], out["layout"]["cp_load_balancer"]) == \
        ("alltoall", "none")
    assert out["least_certain_term"]["name"] == "cp ring"


def test_a_bad_cp_flag_is_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        plan_cli.main(["--flavor", "8B", "--cp_algorithm", "bogus"])
    assert stop.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
