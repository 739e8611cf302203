"""Every tensor-parallel layout error is raised by parse_args, before any process group."""

import logging

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig, Parallelism
from torchtitan_like.config.manager import build_job_config, field_docs
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.tensor_parallel import async_tp_on, maybe_enable_async_tp
from torchtitan_like.logging import logger
from torchtitan_like.models.llama3 import Llama3Args
from torchtitan_like.validate import parse_args

TINY = ["--model.flavor", "tiny", "--training.seq_len", "64"]


def tp(degree: int, *more: str) -> list[str]:
    return [*TINY, "--parallelism.tensor_parallel_degree", str(degree), *more]


def test_fields_are_documented_and_reach_parallel_dims():
    docs = field_docs(Parallelism)
    for name in ("tensor_parallel_degree", "disable_loss_parallel",
                 "enable_async_tensor_parallel"):
        assert docs[name]
    dims = ParallelDims.from_config(parse_args(tp(2), 4), 4)
    assert (dims.tp, dims.dp_shard, dims.loss_parallel_enabled) == (2, 2, True)
    dims = ParallelDims.from_config(parse_args(tp(2, "--parallelism.disable_loss_parallel"), 2), 2)
    assert (dims.tp, dims.loss_parallel_enabled) == (2, False)
    assert not ParallelDims.from_config(parse_args(TINY, 2), 2).loss_parallel_enabled  # no TP


@pytest.mark.parametrize("degree, world, field", [
    (3, 3, "n_heads = 8"),  # tiny: 8 query heads, 4 KV heads
    (8, 8, "n_kv_heads = 4"),
])
def test_heads_must_divide(degree, world, field):
    with pytest.raises(ConfigError, match=f"{field} is not divisible by .*tensor_parallel_degree"):
        parse_args(tp(degree, "--training.seq_len", "48"), world)


def test_vocab_must_divide():
    args = Llama3Args(dim=64, n_layers=1, n_heads=4, vocab_size=1001)
    with pytest.raises(ConfigError, match="vocab_size = 1001 is not divisible"):
        args.validate(JobConfig(), ParallelDims.resolve(2, tp=2))


def test_seq_len_must_divide_for_sequence_parallel():
    with pytest.raises(ConfigError, match=r"seq_len = 65 must be divisible by .*= 2"):
        parse_args(tp(2, "--training.seq_len", "65"), 2)


def test_degrees_must_multiply_to_world():
    with pytest.raises(ConfigError, match="do not multiply to the world size"):
        parse_args(tp(4, "--parallelism.data_parallel_shard_degree", "2"), 4)


COMPILED = ["--compile.enable", "true"]
ASYNC = "--parallelism.enable_async_tensor_parallel"


def test_async_tp_refused_on_cpu():
    with pytest.raises(ConfigError, match=r"needs CUDA GPUs.*silently does nothing"):
        parse_args(tp(2, ASYNC, *COMPILED), 2)


def test_async_tp_without_tp_or_compiled_blocks_takes_no_effect():
    """Its parents are TP and compiled blocks (an inductor pass): without one it is a setting
    without effect (tests/unit/test_switches.py), so on this CPU it is not refused for CUDA."""
    parse_args([*TINY, ASYNC, *COMPILED], 2)  # no TP
    for args in (tp(2, ASYNC), tp(2, ASYNC, *COMPILED, "--compile.components", "loss")):
        assert not async_tp_on(parse_args(args, 2))


@pytest.fixture
def log(caplog):
    logger.addHandler(caplog.handler)  # the package logger may not propagate to the root
    caplog.set_level(logging.WARNING, logger=logger.name)
    yield caplog
    logger.removeHandler(caplog.handler)


def test_tp_across_nodes_is_a_warning(monkeypatch, log):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun: 2 processes on each node
    parse_args(tp(4), 4)
    assert "larger than the 2 devices of one node" in log.text
    log.clear()
    parse_args(tp(2), 4)
    assert not log.text


def test_async_tp_setup_registers_the_tp_group():
    """The GPU path's calls, checked against this torch on a one-process gloo group (the
    inductor pass itself only fires on CUDA): the flag is set and the TP group is one the
    micro-pipeline pass accepts."""
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import is_symm_mem_enabled_for_group

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    # inductor's own patch(): monkeypatch would restore the entry by deleting it (it is not in
    # the module's __dict__), hiding it from every later compile in this process
    try:
        with inductor_config.patch(_micro_pipeline_tp=False):
            mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
            off = build_job_config([ASYNC])  # without compiled blocks
            maybe_enable_async_tp(off, mesh)
            assert not torch._inductor.config._micro_pipeline_tp
            maybe_enable_async_tp(build_job_config([ASYNC, *COMPILED]), mesh)
            assert torch._inductor.config._micro_pipeline_tp
            assert is_symm_mem_enabled_for_group(mesh.get_group().group_name)
    finally:
        dist.destroy_process_group()
