"""Config parsing: precedence, inheritance, types, --help, --print_config and every error."""

import dataclasses
import typing
from pathlib import Path

import pytest

from torchtitan_like.config import manager
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.validate import parse_args


def write(path, text):
    path.write_text(text)
    return str(path)


def test_defaults_parse_for_one_process():
    config = parse_args([], world_size=1)
    expected = JobConfig()
    expected.job.dump_folder = str(Path.cwd() / "outputs")  # paths come out absolute
    assert config == expected


def test_toml_then_command_line_wins(tmp_path):
    toml = write(tmp_path / "a.toml", "[training]\nsteps = 7\nseq_len = 64\n")
    config = parse_args(["--job.config_file", toml, "--training.steps=9"], 1)
    assert (config.training.steps, config.training.seq_len) == (9, 64)
    assert config.job.config_file == toml


def test_extends_chain_merges_section_by_section(tmp_path):
    write(tmp_path / "base.toml", "[training]\nsteps = 3\nseq_len = 32\n[model]\nflavor = 'tiny'\n")
    write(tmp_path / "mid.toml", "extends = 'base.toml'\n[training]\nsteps = 4\n")
    child = write(tmp_path / "child.toml",
                  "extends = ['mid.toml']\n[training]\nlocal_batch_size = 2\n")
    t = parse_args(["--job.config_file", child], 1)
    assert (t.training.steps, t.training.seq_len, t.training.local_batch_size) == (4, 32, 2)
    assert t.model.flavor == "tiny"


def test_extends_cycle_and_missing_base(tmp_path):
    a = write(tmp_path / "a.toml", "extends = 'b.toml'\n")
    write(tmp_path / "b.toml", "extends = 'a.toml'\n")
    with pytest.raises(ConfigError, match="cycle"):
        parse_args(["--job.config_file", a], 1)
    c = write(tmp_path / "c.toml", "extends = 'nope.toml'\n")
    with pytest.raises(ConfigError, match=r"nope\.toml.*extended by"):
        parse_args(["--job.config_file", c], 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trainig.steps=3"], r"unknown config section \[trainig\].*did you mean 'training'"),
        (["--training.stpes=3"], r"unknown key 'stpes' in section \[training\].*'steps'"),
        (["--training.steps=three"], r"\[training\] steps.*'three', expected int"),
        (["--training.max_norm=big"], r"max_norm.*expected float"),
        (["--debug.deterministic=maybe"], r"deterministic.*expected bool"),
        (["--lr_scheduler.decay_type=cosin"], r"expected one of.*did you mean 'cosine'"),
        (["--training.steps"], r"needs a value of type int"),
        (["steps=3"], r"unexpected argument"),
        (["--steps=3"], r"expected --section.key=value"),
    ],
)
def test_command_line_errors_name_the_problem(args, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(args, 1)


def test_toml_errors_name_file_section_and_key(tmp_path):
    bad_key = write(tmp_path / "k.toml", "[optimizer]\nlearning_rate = 1e-3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'learning_rate'.*k.toml"):
        parse_args(["--job.config_file", bad_key], 1)
    bad_type = write(tmp_path / "t.toml", "[training]\nsteps = '10'\n")
    with pytest.raises(ConfigError, match=r"steps \(.*t.toml\): got '10', expected int"):
        parse_args(["--job.config_file", bad_type], 1)
    stray = write(tmp_path / "s.toml", "steps = 3\n")
    with pytest.raises(ConfigError, match="not a \\[section\\]"):
        parse_args(["--job.config_file", stray], 1)
    broken = write(tmp_path / "b.toml", "[training\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_args(["--job.config_file", broken], 1)
    with pytest.raises(ConfigError, match="not found"):
        parse_args(["--job.config_file", str(tmp_path / "missing.toml")], 1)


def test_types_booleans_lists_and_ints_as_floats(tmp_path):
    toml = write(tmp_path / "a.toml", "[optimizer]\nlr = 1\n")
    config = parse_args(["--job.config_file", toml, "--debug.deterministic",
                         "--compile.components=model", "--metrics.enable_tensorboard", "false"], 1)
    assert config.optimizer.lr == 1.0 and isinstance(config.optimizer.lr, float)
    assert config.debug.deterministic is True
    assert config.metrics.enable_tensorboard is False
    assert config.compile.components == ["model"]
    with pytest.raises(ConfigError, match="expected one of"):
        parse_args(["--compile.components=model,lost"], 1)


def test_every_field_is_documented_and_typed():
    for name, cls in manager.sections().items():
        docs = manager.field_docs(cls)
        for field in dataclasses.fields(cls):
            assert docs.get(field.name), f"[{name}] {field.name} has no docstring"
            assert field.name in typing.get_type_hints(cls)


def test_help_lists_every_field_with_default(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--help"], 1)
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for name, cls in manager.sections().items():
        for field in dataclasses.fields(cls):
            assert f"--{name}.{field.name}" in text


def test_print_config_round_trips(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--training.steps=11", "--compile.components=loss", "--print_config"], 1)
    printed = write(tmp_path / "printed.toml", capsys.readouterr().out)
    again = parse_args(["--job.config_file", printed], 1)
    assert again.training.steps == 11 and again.compile.components == ["loss"]


def test_custom_import_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_xyz'"):
        parse_args(["--job.custom_import=no_such_module_xyz"], 1)
    with pytest.raises(ConfigError, match="cannot import"):
        parse_args([f"--job.custom_import={tmp_path / 'missing.py'}"], 1)


@pytest.mark.parametrize(
    ("args", "world_size", "message"),
    [
        (["--parallelism.data_parallel_shard_degree=-2"], 2, r"dp_shard = -2.*or -1 to fill"),
        (["--parallelism.data_parallel_shard_degree=3"], 4,
         r"pp\(1\) x dp_replicate\(1\) x cp\(1\) x tp\(1\) x dp_shard\(3\) = 3, but 4 processes"),
        (["--parallelism.data_parallel_replicate_degree=3"], 4, r"world size 4 is not divisible"),
        (["--parallelism.data_parallel_replicate_degree=0"], 1, r"dp_replicate = 0: must be >= 1"),
        (["--training.global_batch_size=6"], 2, r"multiple of local_batch_size x data-parallel"),
        (["--training.local_batch_size=0"], 1, r"local_batch_size = 0"),
        (["--optimizer.lr=0"], 1, r"\[optimizer\] lr"),
        (["--lr_scheduler.decay_ratio=2"], 1, r"decay_ratio"),
        (["--model.name=llama4"], 1, r"unknown model 'llama4'.*did you mean 'llama3'"),
        (["--model.flavor=8b"], 1, r"no flavor '8b'.*8B"),
        (["--validation.enable", "--training.holdout_every=0"], 1, r"held-out split"),
        (["--training.dataset=local"], 1, r"needs \[training\] dataset_path"),
        (["--training.dataset=local", "--training.dataset_path=/nonexistent"], 1,
         "does not exist"),
        (["--activation_checkpoint.mode=selective",
          "--activation_checkpoint.selective_ac_option=sometimes"], 1, r'"op" or a positive'),
        (["--model.tokenizer_path=/nonexistent/tokenizer.json"], 1, "does not exist"),
    ],
)
def test_validation_errors(args, world_size, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(args, world_size)


def test_empty_dataset_folder_and_small_vocab(tmp_path):
    (tmp_path / "notes.md").write_text("not a supported file")
    with pytest.raises(ConfigError, match=r"no \.txt/\.jsonl/\.json/\.parquet files"):
        parse_args(["--training.dataset=local", f"--training.dataset_path={tmp_path}"], 1)
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel

    vocab = {f"w{i}": i for i in range(600)} | {"<s>": 600, "</s>": 601}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="w0"))
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError, match=r"602 tokens but .* tiny only 512"):
        parse_args(["--model.flavor=tiny", f"--model.tokenizer_path={tmp_path}"], 1)


def test_config_reference_page_is_current():
    """docs/config_reference.md is generated from the dataclasses; a new field must show."""
    import subprocess
    import sys

    from harness import ROOT

    check = subprocess.run([sys.executable, "scripts/config_reference.py", "--check"], cwd=ROOT)
    assert check.returncode == 0, (
        "docs/config_reference.md is stale: run python scripts/config_reference.py")
