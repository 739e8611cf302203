import json

import pytest
import torch

from torchtitan_like.components.metrics import MetricsLogger, peak_tflops


def test_records_throughput_mfu_and_validation(tmp_path):
    metrics = MetricsLogger(dump_folder=str(tmp_path), writer=True, enable_tensorboard=True,
                            tb_folder="tb", device=torch.device("cpu"), flops_per_token=1e9,
                            peak=10.0, replica_devices=2, world_size=4)
    metrics.window_start -= 1.0  # pretend one second passed
    metrics.add_step(tokens=4000, data_seconds=0.25)
    record = metrics.log(1, {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3})
    metrics.log_validation(1, 1.0)
    metrics.close()
    assert record["tokens_per_second"] == pytest.approx(2000, rel=0.05)  # per device of 2
    assert record["tokens_per_second_total"] == pytest.approx(4 * record["tokens_per_second"])
    assert record["tflops"] == pytest.approx(record["tokens_per_second"] * 1e9 / 1e12)
    assert record["mfu"] == pytest.approx(100 * record["tflops"] / 10.0)
    assert record["data_loading_percent"] == pytest.approx(25, rel=0.05)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["loss"] == 2.0
    assert lines[1]["validation_perplexity"] == pytest.approx(2.718, 1e-3)
    assert any((tmp_path / "tb").iterdir())


def test_non_writer_ranks_write_nothing(tmp_path):
    metrics = MetricsLogger(dump_folder=str(tmp_path / "x"), writer=False, enable_tensorboard=True,
                            tb_folder="tb", device=torch.device("cpu"), flops_per_token=1,
                            peak=None, replica_devices=1, world_size=1)
    metrics.add_step(10, 0.0)
    assert metrics.log(1, {"loss": 1.0, "grad_norm": 0.0, "lr": 0.1})["mfu"] is None
    assert not (tmp_path / "x").exists()


def test_peak_is_configured_or_measured_on_cpu():
    assert peak_tflops(torch.device("cpu"), 3.5, torch.float32) == 3.5
    assert peak_tflops(torch.device("cpu"), 0.0, torch.float32) > 0


def test_a_resumed_run_continues_the_file_from_its_step(tmp_path):
    def metrics(resume_step):
        return MetricsLogger(dump_folder=str(tmp_path), writer=True, enable_tensorboard=False,
                             tb_folder="tb", device=torch.device("cpu"), flops_per_token=1,
                             peak=None, replica_devices=1, world_size=1, resume_step=resume_step)

    first = metrics(0)
    for step in range(1, 5):  # steps 3 and 4 are lost: the job resumes after step 2
        first.log(step, {"loss": float(step), "grad_norm": 0.0, "lr": 0.1})
    first.close()
    resumed = metrics(2)
    resumed.log(3, {"loss": 30.0, "grad_norm": 0.0, "lr": 0.1})
    resumed.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("loss"), r.get("resumed")) for r in lines] == [
        (1, 1.0, None), (2, 2.0, None), (2, None, True), (3, 30.0, None)]
