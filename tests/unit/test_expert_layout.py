"""Expert-parallel layout: every impossible EP/ETP setting is one ConfigError before any
process group starts, and the expert mesh places ranks as docs/expert-parallel.md says."""

import pytest
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Parallelism
from torchtitan_like.config.manager import field_docs
from torchtitan_like.distributed.expert_layout import (
    efsdp_degree,
    expert_fsdp_mesh,
    validate_expert_layout,
)
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.validate import parse_args

TINY = ["--model.flavor", "tiny", "--training.seq_len", "64"]


def test_fields_are_documented_and_reach_parallel_dims():
    docs = field_docs(Parallelism)
    assert docs["expert_parallel_degree"] and docs["expert_tensor_parallel_degree"]
    dims = ParallelDims.resolve(8, dp_shard=4, tp=2, ep=4, etp=2)
    assert (dims.ep, dims.etp, efsdp_degree(dims), dims.ep_enabled) == (4, 2, 1, True)
    assert efsdp_degree(ParallelDims.resolve(8, tp=2, ep=2)) == 4  # ETP 1: EP borrows TP too


def test_dense_model_refuses_ep():
    with pytest.raises(ConfigError, match="no mixture-of-experts layers; set both to 1"):
        parse_args([*TINY, "--parallelism.expert_parallel_degree", "2"], 2)


@pytest.mark.parametrize("world, kwargs, experts, message", [
    (2, {"ep": 0}, 8, "expert_parallel_degree = 0: must be >= 1"),
    (4, {"tp": 2, "etp": 3}, 8, "expert_tensor_parallel_degree = 3 must be 1 or "
                                "tensor_parallel_degree = 2"),
    (4, {"tp": 2, "etp": 2, "ep": 4}, 8, r"must divide the ranks it borrows, dp_shard x cp = 2"),
    (6, {"ep": 4}, 8, r"must divide the ranks it borrows, dp_shard x cp = 6"),
    (4, {"ep": 4}, 6, "must divide the model's 6 routed experts"),
    (8, {"ep": 2, "tp": 2, "etp": 2}, 8, "expert weights over the 2 ranks that would share"),
    (8, {"ep": 4, "tp": 2}, 8, "expert_tensor_parallel_degree = 1 with tensor_parallel"),
    (2, {"tp": 2}, 8, "expert_tensor_parallel_degree = 1 with tensor_parallel_degree = 2"),
])
def test_impossible_layouts(world, kwargs, experts, message):
    with pytest.raises(ConfigError, match=message):
        validate_expert_layout(ParallelDims.resolve(world, **kwargs), experts)


def test_possible_layouts():
    for kwargs in ({"ep": 2}, {"ep": 2, "cp": 2}, {"ep": 4, "pp": 2, "dp_replicate": 1},
                   {"tp": 2, "etp": 2}, {"tp": 4, "etp": 4, "pp": 2},
                   {"ep": 4, "tp": 2, "etp": 2}):
        validate_expert_layout(ParallelDims.resolve(8, **kwargs), 8)


@pytest.mark.parametrize("model", [["--model.name", "qwen3", "--model.flavor", "debugmodel_moe"],
                                   ["--model.name", "deepseek_v3", "--model.flavor",
                                    "debugmodel"]])
def test_moe_models_take_tensor_parallel(model):
    """TP with the experts split over it starts, also with the aux loss; ETP = 1 under TP and
    float8 do not."""
    tp = ["--parallelism.tensor_parallel_degree", "2"]
    parse_args([*model, *tp, "--parallelism.expert_tensor_parallel_degree", "2"], 2)
    with pytest.raises(ConfigError, match="set expert_tensor_parallel_degree = 2"):
        parse_args([*model, *tp], 2)
    with pytest.raises(ConfigError, match=r"float8\] enable with .* is not supported"):
        parse_args([*model, *tp, "--parallelism.expert_tensor_parallel_degree", "2",
                    "--float8.enable", "true", "--float8.emulate", "true"], 2)
    parse_args([*model, "--model.overrides.moe.aux_loss_coeff=0.01", *tp,
                "--parallelism.expert_tensor_parallel_degree", "2"], 2)


@pytest.fixture
def fake_world():
    """A process group of 8 fake ranks in this process: meshes build, no collective runs."""
    dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
    yield
    dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore:Set timeout is now only supported")  # the fake backend
def test_worked_example_of_the_docs(fake_world):
    """pp 1 x dp_replicate 2 x dp_shard 2 x cp 1 x tp 2, EP 2, ETP 1 (docs/expert-parallel.md)."""
    meshes = ParallelDims.resolve(8, dp_replicate=2, dp_shard=2, tp=2, ep=2).build_meshes("cpu")
    assert meshes.fsdp.mesh.tolist() == [[1, 3], [5, 7]]  # rank 5's dense FSDP (HSDP) mesh
    assert meshes.tp.mesh.tolist() == [4, 5]
    assert meshes.expert["ep"].mesh.tolist() == [4, 5]  # EP borrowed the TP pair
    assert meshes.expert["efsdp"].mesh.tolist() == [5, 7]
    assert expert_fsdp_mesh(meshes.expert).mesh.tolist() == [[1, 3], [5, 7]]
    meshes = ParallelDims.resolve(8, dp_shard=4, tp=2, ep=2, etp=2).build_meshes("cpu")
    assert meshes.expert["ep"].mesh.tolist() == [5, 7]  # ETP = TP: EP within dp_shard
    assert meshes.expert["efsdp"].mesh.tolist() == [1, 5]
    assert meshes.expert["etp"].mesh.tolist() == meshes.tp.mesh.tolist() == [4, 5]
