"""MemTracker measurement of a step's activation memory, and Korthikanti's formula."""

import pytest
import torch

from torchtitan_like.components.memory import korthikanti_activation_bytes, measure_step_memory
from torchtitan_like.config.job_config import ActivationCheckpoint
from torchtitan_like.distributed.activation_checkpoint import apply_ac
from torchtitan_like.models.llama3 import Llama3Args, Transformer

ARGS = Llama3Args(dim=64, n_layers=2, n_heads=4, vocab_size=128, multiple_of=32, max_seq_len=32)
BATCH, SEQ = 2, 32


def measure(mode: str, option: str = "op", optimizer: bool = False):
    torch.manual_seed(0)
    model = Transformer(ARGS)
    model.init_weights()
    apply_ac(model.layers, ActivationCheckpoint(mode=mode, selective_ac_option=option))
    tokens = torch.randint(0, ARGS.vocab_size, (BATCH, SEQ))
    return measure_step_memory(
        model, lambda: model(tokens).square().mean(), device=torch.device("cpu"),
        blocks=list(model.layers.values()),
        optimizer=torch.optim.AdamW(model.parameters()) if optimizer else None)


def test_full_checkpointing_keeps_only_each_block_output():
    memory = measure("full")
    assert memory.per_block == [BATCH * SEQ * ARGS.dim * 4] * ARGS.n_layers


def test_checkpointing_modes_order_the_memory():
    none, op, every2, full = (measure("none"), measure("selective", "op"),
                              measure("selective", "2"), measure("full"))
    per_layer = [sum(m.per_block) for m in (none, op, every2, full)]
    assert per_layer == sorted(per_layer, reverse=True) and len(set(per_layer)) == 4
    assert every2.per_block[1] == none.per_block[1] and every2.per_block[0] == full.per_block[0]
    assert none.peak_activations > full.peak_activations
    assert none.after_forward["Activation"] > full.after_forward["Activation"]


def test_optimizer_states_and_gradients_are_counted():
    memory = measure("none", optimizer=True)
    params = sum(p.numel() * 4 for p in Transformer(ARGS).parameters())
    assert memory.peak["Parameter"] == params
    assert memory.peak["Gradient"] + memory.peak["Optstate"] >= params


def test_korthikanti_formula():
    shape = {"seq_len": 2048, "batch": 1, "dim": 12288, "n_heads": 96}  # GPT-3 175B
    sbh = 2048 * 12288
    assert korthikanti_activation_bytes("none", **shape) == pytest.approx(sbh * (34 + 80))
    assert korthikanti_activation_bytes("selective", **shape) == 34 * sbh
    assert korthikanti_activation_bytes("full", **shape) == 2 * sbh
    assert korthikanti_activation_bytes("full", every=2, **shape) == pytest.approx(sbh * 58)
    assert korthikanti_activation_bytes("full", bytes_per_element=4, **shape) == 4 * sbh
