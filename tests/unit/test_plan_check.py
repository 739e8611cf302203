"""The plan check (distributed/plan_check.py), in this process on meta models and a fake world.

Each case is a plan that leaves a switch unapplied, refused with one line naming the model, the
switch and the module: FSDP forgotten under data parallelism (and HSDP's replicate dim
forgotten), a second block group left out of activation checkpointing or compile, blocks
wrapped against the every-N-th rule, and logits that contradict the recorded loss parallel
setting. The parity runs of tests/parallel exercise the passing side on every real layout
(dense, HSDP, TP, EP with and without expert FSDP, ETP 1, PP).
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import build_job_config
from torchtitan_like.distributed.activation_checkpoint import apply_ac
from torchtitan_like.distributed.compile import apply_compile
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.plan_check import check_logits, check_plan_applied
from torchtitan_like.distributed.plan_toolkit import apply_block_tail

pytestmark = pytest.mark.filterwarnings("ignore:Set timeout is now only supported")


class TwoGroups(nn.Module):
    """A trunk of 3 blocks and a second block group of 1 (an MTP-like head)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.blocks = nn.ModuleDict({str(i): nn.Linear(8, 8) for i in range(3)})
        self.mtp = nn.ModuleDict({"0": nn.Linear(8, 8)})
        self.head = nn.Linear(8, 16)


@pytest.fixture
def fake_world(request):
    """A fake process group of ``request.param`` ranks (rank 0): meshes build, nothing runs."""
    dist.init_process_group("fake", rank=0, world_size=request.param, store=FakeStore())
    yield request.param
    dist.destroy_process_group()


def _config(*overrides: str):
    return build_job_config(list(overrides))


def _model() -> TwoGroups:
    with torch.device("meta"):
        return TwoGroups()


@pytest.mark.parametrize("fake_world", [2], indirect=True)
def test_a_plan_without_fsdp_under_data_parallelism_is_refused(fake_world):
    dims = ParallelDims.resolve(2, dp_shard=2)
    meshes, config = dims.build_meshes("cpu"), _config()
    lazy = _model()
    with pytest.raises(ConfigError, match=r"model 'fork'.* did not apply FSDP/HSDP to 11 "
                                          r"parameter\(s\) \(e.g. embed.weight, sharded or "
                                          r"replicated over 1 of the 2 data-parallel ranks"):
        check_plan_applied("fork", [lazy], dims, config)
    planned = _model()
    apply_block_tail(planned, [planned.blocks, planned.mtp], dims, meshes, config)
    check_plan_applied("fork", [planned], dims, config)


@pytest.mark.parametrize("fake_world", [4], indirect=True)
def test_hsdp_without_the_replicate_dim_is_refused(fake_world):
    dims = ParallelDims.resolve(4, dp_replicate=2, dp_shard=2)
    meshes, config = dims.build_meshes("cpu"), _config()
    model = _model()
    fully_shard(model, mesh=meshes.fsdp["dp_shard_cp"])  # sharded, never replicated
    with pytest.raises(ConfigError, match=r"over 2 of the 4 data-parallel ranks"):
        check_plan_applied("fork", [model], dims, config)
    model = _model()
    fully_shard(model, mesh=meshes.fsdp)
    check_plan_applied("fork", [model], dims, config)


@pytest.mark.parametrize(("overrides", "left_out", "message"), [
    (["--activation_checkpoint.mode=full"], "mtp", "activation checkpointing to block mtp.0"),
    (["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=2"],
     "mtp", "activation checkpointing to block mtp.0, but .*selective_ac_option = '2'"),
    (["--compile.enable=true"], "mtp", "torch.compile to block mtp.0"),
    (["--compile.enable=true"], "blocks", "torch.compile to block blocks.0"),
])
def test_every_block_group_is_checked(overrides, left_out, message):
    config = _config(*overrides)
    dims = ParallelDims.resolve(1)
    model = _model()
    for name in ("blocks", "mtp"):
        if name != left_out:
            apply_ac(getattr(model, name), config.activation_checkpoint)
            apply_compile(getattr(model, name), config.compile)
    with pytest.raises(ConfigError, match=f"model 'fork': .* did not apply {message}"):
        check_plan_applied("fork", [model], dims, config)
    planned = _model()
    for name in ("blocks", "mtp"):
        apply_ac(getattr(planned, name), config.activation_checkpoint)
        apply_compile(getattr(planned, name), config.compile)
    check_plan_applied("fork", [planned], dims, config)


def test_every_nth_block_means_exactly_those():
    every_2 = _config("--activation_checkpoint.mode=selective",
                      "--activation_checkpoint.selective_ac_option=2")
    model = _model()
    for group in (model.blocks, model.mtp):
        apply_ac(group, _config("--activation_checkpoint.mode=full").activation_checkpoint)
    with pytest.raises(ConfigError, match=r"block blocks.1 \(not an N-th block\)"):
        check_plan_applied("fork", [model], ParallelDims.resolve(1), every_2)


@pytest.mark.parametrize("fake_world", [2], indirect=True)
def test_logits_must_match_the_recorded_loss_parallel(fake_world):
    tp = ParallelDims.resolve(2, tp=2).build_meshes("cpu").tp
    sharded = DTensor.from_local(torch.zeros(2, 4, 8), tp, [Shard(2)], run_check=False)
    whole = DTensor.from_local(torch.zeros(2, 4, 16), tp, [Replicate()], run_check=False)
    check_logits(sharded, True, "fork")
    check_logits(torch.zeros(2, 4, 16), False, "fork")
    check_logits(whole, False, "fork")
    with pytest.raises(ConfigError, match=r"model 'fork': the loss received whole logits .* "
                                          r"declare ModelSpec\(loss_parallel=False\)"):
        check_logits(torch.zeros(2, 4, 16), True, "fork")
    with pytest.raises(ConfigError, match="received vocab-sharded logits, but loss parallel is "
                                          "off"):
        check_logits(sharded, False, "fork")
