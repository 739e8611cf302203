"""``[fault_tolerance]`` at start-up (distributed/fault_tolerance.py): each job it cannot run
is refused with one line; a group's data share, folders and microbatches."""

import importlib.util

import pytest

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed import fault_tolerance
from torchtitan_like.validate import grad_accumulation_steps, parse_args

FT = ["--fault_tolerance.enable=true", "--fault_tolerance.group_size=2"]


@pytest.fixture
def lighthouse(monkeypatch):
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://127.0.0.1:29510")


@pytest.mark.parametrize(("args", "message"), [
    (["--fault_tolerance.replica_id=2"], "replica_id = 2: must be in 0..1"),
    (["--fault_tolerance.min_replica_size=3"], "min_replica_size = 3 exceeds group_size = 2"),
    (["--parallelism.data_parallel_replicate_degree=2"], "data_parallel_replicate_degree = 1"),
    (['--fault_tolerance.process_group=nccl'], 'process_group = "nccl" needs CUDA'),
    (["--validation.enable=true"], "[validation] enable is not supported"),
    (["--checkpoint.enable=true", "--checkpoint.keep_latest_k=1"], "keep at least 2"),
])
def test_jobs_that_cannot_run_are_refused_in_one_line(lighthouse, args, message):
    world = 2 if "replicate" in args[0] else 1
    with pytest.raises(ConfigError) as error:
        parse_args([*FT, *args], world)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_lighthouse_and_the_extra_are_required(monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(ConfigError, match="set TORCHFT_LIGHTHOUSE="):
        parse_args(FT, 1)
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://127.0.0.1:29510")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torchft" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"needs torchft \(the ft extra\): pip install -e"):
        parse_args(FT, 1)


def test_fields_without_enable_take_no_effect(tmp_path):
    """Not refused: named in the start-up warning (tests/unit/test_switches.py)."""
    config = parse_args(["--fault_tolerance.replica_id=1", f"--job.dump_folder={tmp_path}"], 1)
    fault_tolerance.place_group(config)
    assert config.job.dump_folder == str(tmp_path)
    assert fault_tolerance.data_share(config, 1, 2) == (1, 2)


def test_a_group_reads_its_share_and_writes_its_own_folder(lighthouse, tmp_path):
    config = parse_args([*FT, "--fault_tolerance.replica_id=1", f"--job.dump_folder={tmp_path}",
                         "--training.local_batch_size=2", "--training.global_batch_size=8"], 2)
    # rank r of group g reads as rank g x dp + r of the job's 2 x 2 data-parallel ranks.
    assert fault_tolerance.data_share(config, 1, 2) == (3, 4)
    assert grad_accumulation_steps(config, 2) == 1  # 8 = 2 per rank x 2 ranks x 2 groups
    assert config.job.dump_folder == str(tmp_path / "replica_1")
    assert config.checkpoint.folder == str(tmp_path / "checkpoint")  # shared by the groups
    fault_tolerance.place_group(config)  # a config.toml written by the group runs as it is
    assert config.job.dump_folder == str(tmp_path / "replica_1")
