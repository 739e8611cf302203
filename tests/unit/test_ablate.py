"""The ablation runner's pieces: sweep files, error lines, and the results it writes.

The end-to-end sweep (real training runs, two of them refused) is tests/e2e/test_ablation_sweep.py.
"""

import json
import sys
from pathlib import Path

import pytest

from torchtitan_like.models.registry import model_spec_and_args
from torchtitan_like.tools.ablate import Sweep, SweepError, Variant, error_line, load_sweep, main
from torchtitan_like.tools.ablate_report import Result, model_metric_names, write_results
from torchtitan_like.validate import parse_args

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "train_configs/ablations/one_dim_at_a_time.toml"


def test_shipped_sweep_variants_are_valid_configs():
    sweep = load_sweep(SHIPPED)
    assert sweep.baseline_name == "FSDP 2" and len(sweep.variants) >= 8
    for variant in sweep.variants:
        argv = ["--job.config_file", str(sweep.base_config), *sweep.overrides,
                *variant.overrides]
        config = parse_args(argv, sweep.nproc_of(variant))  # validated for its world size
        assert config.training.global_batch_size == 4
        if config.model.name == "llama3":  # the planner models no MoE layers yet
            memory, speed = sweep.planned(variant)
            assert 0 < memory < 1 and speed is None  # no hardware profile: no tokens/s


def test_moe_sweep_variants_are_valid_configs():
    sweep = load_sweep(SHIPPED.parent / "moe.toml")
    routing = {}
    for variant in sweep.variants:
        argv = ["--job.config_file", str(sweep.base_config), *sweep.overrides,
                *variant.overrides]
        config = parse_args(argv, sweep.nproc_of(variant))
        assert config.model.name == "deepseek_v3"
        moe = model_spec_and_args(config)[1].moe  # nested [model] overrides reach the model
        routing[variant.name] = (moe.num_experts, moe.top_k, moe.load_balance_coeff is not None)
    assert {(4, 2, True), (16, 2, True), (8, 1, True), (8, 4, True), (8, 2, False)} <= set(
        routing.values())


def test_optimizer_sweep_variants_are_valid_and_planned_muon_keeps_fewer_states():
    """AdamW vs Muon (train_configs/ablations/optimizers.toml): every variant validates for its
    world size, and the planner gives Muon less memory (one momentum per matrix element
    instead of two moments) on both models."""
    sweep = load_sweep(SHIPPED.parent / "optimizers.toml")
    planned = {}
    for variant in sweep.variants:
        argv = ["--job.config_file", str(sweep.base_config), *sweep.overrides,
                *variant.overrides]
        config = parse_args(argv, sweep.nproc_of(variant))
        planned[(config.model.name, config.optimizer.name,
                 config.parallelism.expert_parallel_degree)] = sweep.planned(variant)[0]
    assert {name for name, _, _ in planned} == {"llama3", "deepseek_v3"}
    for model in ("llama3", "deepseek_v3"):
        assert planned[(model, "Muon", 1)] < planned[(model, "AdamW", 1)]


def test_planned_memory_is_none_when_the_config_cannot_run():
    sweep = load_sweep(SHIPPED)
    impossible = Variant("x", ("--parallelism.data_parallel_replicate_degree=3",))
    assert sweep.planned(impossible) == (None, None)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


BASE = f'[sweep]\nbase_config = "{ROOT}/train_configs/debug_model.toml"\n'


@pytest.mark.parametrize("body,message", [
    ("[sweep]\nsteps = 2\n[[variants]]\nname = 'a'\n", "base_config is required"),
    ('[sweep]\nbase_config = "nope.toml"\n[[variants]]\nname = "a"\n', "does not exist"),
    (BASE + "step = 2\n[[variants]]\nname = 'a'\n", "unknown \\[sweep\\] keys \\['step'\\]"),
    (BASE, "no \\[\\[variants\\]\\]"),
    (BASE + "[[variants]]\nname = 'a b'\n[[variants]]\nname = 'a_b'\n", "must differ"),
    (BASE + "[[variants]]\nname = 'a'\noverrides = ['training.steps=2']\n",
     "must look like --section.key=value"),
    (BASE + "baseline = 'z'\n[[variants]]\nname = 'a'\n", "baseline 'z' is not a variant"),
    (BASE + "[[variants]]\nnam = 'a'\n", "needs a name"),
    (BASE + "[variant]\nname = 'a'\n", "unknown sections"),
])
def test_sweep_errors(tmp_path, body, message):
    with pytest.raises(SweepError, match=message):
        load_sweep(_write(tmp_path, body))


def test_cli_reports_sweep_errors_and_dry_runs(tmp_path, capsys):
    assert main([str(tmp_path / "missing.toml")]) == 2
    assert "sweep file not found" in capsys.readouterr().err
    path = _write(tmp_path, BASE + "nproc = 2\n[[variants]]\nname = 'a'\n"
                  "[[variants]]\nname = 'b'\nnproc = 1\noverrides = ['--training.steps=3']\n")
    assert main([str(path), "--dry_run", "--steps", "5", "--only", "b"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "-m torchtitan_like.launch --standalone --nproc_per_node=1 " in out[0]
    assert " -m torchtitan_like.train --job.config_file " in out[0]
    assert "--training.steps=5" in out[0] and out[0].endswith("--training.steps=3")


TORCHRUN_CONFIG_ERROR = """
*****************************************
Setting OMP_NUM_THREADS environment variable for each process to be 1 in default
*****************************************
[rank0]:11:10:50 config error: the world size 2 is not divisible by dp_replicate(3) = 3
W1129 11:10:54.273000 512 torch/distributed/elastic/multiprocessing/api.py:1028] Sending
E1129 11:10:54.658000 512 torch/distributed/elastic/multiprocessing/api.py:1002] failed
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
torchtitan_like.train FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_11:10:54
  exitcode  : 2 (pid: 1355)
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""

RANK_TRACEBACK = """
[rank0]:11:10:50 training 5 steps; writing to /tmp/x
[rank0]: Traceback (most recent call last):
[rank0]:   File "/repo/torchtitan_like/train.py", line 120, in train_step
[rank0]:     raise RuntimeError("boom")
[rank0]: RuntimeError: boom in step 3
E1129 11:10:54.658000 512 torch/distributed/elastic/multiprocessing/api.py:1002] failed
"""


def test_error_line_finds_the_cause():
    assert error_line(TORCHRUN_CONFIG_ERROR) == (
        "config error: the world size 2 is not divisible by dp_replicate(3) = 3")
    assert error_line(RANK_TRACEBACK) == "RuntimeError: boom in step 3"
    assert error_line("starting\nKilled\n") == "Killed"
    assert error_line("") == "(the log is empty)"


def _result(name: str, losses: list[float], status: str = "ok", error: str = "") -> Result:
    records = [{"step": i + 1, "loss": loss, "tokens_per_second": 100.0 * (i + 1),
                "mfu": 1.0 + i, "memory_gib": 0.5 + i / 10} for i, loss in enumerate(losses)]
    return Result(Variant(name, ("--x.y=1",)), 2, status, 12.0, records, error)


def _sweep(tmp_path: Path) -> Sweep:
    return Sweep(base_config=ROOT / "train_configs/debug_model.toml",
                 variants=(Variant("base"), Variant("faster"), Variant("broken")),
                 output_folder=tmp_path)


def test_results_table_and_csv(tmp_path):
    results = [_result("base", [5.0, 4.0, 3.0]), _result("faster", [5.0, 4.0, 3.25]),
               _result("broken", [], "failed (exit 1)", "config error: no")]
    for i, record in enumerate(results[1].records):  # the model's own metrics, last one shown
        record.update({"aux_loss/z_loss": 0.5 - i / 10, "max_logsumexp": 7.0 + i,
                       "data_share/web": 0.5, "moe_load": [1, 2]})
    results[1].records.append({"step": 3, "validation_loss": 3.5, "validation_perplexity": 33.1})
    write_results(_sweep(tmp_path), results, tmp_path)
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert rows[0].startswith("variant,status,nproc,steps_logged,tokens_per_second")
    assert rows[0].endswith(",validation_loss,wall_seconds,error,overrides,aux_loss/z_loss,"
                            "max_logsumexp")
    assert rows[2].startswith("faster,ok,2,3,250,2.5,0.7,,,3.25,0.25,3.5,")  # no plans
    assert rows[2].endswith(",0.3,9") and rows[1].endswith(",,")
    assert rows[3].startswith("broken,failed (exit 1),2,0,")
    assert "config error: no" in rows[3]
    table = (tmp_path / "results.md").read_text()
    assert "| val loss | wall s | aux_loss/z_loss | max_logsumexp |" in table
    assert "| faster | 2 | ok | 250 |  | 2.50 | 0.700 |  | 3.2500 | +0.2500 | 3.5000 | 12 | 0.3 " \
        "| 9 |" in table
    assert "**broken** (failed (exit 1)): `config error: no`" in table


def test_model_metric_names_leave_out_the_trainers_keys():
    record = {"step": 1, "loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "epoch": 0,
              "tokens_seen": 9, "tokens_per_second": 1.0, "tokens_per_second_total": 2.0,
              "tflops": 0.1, "mfu": None, "mfu_peak_tflops": None, "memory_gib": 0.1,
              "data_loading_percent": 1.0, "checkpoint_seconds": 0.0, "validation_seconds": 0.0,
              "elapsed_seconds": 1.0, "eta_seconds": 2.0, "data_tokens/a": 5, "data_share/a": 1.0,
              "aux_loss/mtp": 0.2, "moe_imbalance/max": 1.5, "flag": True}
    assert model_metric_names([record, {"step": 1, "validation_loss": 2.0}]) == [
        "aux_loss/mtp", "moe_imbalance/max"]


def test_chart(tmp_path):
    pytest.importorskip("matplotlib", reason="optional extra `plot` not installed")
    write_results(_sweep(tmp_path), [_result("base", [5.0, 4.0, 3.0])], tmp_path)
    assert (tmp_path / "results.png").stat().st_size > 0


def test_missing_matplotlib_skips_the_chart(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert write_results(_sweep(tmp_path), [_result("base", [5.0])], tmp_path) is False
    assert not (tmp_path / "results.png").exists()
    assert "No chart: matplotlib is not installed (the `plot` extra" in (
        tmp_path / "results.md").read_text()


def test_steady_state_means_skip_the_first_step():
    result = _result("x", [3.0, 2.0, 1.0])
    assert result.tokens_per_second == 250 and result.mfu == 2.5
    assert result.memory_gib == pytest.approx(0.7) and result.final_loss == 1.0
    result.records.append({"step": 3, "validation_loss": 1.5})
    assert result.validation_loss == 1.5
    assert json.dumps(result.training)  # records stay plain JSON
