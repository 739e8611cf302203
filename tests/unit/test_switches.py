"""Dependent settings (config/switches.py): every field of every section is placed, as the
child of a parent switch or as independent, so a new field cannot be forgotten; a child set
while its parent is off is named in the one warning line after the run summary, not refused (a
sweep toggles the parent and keeps the children); contradictions are still refused."""

import dataclasses
import typing

import pytest

from torchtitan_like.components.run_summary import settings_without_effect
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.manager import build_job_config, sections
from torchtitan_like.config.switches import INDEPENDENT, PARENTS, Built, without_effect
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.validate import parse_args

BUILT_IN = [f.name for f in dataclasses.fields(JobConfig)]


def test_every_field_of_every_section_is_placed_once():
    placed = set(PARENTS) | {(s, n) for s, names in INDEPENDENT.items() for n in names}
    fields = {(s, f.name) for s in BUILT_IN for f in dataclasses.fields(sections()[s])}
    assert fields - placed == set(), "place each new field in config/switches.py"
    assert placed - fields == set(), "a placed field that does not exist"
    both = set(PARENTS) & {(s, n) for s, names in INDEPENDENT.items() for n in names}
    assert both == set()


def _another_value(section: str, name: str):
    """A valid value other than the default, from the field's type."""
    hint = typing.get_type_hints(sections()[section])[name]
    default = getattr(getattr(JobConfig(), section), name)
    if typing.get_origin(hint) is typing.Literal:
        return next(v for v in typing.get_args(hint) if v != default)
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return [typing.get_args(item)[0] if typing.get_origin(item) is typing.Literal else "x"]
    if typing.get_origin(hint) is dict:
        return {"x": 1.0}
    if hint is str:
        return "x"
    return {bool: lambda: not default, int: lambda: default + 1,
            float: lambda: default * 2 + 1}[hint]()


OFF = Built(world_size=1, fsdp=False, float8=False)


@pytest.mark.parametrize("section, name", list(PARENTS), ids=[f"{s}.{n}" for s, n in PARENTS])
def test_a_child_set_under_an_off_parent_is_named_with_its_parent(section, name):
    config = JobConfig()
    setattr(getattr(config, section), name, _another_value(section, name))
    found = without_effect(config, OFF)
    if PARENTS[section, name].on(JobConfig(), OFF):  # on by default: spike policy "warn"
        assert found == []
    else:
        assert [(s, n, p) for s, n, _, p in found] == [(section, name,
                                                        PARENTS[section, name].label)]


ISSUE_CASES = [  # issue 39's list, then the refusals the table replaced
    ("--float8.recipe_name=rowwise", '[float8] recipe_name = "rowwise" ([float8] enable is off)'),
    ("--float8.filter_fqns=wk", '[float8] filter_fqns = ["wk"] ([float8] enable is off)'),
    ("--parallelism.pipeline_parallel_schedule=GPipe",
     '[parallelism] pipeline_parallel_schedule = "GPipe" ([parallelism] '
     "pipeline_parallel_degree > 1 is off)"),
    ("--checkpoint.interval=7", "[checkpoint] interval = 7 ([checkpoint] enable is off)"),
    ("--profiling.profiler_active=2",
     "[profiling] profiler_active = 2 ([profiling] enable_profiling is off)"),
    ("--debug.fault_step=3", "[debug] fault_step = 3 ([debug] fault_rank >= 0 is off)"),
    ("--training.dataset_text_field=body",
     '[training] dataset_text_field = "body" ([training] dataset = "local" is off)'),
    ("--training.shuffle=true", '[training] shuffle = true ([training] dataset = "tokenized" '
                                "is off)"),
    ("--metrics.run_name=x", '[metrics] run_name = "x" ([metrics] enable_wandb or '
                             "enable_mlflow is off)"),
    ("--spike.max_consecutive=2", '[spike] max_consecutive = 2 ([spike] policy = "stop" is off)'),
    ("--debug.spike_scale=3", "[debug] spike_scale = 3.0 ([debug] spike_step > 0 is off)"),
    ("--fault_tolerance.replica_id=1",
     "[fault_tolerance] replica_id = 1 ([fault_tolerance] enable is off)"),
    ("--checkpoint.load_step=3", "[checkpoint] load_step = 3 ([checkpoint] enable is off)"),
    ("--checkpoint.export_dtype=bfloat16", '[checkpoint] export_dtype = "bfloat16" ([checkpoint] '
                                           "last_save_model_only or last_save_in_hf (with "
                                           "enable) is off)"),
    ("--checkpoint.last_save_in_hf=true",
     "[checkpoint] last_save_in_hf = true ([checkpoint] enable is off)"),
    ("--checkpoint.initial_load_in_hf=true", "[checkpoint] initial_load_in_hf = true "
                                             "([checkpoint] initial_load_path is off)"),
    ("--optimizer.state_stochastic_rounding=true", "[optimizer] state_stochastic_rounding = "
                                                   'true ([optimizer] state_dtype = "bfloat16" '
                                                   "is off)"),
    ("--float8.precompute_float8_dynamic_scale_for_fsdp=true",
     "[float8] precompute_float8_dynamic_scale_for_fsdp = true ([float8] "
     "enable_fsdp_float8_all_gather (with float8, under FSDP) is off)"),
    ("--parallelism.enable_async_tensor_parallel=true",
     "[parallelism] enable_async_tensor_parallel = true ([parallelism] tensor_parallel_degree "
     '> 1 with [compile] enable and "model" in [compile] components is off)'),
    ("--model.overrides.max_seq_len=4096",
     "[model] overrides.max_seq_len = 4096 (the RoPE table is [training] seq_len = 2048 long)"),
]


def test_the_settings_without_effect_are_one_line_and_the_job_still_starts(tmp_path):
    """Checked the way the trainer does it, after validation, with the built layout."""
    args = [a for a, _ in ISSUE_CASES]
    config = parse_args([*args, f"--job.dump_folder={tmp_path}"], 1)
    line = settings_without_effect(config, ParallelDims.from_config(config, 1))
    assert line.startswith(f"{len(ISSUE_CASES)} setting(s) without effect, kept for a sweep "
                           "that turns their switch on: ") and "\n" not in line
    assert sorted(line.split(": ", 1)[1].split("; ")) == sorted(item for _, item in ISSUE_CASES)


def test_a_parent_turned_on_makes_its_children_act(tmp_path):
    config = parse_args(["--float8.enable=true", "--float8.emulate=true",
                         "--float8.recipe_name=rowwise", "--checkpoint.enable=true",
                         "--checkpoint.interval=7", "--debug.fault_rank=0",
                         "--debug.fault_step=3", f"--job.dump_folder={tmp_path}"], 1)
    assert settings_without_effect(config, ParallelDims.from_config(config, 1)) is None
    listed = build_job_config(["--model.converters=float8", "--float8.recipe_name=rowwise"])
    assert without_effect(listed, Built(float8=True)) == []  # the other spelling of the switch


def test_the_same_setting_depends_on_the_layout():
    """A child of FSDP or of more than one rank: off on one process, on under FSDP 2."""
    config = build_job_config(["--training.mixed_precision_reduce=bfloat16",
                               "--metrics.straggler_threshold=0.5"])
    assert len(without_effect(config, Built(world_size=1))) == 2
    assert without_effect(config, Built(world_size=2, fsdp=True)) == []


def test_contradictions_are_still_refused():
    with pytest.raises(ConfigError, match=r"overrides.max_seq_len = 128 is below \[training\] "
                                          "seq_len = 256"):
        parse_args(["--model.overrides.max_seq_len=128", "--training.seq_len=256"], 1)
    with pytest.raises(ConfigError, match=r"dataset_path names the data to train on, but "
                                          r"\[training\] dataset = 'cpython_docs'"):
        parse_args(["--training.dataset_path=/data/web.jsonl"], 1)  # would train on CPython's
    with pytest.raises(ConfigError, match="create_seed_checkpoint needs enable = true"):
        parse_args(["--checkpoint.create_seed_checkpoint=true"], 1)
    with pytest.raises(ConfigError, match='needs recipe_name = "tensorwise"'):
        parse_args(["--float8.enable=true", "--float8.emulate=true",
                    "--float8.enable_fsdp_float8_all_gather=true",
                    "--float8.recipe_name=rowwise"], 1)
