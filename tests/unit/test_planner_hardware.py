"""A hardware profile (tools/planner/hardware.py): its format round-trips into the GPU the
planner runs on, a bad file is refused in one line, and every term that has a measured rate
uses it: the gemm term at the compute dtype's measured matmul rate, the attention term at the
rate measured nearest the job's sequence length, each collective at its own kind's curve
(``ttl-plan --hardware``, ``ttl-ablate --hardware``). A verify run's pace is set against the
profile's, and a run off that pace is flagged and left out of the planner's error on its
history (tools/pace.py, tools/verify.py). The measuring itself runs in
tests/e2e/test_plan_calibrate_verify.py."""

import dataclasses
import json
from pathlib import Path

import pytest

from torchtitan_like.models.llama3.args import llama3_flavors
from torchtitan_like.tools import plan_cli
from torchtitan_like.tools.ablate import load_sweep
from torchtitan_like.tools.pace import PROBED_BY, pace_lines, pace_ratios, paced, step_shift
from torchtitan_like.tools.planner import (
    CPU,
    Cluster,
    Layout,
    ModelShape,
    Precision,
    Workload,
    communication,
    plan,
)
from torchtitan_like.tools.planner.hardware import (
    FORMAT,
    gpu_from_dict,
    gpu_to_dict,
    load_profile,
    write_profile,
)
from torchtitan_like.tools.planner.inputs import LayoutError
from torchtitan_like.tools.planner.links import rate_at
from torchtitan_like.tools.planner.step_time import StepTime
from torchtitan_like.tools.verify import append_history, history_lines

ROOT = Path(__file__).resolve().parents[2]
CURVE = ((2.0**16, 0.5), (2.0**24, 1.0))
MEASURED = dataclasses.replace(
    CPU, name="measured CPU", peak_tflops=2.0, hbm_tbps=0.05,
    gemm_tflops_by_dtype=(("float32", 0.2), ("bfloat16", 1.0)),
    attention_tflops_by_seq=((512.0, 0.05), (1024.0, 0.1)),
    collective_gbps=(("all_gather/intra", CURVE),
                     ("reduce_scatter/intra", tuple((b, r / 2) for b, r in CURVE))))


PACE = {"matmul_tflops": [0.10, 0.102], "dispatch_us": [2.0, 2.0]}


def _profile(tmp_path: Path, gpu=MEASURED) -> Path:
    path = tmp_path / "profile.json"
    write_profile(path, {"date": "2026-12-04T12:00:00+00:00", "host": {"torch": "2.13.0"},
                         "processes": {"world_size": 2, "per_node": 2, "nodes": 1},
                         "gpu": gpu_to_dict(gpu), "pace": PACE})
    return path


def test_a_profile_round_trips_into_the_same_gpu(tmp_path):
    profile = load_profile(_profile(tmp_path))
    assert profile.gpu == MEASURED and profile.gpus_per_node == 2 and profile.pace == PACE
    assert json.loads((tmp_path / "profile.json").read_text())["format"] == FORMAT
    assert "measured 2026-12-04 (torch 2.13.0)" in profile.describe()


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(format="x"), "not a ttl-hardware-profile/1 file"),
    (lambda d: d["gpu"].update(speed=1), "unknown gpu field(s) speed"),
    (lambda d: d["gpu"].update(attention_tflops_by_seq=[[2, 1], [1, 1]]), "must ascend"),
    (lambda d: d.pop("host"), "no 'host'"),
    (lambda d: d.update(pace={"matmul_tflops": [0.0]}), "pace must map"),
])
def test_a_bad_profile_is_refused_in_one_line(tmp_path, capsys, edit, message):
    path = _profile(tmp_path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_profile(path)
    assert plan_cli.main(["--flavor", "debugmodel", "--hardware", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plan error: hardware profile") and err.count("\n") == 1


def test_measured_rates_replace_the_presets():
    m = ModelShape.from_args(llama3_flavors["debugmodel"])
    work = Workload(seq_len=1024, global_batch=2, precision=Precision(compute_bytes=4))
    layout = Layout(dp_shard=2, local_batch_size=1)
    step = plan(m, Cluster(MEASURED, gpus_per_node=2), work, layout).step
    tokens = 1024  # per GPU
    assert step.gemm == pytest.approx(tokens * m.flops_per_token(0) / 0.2e12)  # fp32's rate
    forward = tokens * m.attention_flops_per_token(1024) / 6
    assert step.attention == pytest.approx(forward * 3.5 / 0.1e12)
    bf16 = dataclasses.replace(work, precision=Precision(compute_bytes=2))
    assert plan(m, Cluster(MEASURED, gpus_per_node=2), bf16, layout).step.gemm == \
        pytest.approx(step.gemm / 5)
    (fsdp,) = communication(m, Cluster(MEASURED, gpus_per_node=2), work, layout, 1)
    # reshard: two gathers of every parameter and one reduction, each at its own curve's
    # rate for its message (a unit's shard), the seconds summed
    params = m.num_params  # every unit: the blocks, the embedding, the head
    gather, reduce = 2 * params * 4 / 2, params * 4 / 2
    seconds = fsdp.bytes_per_step / fsdp.bandwidth_gbps / 1e9
    assert fsdp.bytes_per_step == pytest.approx(gather + reduce)
    block_shard = m.block_params * 4 / 2
    assert seconds == pytest.approx(gather / (rate_at(CURVE, block_shard) * 1e9)
                                    + reduce / (rate_at(CURVE, block_shard) / 2 * 1e9), rel=0.02)


def test_ttl_plan_and_ttl_ablate_plan_with_the_profile(tmp_path, capsys):
    path = _profile(tmp_path)
    assert plan_cli.main(["--config", "train_configs/debug_model.toml", "--hardware", str(path),
                          "--history", str(tmp_path / "none.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "x measured CPU (1 node(s) of 2: one node" in out and "profile " + str(path) in out
    sweep = dataclasses.replace(load_sweep(ROOT / "train_configs/ablations/one_dim_at_a_time.toml"),
                                hardware=path)
    memory, speed = sweep.planned(sweep.variants[0])
    assert memory > 0 and speed > 0
    assert gpu_from_dict(gpu_to_dict(MEASURED)) == MEASURED


def test_a_run_off_the_profiles_pace_is_flagged_and_left_out_of_the_error(tmp_path):
    """Each probe figure is the run's speed over the profile's (geometric means of the
    readings; a dispatch's time inverted); the step shift moves each term at its probe's pace
    (the device's compute at the matmul's, the host's at the dispatch's, the rest not);
    beyond PACE_TOLERANCE the run is flagged, recorded, and left out of the history's error,
    counted."""
    halved = pace_ratios(PACE, {"matmul_tflops": [0.05, 0.051], "dispatch_us": [4.0, 4.0]})
    assert halved == pytest.approx({"dispatch_us": 0.5, "matmul_tflops": 0.5})
    matmuls = {"gemm": 9.5, "host": 0.1, "fsdp": 0.4}  # a large model's step, seconds
    tiny = {"gemm": 0.2, "host": 0.6, "fsdp": 0.2}  # a tiny model's: the host's dispatch
    assert step_shift(halved, matmuls) == pytest.approx((19.0 + 0.2 + 0.4) / 10 - 1)
    dispatch_only = pace_ratios(PACE, {"matmul_tflops": [0.1, 0.102], "dispatch_us": [4.0]})
    assert step_shift(dispatch_only, matmuls) == pytest.approx(0.01)  # not flagged
    assert step_shift(dispatch_only, tiny) == pytest.approx(0.6)  # flagged
    assert step_shift({}, matmuls) == 0.0 and pace_ratios({}, PACE) == {}  # no probe
    assert set(PROBED_BY) <= {f.name for f in dataclasses.fields(StepTime)}  # no stale name
    assert paced(0.01) and len(pace_lines(dispatch_only, 0.01, "p.json")) == 1
    lines = pace_lines(halved, 0.96, "p.json")
    assert "the predicted step moves by +96.0%" in lines[0] and lines[1].startswith("warning: ")
    history = tmp_path / "history.jsonl"
    for shift, tokens in ((0.01, 1.05), (0.96, 0.55), (None, 0.95)):
        pace = {} if shift is None else {"pace_shift": shift}
        append_history(history, {"ratios": {"tokens_per_second_per_gpu": tokens}, **pace})
    assert history_lines(history) == [
        f"Verified on this machine ({history}, 2 run(s), 1 more off their profile's pace "
        "left out): tokens/s predicted/measured median 1.00, 0.95-1.05"]
