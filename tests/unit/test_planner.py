"""The planner's formulas, its seed worked examples, and its command line.

Shapes and counts are checked against what PyTorch really keeps: the per-block activation
count against MemTracker on a tiny block (CPU, composite RMSNorm), the rest against the papers'
formulas. The seed examples are the issue's: 70B on 15T tokens at 40% MFU on H100 costs about
4.4M GPU-hours (6ND); 70B at TP=8 alone needs further sharding to fit 80 GB; the Llama 3 405B
8K layout (TP 8, PP 16, DP 128 on 16,384 GPUs) fits.
"""

import dataclasses
import itertools
import json

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from torchtitan_like.config.job_config import ActivationCheckpoint
from torchtitan_like.config.manager import build_job_config
from torchtitan_like.distributed.activation_checkpoint import apply_ac
from torchtitan_like.models.llama3.args import llama3_flavors
from torchtitan_like.models.llama3.model import Transformer
from torchtitan_like.tools import plan_cli
from torchtitan_like.tools.planner import (
    GPUS,
    Cluster,
    Layout,
    LayoutError,
    ModelShape,
    Workload,
    bubble_fraction,
    communication,
    from_job_config,
    in_flight_peak,
    korthikanti_layer_bytes,
    layer_elements,
    plan,
    plan_fitting,
    rank_stages,
    ring_volume,
    schedule_order,
    search,
    stage_memory,
    stage_split,
)
from torchtitan_like.tools.planner.optimizer import newton_schulz_flops, orthogonalization_seconds

GiB = 2**30
H100 = GPUS["H100"]


def shape(flavor: str) -> ModelShape:
    return ModelShape.from_args(llama3_flavors[flavor])


# ------------------------------------------------------------------------------- formulas


def test_korthikanti_table_2():
    # GPT-3 175B shapes: s 2048, h 12288, a 96 -> 5as/h = 80.
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    assert korthikanti_layer_bytes(s, b, h, a) == pytest.approx(sbh * (34 + 80))
    assert korthikanti_layer_bytes(s, b, h, a, ac="selective") == pytest.approx(34 * sbh)
    assert korthikanti_layer_bytes(s, b, h, a, ac="full") == pytest.approx(2 * sbh)
    assert korthikanti_layer_bytes(s, b, h, a, tp=8) == pytest.approx(sbh * 114 / 8)
    assert korthikanti_layer_bytes(s, b, h, a, tp=8, sequence_parallel=False) == \
        pytest.approx(sbh * (10 + (24 + 80) / 8))
    assert korthikanti_layer_bytes(s, b, h, a, ac="selective", tp=8, cp=2) == \
        pytest.approx(34 * sbh / 16)


@pytest.mark.parametrize("mode,option,ac", [("none", "op", "none"), ("selective", "op", "op"),
                                            ("full", "op", "full")])
def test_layer_count_matches_memtracker(mode, option, ac):
    """Bytes a tiny block keeps after its forward (input included, output excluded) equal
    the planner's count: composite RMSNorm on CPU, fp32, grouped-query attention."""
    args = dataclasses.replace(llama3_flavors["tiny"], max_seq_len=64)
    model = Transformer(args)
    apply_ac(model.layers, ActivationCheckpoint(mode=mode, selective_ac_option=option))
    b, s = 4, 64
    x = torch.randn(b, s, args.dim, requires_grad=True)
    tracker = MemTracker()
    tracker.track_external(model, x)
    with tracker:
        before = tracker.get_tracker_snapshot()[torch.device("cpu")]["Total"]
        y = model.layers["0"](x, model.rope_cache)
        after = tracker.get_tracker_snapshot()[torch.device("cpu")]["Total"]
    kept = after - before - y.numel() * 4 + x.numel() * 4
    m = shape("tiny")
    lse = 0 if ac == "full" else 4 * m.n_heads * b * s
    predicted = layer_elements(m, ac, tp=1, fused_norm=False) * 4 * b * s + lse
    assert kept == pytest.approx(predicted, rel=0.01)


def test_layer_count_sequence_parallel():
    m = shape("70B")  # h 8192, q 8192, kv 1024, f 28672
    h, f = 8192, 28672
    # Fused norms keep their input (sharded); the gathered matmul inputs stay full length.
    assert layer_elements(m, "none", 8, fused_norm=True) == \
        pytest.approx(2 * (h / 8 + h) + 4 * h / 8 + 4 * f / 8)
    assert layer_elements(m, "full", 8, fused_norm=True) == pytest.approx(h / 8)
    assert layer_elements(m, "none", 1, fused_norm=True) == pytest.approx(8 * h + 4 * f)


def test_bubble_and_pipeline_schedules():
    assert bubble_fraction(1, 8) == 0
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert bubble_fraction(4, 12, "Interleaved1F1B", 2) == pytest.approx(3 / 27)
    # Stages are cut as the trainer cuts them: the embedding and the head weigh a block each.
    assert stage_split(126, Layout(pp=16)) == [7] + [8] * 14 + [7]
    one_f_one_b = Layout(pp=4)
    assert schedule_order(one_f_one_b, 2, 4) == [("F", 0), ("F", 0), ("B", 0), ("F", 0),
                                                 ("B", 0), ("F", 0), ("B", 0), ("B", 0)]
    # 1F1B: rank r holds at most pp - r microbatches, whatever m; GPipe all m.
    assert [in_flight_peak(one_f_one_b, r, 12) for r in range(4)] == [[4], [3], [2], [1]]
    gpipe = dataclasses.replace(one_f_one_b, pp_schedule="GPipe")
    assert in_flight_peak(gpipe, 0, 12) == [12]
    # Interleaved, v = 2: rank r holds stages r and r + pp, at most (v - 1) pp + 2 (pp - 1 - r)
    # + 1 model chunks when m is a multiple of pp (Narayanan et al.), torch's warm-up + 1.
    interleaved = dataclasses.replace(one_f_one_b, pp_schedule="Interleaved1F1B")
    assert rank_stages(interleaved, 1) == [1, 5]
    assert sum(in_flight_peak(interleaved, 0, 12)) == 4 + 6 + 1
    assert sum(in_flight_peak(interleaved, 3, 12)) == 4 + 0 + 1
    order = schedule_order(interleaved, 3, 8)
    assert order[:5] == [("F", 0)] * 4 + [("F", 1)] and order[5] == ("B", 1)
    assert sorted(order) == sorted([("F", 0), ("F", 1), ("B", 0), ("B", 1)] * 8)


def test_pipeline_rank_memory_follows_the_schedule():
    """Under 1F1B rank r holds pp - r microbatches; every rank keeps one receive buffer per
    microbatch and edge; pipelined FSDP accumulates unsharded fp32 gradients."""
    m, work = shape("8B"), Workload(seq_len=4096, global_batch=32)  # 16 microbatches
    # Weightless embedding and head: 4 blocks per stage, so only the schedule differs.
    layout = Layout(pp=8, dp_shard=2, pp_embedding_weight=0, pp_output_weight=0)
    assert stage_split(32, layout) == [4] * 8
    ranks = [stage_memory(m, H100, work, layout, s, 16) for s in range(7)]
    held = [mem.activations for mem in ranks]
    assert held == sorted(held, reverse=True)
    # The middle ranks differ by one microbatch of 4 blocks each.
    microbatch = held[1] - held[2]
    assert all(held[r] - held[r + 1] == pytest.approx(microbatch) for r in range(1, 6))
    edge = m.dim * 2 * 4096  # bf16 hidden states of one sequence
    assert held[6] > 2 * 16 * edge + 2 * microbatch  # buffers, 2 microbatches in flight
    assert ranks[1].gradients == pytest.approx(4 * m.block_params * 4)  # unsharded fp32
    result = plan(m, Cluster(H100, 8, 2), work, layout)
    assert result.memory.total == max(result.stage_totals) and len(result.stage_totals) == 8


def test_communication_volumes_and_links():
    m = shape("8B")
    cluster = Cluster(H100, gpus_per_node=8, num_nodes=2)
    work = Workload(seq_len=4096, global_batch=16)
    layout = Layout(tp=8, dp_shard=2)
    comms = {c.dim: c for c in communication(m, cluster, work, layout, microbatches=8)}
    assert comms["tp"].link == "intra-node" and comms["fsdp"].link == "inter-node"
    sbh = 4096 * m.dim * 2
    assert comms["tp"].bytes_per_step == pytest.approx(8 * 32 * 8 * ring_volume(8, sbh))
    local = (32 * m.block_params + m.embedding_params + m.head_params) / 8  # every unit
    # 8 microbatches, each gathering twice (bf16) and reduce-scattering once (fp32).
    assert comms["fsdp"].bytes_per_step == pytest.approx(ring_volume(2, local * 8 * (4 + 4)))
    assert ring_volume(4, 100.0) == 75.0


# ------------------------------------------------------------------------- seed examples


def test_70b_on_15t_tokens_costs_about_4_4m_gpu_hours():
    result = plan(shape("70B"), Cluster(H100, 8, 64),
                  Workload(seq_len=8192, global_batch=512, tokens=15e12),
                  Layout(dp_shard=512, ac="full"), mfu=0.40)
    assert H100.peak_tflops == 989
    assert result.gpu_hours_6nd == pytest.approx(4.4e6, rel=0.02)
    # With attention (the trainer's MFU count), the same MFU costs flops_per_token / 6N more.
    ratio = shape("70B").flops_per_token(8192) / (6 * shape("70B").num_params)
    assert result.gpu_hours == pytest.approx(result.gpu_hours_6nd * ratio)
    assert result.days == pytest.approx(result.gpu_hours / 512 / 24)


def test_70b_tensor_parallel_8_alone_does_not_fit():
    m, work = shape("70B"), Workload(seq_len=8192, global_batch=8)
    alone = plan_fitting(m, Cluster(H100, 8, 1), work, Layout(tp=8, ac="auto"))
    assert not alone.fits
    states = alone.memory.parameters + alone.memory.gradients + alone.memory.optimizer
    assert states > 80e9  # 16 bytes x 70.6B / 8 before any activation
    sharded = plan_fitting(m, Cluster(H100, 8, 8), Workload(seq_len=8192, global_batch=64),
                           Layout(tp=8, dp_shard=8, ac="auto"))
    assert sharded.fits


def test_llama3_405b_8k_layout_fits():
    result = plan_fitting(shape("405B"), Cluster(H100, 8, 2048),
                          Workload(seq_len=8192, global_batch=2048, tokens=15.6e12),
                          Layout(tp=8, pp=16, dp_shard=128, ac="auto"))
    assert result.fits
    assert result.microbatches == 16 and len(result.stage_totals) == 16
    assert result.bubble == pytest.approx(15 / 31)
    assert {c.dim: c.link for c in result.comms} == {
        "tp": "intra-node", "fsdp": "inter-node", "pp": "inter-node"}


# ---------------------------------------------------------------------- layouts and search


def test_invalid_layouts_explain_themselves():
    m, cluster = shape("8B"), Cluster(H100, 8, 1)
    work = Workload(seq_len=4096, global_batch=8)
    # The trainer's own rules and messages (distributed/layout_rules.py).
    with pytest.raises(LayoutError, match=r"n_heads = 32 is not divisible by .*degree = 3"):
        plan(m, Cluster(H100, 3, 1), Workload(seq_len=4095, global_batch=8), Layout(tp=3))
    with pytest.raises(LayoutError, match="uses 4 GPUs, the cluster has 8"):
        plan(m, cluster, work, Layout(dp_shard=4))
    with pytest.raises(LayoutError, match="must be a multiple of local_batch_size x data-par"):
        plan(m, cluster, Workload(seq_len=4096, global_batch=12), Layout(dp_shard=8))
    with pytest.raises(LayoutError, match="needs at least as many microbatches as stages"):
        plan(m, cluster, Workload(seq_len=4096, global_batch=2), Layout(pp=4, dp_shard=2))
    with pytest.raises(ValueError, match="use none, op, full or a number"):
        plan(m, cluster, work, Layout(dp_shard=8, ac="sometimes"))


def test_search_ranks_fitting_layouts():
    plans = search(shape("8B"), Cluster(H100, 8, 4), Workload(seq_len=8192, global_batch=64),
                   top=4)
    assert 1 <= len(plans) <= 4
    assert all(p.fits and p.layout.tp <= 8 and p.layout.num_gpus == 32 for p in plans)
    # Fastest first, except that a simpler layout within 3% may go ahead.
    for a, b in itertools.pairwise(plans):
        assert a.step_seconds <= b.step_seconds * 1.03 + 1e-9


def test_from_job_config_reads_the_debug_config():
    config = build_job_config(["--job.config_file", "train_configs/debug_model.toml",
                               "--activation_checkpoint.mode", "selective",
                               "--activation_checkpoint.selective_ac_option", "2"])
    model, work, layout = from_job_config(config, 2)
    assert model.n_layers == 6 and model.dim == 256
    assert (work.seq_len, work.global_batch) == (256, 16)
    assert work.precision.compute_bytes == 4  # the debug config computes in fp32
    assert (layout.dp_shard, layout.local_batch_size, layout.ac) == (2, 8, "2")


def test_from_job_config_counts_replica_groups_as_dp_replicate(monkeypatch):
    """[fault_tolerance] group_size groups share --num_gpus: planned as HSDP's dp_replicate,
    the global batch split over every group's ranks (validate.grad_accumulation_steps)."""
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://localhost:29510")
    ft = ["--fault_tolerance.enable", "true", "--fault_tolerance.group_size", "2"]
    config = build_job_config(["--job.config_file", "train_configs/debug_model.toml", *ft,
                               "--training.global_batch_size", "32"])
    _, work, layout = from_job_config(config, 4)
    assert (layout.dp_replicate, layout.dp_shard, work.global_batch) == (2, 2, 32)
    hsdp = build_job_config(["--job.config_file", "train_configs/debug_model.toml",
                             "--parallelism.data_parallel_replicate_degree", "2",
                             "--training.global_batch_size", "32"])
    assert from_job_config(hsdp, 4)[2] == layout
    with pytest.raises(LayoutError, match="group_size = 2"):
        from_job_config(config, 3)


def test_bf16_moments_count_2_plus_2_bytes_per_parameter():
    """[optimizer] state_dtype = "bfloat16": Adam's two states at 2 bytes each, not 4."""
    fp32, bf16 = (from_job_config(build_job_config(
        ["--job.config_file", "train_configs/debug_model.toml", *flags]), 2)
        for flags in ([], ["--optimizer.state_dtype", "bfloat16"]))
    assert bf16[1].precision.optimizer_state_bytes == 2
    assert fp32[1].precision.optimizer_state_bytes == 4
    memories = [stage_memory(m, H100, work, layout, 0, 1) for m, work, layout in (fp32, bf16)]
    assert memories[1].optimizer == pytest.approx(memories[0].optimizer / 2)
    assert memories[1].parameters == memories[0].parameters


def test_muon_keeps_one_state_per_matrix_element_and_pays_its_iterations():
    """[optimizer] name = "Muon": one fp32 momentum per element of the blocks' matrices (not
    Adam's two moments), AdamW's two on the embedding and head; the Newton-Schulz time
    (k (4 a^2 b + 2 a^3) FLOPs per a x b matrix, a <= b) split over the dp_shard x tp owners
    and the owners' traffic, added to the step's ``optimizer`` part beside the element-wise
    step both optimizers pay (overheads.py)."""
    argv = ["--model.flavor=8B", "--training.seq_len=8192", "--training.local_batch_size=1",
            "--parallelism.tensor_parallel_degree=8"]
    adamw, muon = (from_job_config(build_job_config([*argv, *flags]), 64)
                   for flags in ([], ["--optimizer.name=Muon"]))
    m, work, layout = muon
    assert (work.optimizer.matrix_states, work.optimizer.other_states) == (1, 2)
    cluster = Cluster(H100, 8, 8)
    plans = [plan(*inputs[:1], cluster, *inputs[1:]) for inputs in (adamw, muon)]
    blocks = m.n_layers * m.block_params / (layout.tp * layout.fsdp_degree)
    assert plans[0].memory.optimizer - plans[1].memory.optimizer == pytest.approx(4 * blocks)
    extra = plans[1].step.optimizer - plans[0].step.optimizer
    assert plans[0].step.optimizer > 0  # AdamW's element-wise step, counted for both
    kv = m.kv_heads * m.head_dim
    flops = 5 * (6 * m.dim**3 * 2 + 2 * (4 * kv**2 * m.dim + 2 * kv**3)
                 + 3 * (4 * m.dim**2 * m.ffn_hidden_dim + 2 * m.dim**3))
    compute = m.n_layers * flops / 64 / (H100.peak_tflops * 1e12 * H100.gemm_efficiency)
    assert compute < extra < 2 * compute  # the traffic on NVLink/IB: less


def test_muons_iteration_runs_at_a_profiles_measured_rate_in_its_dtype():
    """A hardware profile's measured matmul rate in the iteration's dtype prices Newton-Schulz
    (hardware.gemm_rate, as the step's matmuls), not the preset's peak: the same single-owner
    plan at half the rate pays twice the iteration."""
    argv = ["--model.flavor=debugmodel", "--optimizer.name=Muon", "--muon.ns_dtype=float32"]
    m, work, layout = from_job_config(build_job_config(argv), 1)
    times = [orthogonalization_seconds(m, Cluster(dataclasses.replace(
        H100, gemm_tflops_by_dtype=(("float32", tflops),)), 1, 1), work, layout)
        for tflops in (2.0, 1.0)]
    assert times[1] == pytest.approx(2 * times[0])
    flops = m.n_layers * newton_schulz_flops(m, work.optimizer.newton_schulz_steps)
    assert times[0] == pytest.approx(flops / 2e12)


def test_from_job_config_reads_the_pipeline_and_tp_fields():
    config = build_job_config([
        "--job.config_file", "train_configs/debug_model.toml",
        "--parallelism.pipeline_parallel_degree", "2",
        "--parallelism.pipeline_parallel_schedule", "LoopedBFS",
        "--parallelism.pipeline_parallel_microbatch_size", "2",
        "--parallelism.pipeline_parallel_embedding_weight", "0.5",
        "--parallelism.tensor_parallel_degree", "2",
        "--parallelism.disable_loss_parallel", "true"])
    _, work, layout = from_job_config(config, 4)
    assert (layout.pp, layout.tp, layout.loss_parallel) == (2, 2, False)
    # Multi-stage schedules are modelled as interleaved 1F1B with their stages per rank.
    assert (layout.modelled_schedule, layout.stages_per_rank) == ("Interleaved1F1B", 2)
    assert layout.pp_schedule == "LoopedBFS"  # the trainer's rules see the real schedule
    # A step of 8 sequences: one schedule step of 4 microbatches of 2.
    assert (layout.local_batch_size, layout.pp_microbatches, work.global_batch) == (2, 4, 8)
    assert layout.pp_embedding_weight == 0.5


# -------------------------------------------------------------------------- command line


def test_cli_prints_breakdown_verdict_and_gpu_hours(capsys):
    code = plan_cli.main(["--flavor", "70B", "--gpu", "H100", "--num_gpus", "512",
                          "--seq_len", "8192", "--tokens", "15e12", "--mfu", "0.40"])
    out = capsys.readouterr().out
    assert code == 0
    for needle in ("parameters", "gradients", "optimizer states", "activations",
                   "Verdict: FITS", "GPU-hours: 4.46M (6ND)"):
        assert needle in out, needle


def test_cli_json_and_search(capsys):
    assert plan_cli.main(["--flavor", "8B", "--num_gpus", "8", "--seq_len", "4096",
                          "--tp", "2", "--ac", "full", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["layout"]["tp"] == 2 and data["layout"]["dp_shard"] == 4
    assert set(data["memory_gib"]) >= {"parameters", "gradients", "optimizer", "activations"}
    assert plan_cli.main(["--flavor", "8B", "--num_gpus", "16", "--search", "--top", "3",
                          "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)
    assert 1 <= len(ranked) <= 3 and all(p["fits"] for p in ranked)


def test_cli_plans_a_config_on_the_gpus_it_implies(capsys, monkeypatch):
    """--config: the GPUs its degrees multiply to, else NPROC (or NGPU) x NNODES as
    run_train.sh would launch it, else one node; --num_gpus says otherwise (FSDP then takes
    the rest of it, as data_parallel_shard_degree = -1)."""
    for name in ("NPROC", "NGPU", "NNODES"):
        monkeypatch.delenv(name, raising=False)

    def planned(*argv: str) -> tuple[int, dict]:
        code = plan_cli.main([*argv, "--json"])
        return code, json.loads(capsys.readouterr().out)["layout"]

    code, layout = planned("--config", "train_configs/llama3_70b.toml")
    assert code == 0 and (layout["tp"], layout["dp_shard"]) == (8, 8)  # fits: 64 GPUs
    assert planned("--config", "train_configs/llama3_70b.toml", "--num_gpus", "128")[1][
        "dp_shard"] == 16
    assert planned("--config", "train_configs/debug_model.toml")[1]["dp_shard"] == 8
    monkeypatch.setenv("NGPU", "2")
    monkeypatch.setenv("NNODES", "2")
    assert planned("--config", "train_configs/debug_model.toml")[1]["dp_shard"] == 4
    assert plan_cli.main(["--config", "train_configs/debug_model.toml"]) == 0
    assert "Cluster: 4 x H100 SXM 80GB (1 node(s) of 4: NPROC x NNODES;" in \
        capsys.readouterr().out
    monkeypatch.setenv("NNODES", "0")
    assert plan_cli.main(["--config", "train_configs/debug_model.toml"]) == 2
    assert "NNODES=0: the number of nodes must be" in capsys.readouterr().err


def test_cli_errors(capsys):
    assert plan_cli.main(["--num_gpus", "8"]) == 2
    assert "--flavor" in capsys.readouterr().err
    assert plan_cli.main(["--flavor", "8B", "--num_gpus", "8", "--tp", "3"]) == 2
    assert "do not divide" in capsys.readouterr().err


def test_cli_prints_its_expected_error_and_least_certain_term(capsys):
    """The band is the held-out ratios of the published runs using the layout's parallel
    dimensions (all of them for plain FSDP), applied to the prediction; a layout beyond the
    published CP runs names its CP term as not validated."""
    from torchtitan_like.tools.planner.heldout_record import HELD_OUT

    assert plan_cli.main(["--flavor", "70B", "--num_gpus", "512", "--seq_len", "8192",
                          "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ratios = [ratio for ratio, _, _ in HELD_OUT.values()]
    band = data["expected_error"]
    assert (band["held_out_ratio_low"], band["held_out_ratio_high"]) == (min(ratios),
                                                                         max(ratios))
    tps = data["tokens_per_second_per_gpu"]
    assert band["tokens_per_second_per_gpu"] == pytest.approx([tps / max(ratios),
                                                               tps / min(ratios)])
    assert plan_cli.main(["--flavor", "8B", "--num_gpus", "16", "--cp", "16", "--seq_len",
                          "1048576", "--global_batch", "1", "--ac", "full"]) in (0, 1)
    out = capsys.readouterr().out
    assert "Expected error:" in out and "published runs using cp" in out
    assert "Least certain term: cp ring" in out and "not validated: beyond the published" in out


def test_cli_takes_the_published_runs_policies(capsys):
    """Each policy a published row carries is a flag too, reaching the planned layout, and
    refused where it would mean nothing."""
    assert plan_cli.main(["--flavor", "8B", "--num_gpus", "8", "--ac", "op",
                          "--op_sac_every_other_matmul", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layout"]["op_sac_every_other_matmul"]
    assert plan_cli.main(["--flavor", "8B", "--num_gpus", "8", "--ac", "full",
                          "--op_sac_every_other_matmul"]) == 2
    assert "needs ac op" in capsys.readouterr().err
    assert plan_cli.main(["--flavor", "405B", "--num_gpus", "512", "--tp", "8", "--pp", "8",
                          "--pp_schedule", "Interleaved1F1B", "--pp_virtual_stages", "4",
                          "--pp_microbatches", "16", "--local_batch_size", "2",
                          "--global_batch", "256", "--ac", "full", "--pp_reduce_before_send",
                          "--json"]) in (0, 1)
    layout = json.loads(capsys.readouterr().out)["layout"]
    assert (layout["pp_virtual_stages"], layout["pp_microbatches"],
            layout["pp_reduce_before_send"]) == (4, 16, True)
