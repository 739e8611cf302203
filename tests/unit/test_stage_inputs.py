"""The batch on every pipeline stage and weights tied across stages, in one process.

- What a model declares in ``ModelSpec.stage_inputs`` is checked at start-up against its
  forward's keywords (models/stage_inputs.py) and handed over as keyword inputs.
- A module shared by two places of a model (the MTP head's embedding) is one Parameter under two
  names: ``tied_aliases`` finds them, and checkpoints store it once, under its first name, from
  which a pipeline stage holding only the second name loads its copy and its Adam state
  (components/checkpoint/states.py). The multi-process side (PP=2 against one process, and a
  one-process checkpoint resumed under PP=2) is tests/parallel/test_custom_model_fork.py.
"""

import dataclasses

import pytest
import torch
from harness import ROOT
from torch import nn

from torchtitan_like.components.checkpoint.states import ModelState, OptimizerState
from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.manager import build_job_config
from torchtitan_like.distributed.pipeline import prune_to_stage
from torchtitan_like.distributed.tied_weights import tied_aliases
from torchtitan_like.models.registry import get_model_spec
from torchtitan_like.models.stage_inputs import batch_inputs, check_stage_inputs, required_inputs
from torchtitan_like.validate import parse_args

EXAMPLE = ["--job.custom_import", str(ROOT / "examples/custom_model/tiny_gpt.py"),
           "--model.name=tiny_gpt", "--model.flavor=small"]


@pytest.fixture(scope="module")
def spec():
    parse_args(EXAMPLE, 1)  # registers tiny_gpt
    return get_model_spec("tiny_gpt")


def test_declared_inputs_reach_the_model(spec):
    assert required_inputs(spec, "causal") == ["token_ids", "labels"]
    assert required_inputs(spec, "block_causal") == ["token_ids", "labels", "document_ids"]
    tokens, labels = torch.tensor([[5, 257, 6]]), torch.tensor([[257, 6, 7]])
    extra = batch_inputs(["token_ids", "labels", "document_ids"], tokens, labels, eos_id=257)
    assert extra["token_ids"] is tokens and extra["labels"] is labels  # CP shards them in place
    assert extra["document_ids"].tolist() == [[0, 0, 1]]


class Plain(nn.Module):
    def forward(self, x, *, labels=None):
        return x


@pytest.mark.parametrize(("inputs", "mask", "error"), [
    ({"token_id"}, "causal", r"ModelSpec.stage_inputs has unknown \['token_id'\]"),
    ({"token_ids"}, "causal", "ModelSpec.stage_inputs declares it, but Plain.forward takes no "
                              "keyword 'token_ids'"),
    (set(), "block_causal", "block_causal\" passes it, but Plain.forward takes no keyword "
                            "'document_ids'"),
])
def test_inputs_the_model_cannot_take_are_refused(spec, inputs, mask, error):
    plain = dataclasses.replace(spec, name="plain", model_cls=Plain,
                                stage_inputs=frozenset(inputs))
    with pytest.raises(ConfigError, match=error):
        check_stage_inputs(plain, mask)
    check_stage_inputs(dataclasses.replace(plain, stage_inputs=frozenset({"labels"})), "causal")


def _mtp_model(spec):
    args = dataclasses.replace(spec.flavors["small"], n_layers=2, mtp_depth=1, dim=16,
                               n_heads=2, vocab_size=32, max_seq_len=8)
    torch.manual_seed(0)
    model = spec.model_cls(args)
    model.init_weights()
    return model


def _step(model: nn.Module) -> OptimizersContainer:
    optimizers = OptimizersContainer([model], build_job_config([]))
    sum(p.sum() for p in model.parameters()).backward()
    optimizers.step()
    return optimizers


def test_a_tied_weight_is_stored_once_and_loads_into_a_stage_copy(spec):
    model = _mtp_model(spec)
    assert tied_aliases(model) == {"mtp.0.embed.weight": "tok_emb.weight"}
    saved = ModelState([model]).state_dict()
    optimizer = OptimizerState([model], _step(model)).state_dict()
    aliased = ModelState([model], aliases=tied_aliases(model)).state_dict()
    assert "mtp.0.embed.weight" in saved and "mtp.0.embed.weight" not in aliased
    assert not any("mtp.0.embed" in key for key in optimizer)  # the optimizer sees one Parameter
    # The last pipeline stage: its own copy, reached only as mtp.0.embed.
    last = prune_to_stage(_mtp_model(spec), ["blocks.1", "ln_f", "head", "mtp.0"])
    with torch.no_grad():
        last.mtp["0"].embed.weight.zero_()
    aliases = tied_aliases(model)
    stage = ModelState([last], aliases=aliases)
    assert "tok_emb.weight" in stage.state_dict()  # saved under the first name
    stage.load_state_dict(aliased)
    assert torch.equal(last.mtp["0"].embed.weight, model.tok_emb.weight)
    stage_optimizer = OptimizerState([last], _step(last), aliases)
    assert any(k.startswith("state.tok_emb.weight.") for k in stage_optimizer.state_dict())
    stage_optimizer.load_state_dict(optimizer)
    loaded = stage_optimizer.state_dict()
    assert torch.equal(loaded["state.tok_emb.weight.exp_avg"],
                       optimizer["state.tok_emb.weight.exp_avg"])
