"""scripts/generate.py and scripts/convert_hf.py read the model from what they are given (the
model a checkpoint.json records, the model an HF config.json's model_type belongs to) instead
of assuming llama3; a finished run restarted says it has nothing left to do and trains nothing.
In-process, on the tiny debug flavors."""

import dataclasses
import importlib.util
import json

import pytest
import torch
import torch.distributed.checkpoint as dcp
from harness import ROOT, run_in_process

from torchtitan_like.components.checkpoint.folder import finished_run, publish, read_info
from torchtitan_like.components.hf_checkpoint import model_of_folder, save_hf
from torchtitan_like.models.registry import get_model_args, get_model_spec
from torchtitan_like.tools import generate


def _convert_hf():
    spec = importlib.util.spec_from_file_location("convert_hf", ROOT / "scripts/convert_hf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _model(name: str, flavor: str):
    spec = get_model_spec(name)
    args = dataclasses.replace(get_model_args(spec, flavor), max_seq_len=32)
    torch.manual_seed(0)
    model = spec.model_cls(args)
    model.init_weights()
    return spec, args, model


def _checkpoint(folder, name: str, flavor: str):
    """A model-only DCP step folder, as a run of that model saves it."""
    _, _, model = _model(name, flavor)
    partial, final = folder / "step-3.partial", folder / "step-3"
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(partial), no_dist=True)
    publish(partial, final, {"step": 3, "states": ["model"], "seq_len": 32,
                             "model": {"name": name, "flavor": flavor, "overrides": {}}})
    return final


def test_a_qwen3_checkpoint_generates_and_converts(tmp_path, capsys):
    step = _checkpoint(tmp_path / "checkpoint", "qwen3", "debugmodel")
    assert model_of_folder(step).name == "qwen3"
    assert generate.main([str(step), "--prompt", "The ", "--max_new_tokens", "2",
                          "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("The ")
    assert _convert_hf()(["to_hf", str(step), str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf/config.json").read_text())["model_type"] == "qwen3"
    assert model_of_folder(tmp_path / "hf").name == "qwen3"


def test_a_deepseek_v3_hf_folder_converts_to_its_model(tmp_path, capsys):
    spec, args, model = _model("deepseek_v3", "debugmodel")
    save_hf(model.state_dict(), spec.hf_adapter(args), tmp_path / "hf", torch.float32)
    assert _convert_hf()(["from_hf", str(tmp_path / "hf"), str(tmp_path / "ckpt")]) == 0
    assert "(deepseek_v3 flavor debugmodel)" in capsys.readouterr().out
    assert read_info(tmp_path / "ckpt/step-0")["model"]["name"] == "deepseek_v3"


def test_what_cannot_be_read_is_one_line(tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf/config.json").write_text('{"model_type": "gpt2"}')
    for argv, expected in [([str(tmp_path / "missing")], "no such folder"),
                           ([str(tmp_path / "hf")], "model_type 'gpt2' is no registered model's")]:
        assert generate.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error: ") and expected in err, err


def _tree(folder):
    return {p: p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def test_a_finished_run_restarted_has_nothing_left_to_do(tmp_path, capsys):
    """Its last checkpoint is at [training] steps: one line, exit 0 (run returns 0), before any
    process group; the metrics and checkpoints are untouched."""
    dump = tmp_path / "job"
    (dump / "checkpoint/step-10").mkdir(parents=True)
    (dump / "metrics.jsonl").write_text('{"step": 10, "loss": 2.0}\n')
    (dump / "checkpoint/step-10/checkpoint.json").write_text(json.dumps(
        {"step": 10, "states": ["model", "optimizer", "lr_scheduler", "dataloader",
                                "train_state"]}))
    before = _tree(dump)
    assert run_in_process(["--checkpoint.enable", "--training.steps=10",
                           f"--job.dump_folder={dump}"]) == 0
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert len(lines) == 1 and "nothing left to do: " in lines[0], lines
    assert f"{dump}/checkpoint/step-10 is step 10 and [training] steps = 10" in lines[0]
    assert _tree(dump) == before
    assert finished_run(dump / "checkpoint", -1, 11) is None  # one more step: it trains
    assert finished_run(dump / "checkpoint", 4, 10) is None  # load_step missing: load reports


@pytest.mark.parametrize("name", ["llama3", "qwen3", "deepseek_v3"])
def test_every_flavor_is_within_its_models_ranges(name):
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import ParallelDims

    spec = get_model_spec(name)
    for flavor in spec.flavors:
        config = JobConfig()
        config.model.name, config.model.flavor = name, flavor
        get_model_args(spec, flavor).validate(config, ParallelDims.from_config(config, 1))
