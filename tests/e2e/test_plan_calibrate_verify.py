"""``ttl-plan --calibrate PROFILE --verify`` on a tiny job, one launch of two processes: the
ranks measure the machine at the job's shapes (matmuls, attention, element-wise bandwidth,
the five collectives over their real process group), write the hardware profile, then train
the job with the real trainer; ttl-plan plans with the profile, prints predicted beside
measured and appends the pair to the history, whose error the next plan reports.

Checked: the profile's format (it loads back into a GPU the planner runs on, every measured
curve present and ascending, the versions and date recorded, the pace probe read twice), the
verify table, the pace line and the history record. No timing is asserted (a test must not
depend on the machine's speed).
"""

import json

from harness import BASE, ROOT, env

from torchtitan_like.tools import plan_cli
from torchtitan_like.tools.planner.hardware import FORMAT, load_profile
from torchtitan_like.tools.planner.links import COLLECTIVES


def test_calibrate_then_verify_a_tiny_job(tmp_path, corpus, monkeypatch, capsys):
    profile, history = tmp_path / "profile.json", tmp_path / "history.jsonl"
    job = [*BASE, "--training.dataset", "local", "--training.dataset_path", str(corpus),
           "--training.local_batch_size", "1", "--metrics.enable_tensorboard", "false"]
    for key, value in env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT)
    code = plan_cli.main(["--config", "train_configs/debug_model.toml", "--num_gpus", "2",
                          "--calibrate", str(profile), "--verify", "--verify_steps", "1",
                          "--verify_warmup", "1", "--history", str(history), "--", *job])
    out = capsys.readouterr().out
    assert code == 0, out

    record = json.loads(profile.read_text())
    assert record["format"] == FORMAT and record["date"][:2] == "20"
    assert record["host"]["torch"] and record["processes"] == {"world_size": 2, "per_node": 2,
                                                               "nodes": 1}
    loaded = load_profile(profile)
    gpu, curves = loaded.gpu, dict(loaded.gpu.collective_gbps)
    assert loaded.gpus_per_node == 2 and not gpu.comm_overlaps_compute
    assert {d for d, _ in gpu.gemm_tflops_by_dtype} == {"float32", "bfloat16"}
    assert gpu.attention_tflops_by_seq[-1][0] == 64 and gpu.hbm_tbps > 0
    assert set(curves) == {f"{kind}/intra" for kind in COLLECTIVES}
    assert all(len(curve) >= 2 for curve in curves.values())
    sync = record["measured"]["synchronous_collective"]  # a CPU process: tools/sync_cost.py
    assert (gpu.host_collective_s, gpu.sync_skew_s) == (sync["host_collective_s"],
                                                        sync["sync_skew_s"])
    assert gpu.host_collective_s > 0 and gpu.sync_skew_s >= 0
    assert set(loaded.pace) == {"matmul_tflops", "dispatch_us"}
    assert all(len(readings) == 2 for readings in loaded.pace.values())

    assert "Verify: tp 1, cp 1, pp 1, dp 2" in out and loaded.describe() in out
    for row in ("tokens/s per GPU", "compute seconds", "peak memory GiB"):
        assert row in out
    (entry,) = [json.loads(line) for line in history.read_text().splitlines()]
    assert entry["hardware"] == str(profile) and entry["processes"] == 2
    assert {"tokens_per_second_per_gpu", "peak_memory", "compute"} <= set(entry["ratios"])
    assert entry["measured"]["peak_gib_per_pipeline_rank"][0] > 0
    assert f"Pace against {profile}" in out
    assert set(entry["pace_ratios"]) == {"matmul_tflops", "dispatch_us"}

    assert plan_cli.main(["--config", "train_configs/debug_model.toml", "--num_gpus", "2",
                          "--hardware", str(profile), "--history", str(history), "--",
                          *job]) == 0
    assert "Verified on this machine" in capsys.readouterr().out
