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


def test_torn_lines_and_lines_that_are_no_records_are_dropped_on_resume(tmp_path, caplog):
    """A line cut short by a kill, and valid JSON that is no record (``{}``, ``null``, a
    number, a step that is no integer), are dropped with a warning instead of breaking every
    resume."""
    lines = ['{"step": 1, "loss": 1.0}', "{}", "null", "7", '{"step": "2"}',
             '{"step": 2, "loss": 2.0}', '{"step": 3, "lo']  # killed while writing step 3
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    resumed = MetricsLogger(dump_folder=str(tmp_path), writer=True, enable_tensorboard=False,
                            tb_folder="tb", device=torch.device("cpu"), flops_per_token=1,
                            peak=None, replica_devices=1, world_size=1, resume_step=2)
    resumed.log(3, {"loss": 3.0, "grad_norm": 0.0, "lr": 0.1})
    resumed.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("loss")) for r in lines] == [(1, 1.0), (2, 2.0), (2, None),
                                                           (3, 3.0)]
    assert "metrics.jsonl:7: dropped a torn record" in caplog.text
    assert "metrics.jsonl:2: dropped a line that is no record '{}'" in caplog.text


def test_nothing_is_written_before_the_first_record(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("an earlier run\n")
    metrics = MetricsLogger(dump_folder=str(tmp_path), writer=True, enable_tensorboard=True,
                            tb_folder="tb", device=torch.device("cpu"), flops_per_token=1,
                            peak=None, replica_devices=1, world_size=1)
    metrics.close()  # a job that failed before its first step
    assert (tmp_path / "metrics.jsonl").read_text() == "an earlier run\n"
    assert not (tmp_path / "tb").exists()


def test_progress_and_paused_time_leave_throughput_alone(tmp_path, caplog):
    caplog.set_level("INFO", logger="torchtitan_like")
    metrics = MetricsLogger(dump_folder=str(tmp_path), writer=True, enable_tensorboard=False,
                            tb_folder="tb", device=torch.device("cpu"), flops_per_token=1e9,
                            peak=0.001, replica_devices=1, world_size=1, total_steps=10)
    metrics.add_step(tokens=1000, data_seconds=0.0)
    metrics.window_start -= 3.0  # three seconds passed, two of them saving and validating
    metrics.progress.started -= 3.0
    metrics.paused_seconds.update(checkpoint=1.5, validation=0.5)
    with metrics.paused("checkpoint"):  # adds its own (tiny) time
        pass
    record = metrics.log(2, {"loss": 1.0, "grad_norm": 0.0, "lr": 0.1, "tokens_seen": 2048})
    metrics.close()
    assert record["tokens_per_second"] == pytest.approx(1000, rel=0.05)  # over 1 s, not 3
    assert record["checkpoint_seconds"] == pytest.approx(1.5, abs=0.05)
    assert record["validation_seconds"] == 0.5
    assert record["elapsed_seconds"] == pytest.approx(3.0, rel=0.05)
    assert record["eta_seconds"] == pytest.approx(3.0 / 2 * 8, rel=0.05)
    assert "step 2/10  elapsed 0:00:03  eta 0:00:12  tokens 2,048" in caplog.text


def test_cpu_peak_is_measured_once_per_process():
    from torchtitan_like.components.metrics import measure_cpu_tflops

    first = measure_cpu_tflops(torch.float32)
    assert first > 0 and measure_cpu_tflops(torch.float32) is first



def test_mfu_never_exceeds_100_percent_the_peak_rises_to_what_the_run_achieves(tmp_path, caplog):
    """A peak below the run's own rate (a wrong [metrics] peak_tflops, or a slow dtype's
    measured rate) is raised to that rate, once warned; later windows are measured against
    it, and every record names the peak it used."""
    metrics = MetricsLogger(dump_folder=str(tmp_path), writer=True, enable_tensorboard=False,
                            tb_folder="tb", device=torch.device("cpu"), flops_per_token=1e9,
                            peak=0.001, replica_devices=1, world_size=1)
    records = []
    for tokens in (1000, 500):  # 1 TFLOP/s, then 0.5
        metrics.add_step(tokens=tokens, data_seconds=0.0)
        metrics.window_start -= 1.0
        records.append(metrics.log(1, {"loss": 1.0, "grad_norm": 0.0, "lr": 0.1}))
    metrics.close()
    first, second = records
    assert first["mfu"] == 100 and first["mfu_peak_tflops"] == first["tflops"]
    assert second["mfu_peak_tflops"] == first["tflops"]
    assert second["mfu"] == pytest.approx(100 * second["tflops"] / first["tflops"])
    assert second["mfu"] == pytest.approx(50, rel=0.05)
    warnings = [r.message for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith("MFU: this run computes ")
    assert "above the peak of 0.001: the peak is raised to the rate achieved (MFU 100%); " \
        "set [metrics] peak_tflops" in warnings[0]


@pytest.mark.parametrize("rates, peak, slow", [
    ({torch.float32: 0.1, torch.bfloat16: 0.0007}, 0.1, True),  # AVX2: bf16 on fallbacks
    ({torch.float32: 0.1, torch.bfloat16: 0.06}, 0.1, False),  # not twice as slow
    ({torch.float32: 0.1, torch.bfloat16: 1.3}, 1.3, False),  # AMX
])
def test_a_slow_compute_dtype_is_named_and_mfu_is_against_float32(monkeypatch, caplog, rates,
                                                                   peak, slow):
    """Measured rates are faked (this machine has AMX; ONEDNN_MAX_CPU_ISA=AVX2 shows the slow
    kernels for real, docs/performance.md)."""
    from torchtitan_like.components import metrics

    caplog.set_level("INFO", logger="torchtitan_like")
    monkeypatch.setattr(metrics, "measure_cpu_tflops", rates.__getitem__)
    assert peak_tflops(torch.device("cpu"), 0.0, torch.bfloat16) == peak
    warnings = [r.message for r in caplog.records if r.levelname == "WARNING"]
    if slow:
        assert warnings == ['[training] mixed_precision_param = "bfloat16" is slow on this CPU: '
                            "bfloat16 matmuls run at 0.7 GFLOP/s, float32's at 100 (no "
                            "AVX512-BF16/AMX kernels), so this job computes up to 143x slower "
                            'than with mixed_precision_param = "float32"; MFU is against the '
                            "float32 rate"]
    else:
        assert warnings == []
    caplog.clear()
    monkeypatch.setattr(metrics, "measure_cpu_tflops", {torch.float32: 0.1}.__getitem__)
    assert peak_tflops(torch.device("cpu"), 0.0, torch.float32) == 0.1  # only float32 measured
    assert peak_tflops(torch.device("cpu"), 2.0, torch.bfloat16) == 2.0  # configured: as is
