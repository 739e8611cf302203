"""Which blocks activation checkpointing wraps, its option errors, and exact gradients."""

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import ActivationCheckpoint
from torchtitan_like.distributed.activation_checkpoint import apply_ac, every_nth_layer
from torchtitan_like.models.llama3 import Llama3Args, Transformer
from torchtitan_like.validate import parse_args

TINY = Llama3Args(dim=64, n_layers=4, n_heads=4, vocab_size=128, multiple_of=32, max_seq_len=16)


def wrapped(mode: str, option: str = "op") -> list[bool]:
    model = Transformer(TINY)
    apply_ac(model.layers, ActivationCheckpoint(mode=mode, selective_ac_option=option))
    return [isinstance(block, CheckpointWrapper) for block in model.layers.values()]


def test_modes_wrap_the_right_blocks():
    assert wrapped("none") == [False] * 4
    assert wrapped("full") == [True] * 4
    assert wrapped("selective", "op") == [True] * 4
    assert wrapped("selective", "2") == [True, False, True, False]
    assert wrapped("selective", "3") == [True, False, False, True]


@pytest.mark.parametrize("option", ["0", "-1", "two", "1.5", ""])
def test_bad_selective_option_is_refused(option):
    with pytest.raises(ConfigError, match="selective_ac_option"):
        every_nth_layer(option)
    with pytest.raises(ConfigError, match='use "op" or a positive integer N'):
        parse_args(["--activation_checkpoint.mode", "selective",
                    "--activation_checkpoint.selective_ac_option", option], world_size=1)


@pytest.mark.parametrize("mode, option", [("full", "op"), ("selective", "op"),
                                          ("selective", "2")])
def test_gradients_equal_those_without_checkpointing(mode, option):
    tokens = torch.randint(0, TINY.vocab_size, (2, 16))
    grads = []
    for ac in (ActivationCheckpoint(), ActivationCheckpoint(mode=mode, selective_ac_option=option)):
        torch.manual_seed(0)
        model = Transformer(TINY)
        model.init_weights()
        apply_ac(model.layers, ac)
        model(tokens).square().mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for plain, checkpointed in zip(*grads, strict=True):
        torch.testing.assert_close(checkpointed, plain, rtol=0, atol=0)
