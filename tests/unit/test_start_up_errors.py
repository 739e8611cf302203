"""Bad inputs found at start-up, each as one ConfigError line: every unknown key at once,
numbers out of range, a broken custom_import, a corrupt tokenizer.json and bad data."""

import json

import pytest

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.validate import parse_args


def test_all_unknown_keys_and_bad_values_in_one_error():
    with pytest.raises(ConfigError) as error:
        parse_args(["--training.stepz=3", "--training.seq_lem=4", "--trainig.steps=1",
                    "--training.steps=three"], 1)
    first, *problems = str(error.value).splitlines()
    assert first == "4 problems:" and len(problems) == 4
    for expected in ["'stepz'", "'seq_lem'", "'three', expected int", "[trainig]"]:
        assert sum(expected in line for line in problems) == 1, expected


@pytest.mark.parametrize(("arg", "message"), [
    ("--optimizer.eps=-1", "[optimizer] eps = -1.0: must be > 0"),
    ("--optimizer.lr=inf", "[optimizer] lr = inf: must be a finite number"),
    ("--optimizer.beta2=1", "[optimizer] beta2 = 1.0: must be >= 0 and < 1"),
    ("--training.max_norm=nan", "[training] max_norm = nan: must be a finite number"),
    ("--lr_scheduler.min_lr_factor=2", "[lr_scheduler] min_lr_factor = 2.0: must be >= 0 and <= 1"),
])
def test_numbers_out_of_their_declared_range(arg, message):
    with pytest.raises(ConfigError) as error:
        parse_args([arg], 1)
    assert str(error.value) == message


@pytest.mark.parametrize(("source", "where", "what"), [
    ("x = 1\ndef broken(:\n", ":2", "SyntaxError"),
    ("import os\nraise RuntimeError('no GPU here')\n", ":2", "RuntimeError: no GPU here"),
])
def test_custom_import_failures_name_file_and_line(tmp_path, source, where, what):
    module = tmp_path / "user_model.py"
    module.write_text(source)
    with pytest.raises(ConfigError) as error:
        parse_args([f"--job.custom_import={module}"], 1)
    message = str(error.value)
    assert f"{module}{where}" in message and what in message and "\n" not in message


def test_corrupt_tokenizer_json_is_one_line(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(ConfigError, match=r"not a readable tokenizer\.json") as error:
        parse_args([f"--model.tokenizer_path={tmp_path}"], 1)
    assert "\n" not in str(error.value)


def _local(path, *more):
    return ["--training.dataset=local", f"--training.dataset_path={path}", *more]


def test_data_is_checked_at_start_up(tmp_path):
    no_field = tmp_path / "no_field.jsonl"
    no_field.write_text(json.dumps({"content": "a document"}) + "\n")
    with pytest.raises(ConfigError, match=r"no_field.jsonl:1: no text field 'text'"):
        parse_args(_local(no_field), 1)
    empty = tmp_path / "empty" / "empty.jsonl"
    empty.parent.mkdir()
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="holds no non-empty document"):
        parse_args(_local(empty.parent), 1)
    late = tmp_path / "late.jsonl"  # the first record is fine, the third lacks the field
    late.write_text("".join(json.dumps(r) + "\n" for r in [{"text": "a"}, {"text": "b"}, {}]))
    with pytest.raises(ConfigError, match=r"late.jsonl:3: no text field"):
        parse_args(_local(late, "--validation.enable", "--training.holdout_every=3"), 1)
    three = tmp_path / "three.jsonl"
    three.write_text("".join(json.dumps({"text": t}) + "\n" for t in "abc"))
    with pytest.raises(ConfigError, match=r"held-out split is empty: .* has 3 document"):
        parse_args(_local(three, "--validation.enable", "--training.holdout_every=4"), 1)
    assert parse_args(_local(three, "--validation.enable", "--training.holdout_every=3"), 1)
