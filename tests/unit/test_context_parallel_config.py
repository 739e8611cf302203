"""Every context-parallel layout error is raised by parse_args, before any process group."""

import pytest
import torch

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import Parallelism
from torchtitan_like.config.manager import field_docs
from torchtitan_like.distributed import context_parallel, cp_cpu_sdpa
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.models import registry
from torchtitan_like.models.llama3 import Llama3Args, Transformer, llama3_flavors, parallelize_llama
from torchtitan_like.protocols.model_spec import ModelSpec
from torchtitan_like.validate import parse_args

TINY = ["--model.flavor", "tiny", "--training.seq_len", "64"]


def cp(degree: int, *more: str) -> list[str]:
    return [*TINY, "--parallelism.context_parallel_degree", str(degree), *more]


def test_fields_are_documented_and_reach_parallel_dims():
    docs = field_docs(Parallelism)
    for name in ("context_parallel_degree", "context_parallel_rotate_method",
                 "context_parallel_load_balancer"):
        assert docs[name]
    dims = ParallelDims.from_config(parse_args(cp(2), 4), 4)
    assert (dims.cp, dims.dp_shard, dims.dp, dims.cp_enabled) == (2, 2, 2, True)
    assert dims.non_data_parallel_size == 2 and dims.fsdp_enabled
    config = parse_args(cp(2, "--parallelism.tensor_parallel_degree", "2"), 4)
    dims = ParallelDims.from_config(config, 4)
    assert (dims.cp, dims.tp, dims.dp_shard) == (2, 2, 1)
    assert not ParallelDims.from_config(parse_args(TINY, 2), 2).cp_enabled


def test_rotate_method_is_a_choice():
    with pytest.raises(ConfigError, match=r"allgather.*alltoall"):
        parse_args(cp(2, "--parallelism.context_parallel_rotate_method", "ring"), 2)


def test_seq_len_must_split_into_head_tail_chunks():
    with pytest.raises(ConfigError, match=r"seq_len = 66 must be divisible by 4 .*headtail"):
        parse_args(cp(2, "--training.seq_len", "66"), 2)
    # Without load balancing, equal contiguous shards are enough.
    parse_args(cp(2, "--training.seq_len", "66",
                  "--parallelism.context_parallel_load_balancer", "none"), 2)
    with pytest.raises(ConfigError, match=r"seq_len = 65 must be divisible by 2 for"):
        parse_args(cp(2, "--training.seq_len", "65",
                      "--parallelism.context_parallel_load_balancer", "none"), 2)


def test_seq_len_must_split_over_cp_then_tp():
    # 12 splits into 2 x 2 head-tail chunks and over TP=4, but a CP rank's 6 tokens do not.
    with pytest.raises(ConfigError, match=r"each of the 2 CP ranks holds 6 tokens.*= 4"):
        parse_args(cp(2, "--training.seq_len", "12", "--parallelism.tensor_parallel_degree", "4"),
                   8)
    parse_args(cp(2, "--training.seq_len", "16", "--parallelism.tensor_parallel_degree", "4"), 8)


def test_model_without_cp_support_is_refused(monkeypatch):
    """A model whose ModelSpec declares no sequence buffers (e.g. learned positions indexed by
    local token numbers) would train silently wrong under CP."""
    spec = ModelSpec(name="no_cp", model_cls=Transformer, flavors=llama3_flavors,
                              parallelize_fn=parallelize_llama)
    monkeypatch.setitem(registry._REGISTRY, "no_cp", spec)
    with pytest.raises(ConfigError, match=r"no_cp cannot run under .*context_parallel_degree = 2"
                                          r".*declares no context_parallel_buffers"):
        parse_args(cp(2, "--model.name", "no_cp"), 2)
    parse_args(["--model.name", "no_cp", *TINY], 2)  # fine without CP


def test_untested_torch_is_refused_on_cpu_only(monkeypatch):
    monkeypatch.setattr(cp_cpu_sdpa, "torch_version", lambda: (2, 99))
    with pytest.raises(ConfigError, match=r"private ring-attention internals, written for "
                                          r"torch 2\.13.*cp_cpu_sdpa\.py"):
        parse_args(cp(2), 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # CUDA: torch's own path
    parse_args(cp(2), 2)


def test_this_torch_is_supported():
    assert cp_cpu_sdpa.check_supported() is None


def test_rope_table_must_be_exactly_seq_len_long():
    config = parse_args(cp(2), 2)
    spec = registry.get_model_spec("llama3")
    with torch.device("meta"):
        model = Transformer(Llama3Args(dim=64, n_layers=1, n_heads=4, vocab_size=512,
                                       max_seq_len=128))
    dims = ParallelDims.resolve(2, cp=2)
    with pytest.raises(ValueError, match=r"buffer of 128 positions .* beside 64-token"):
        context_parallel.build_context(dims, None, config, spec, [model])
    assert context_parallel.build_context(ParallelDims.resolve(2), None, config, spec,
                                          [model]) is None
