"""The batch on every pipeline stage: keyword inputs a model takes from the step's batch.

Under pipeline parallelism a stage other than the first receives only the previous stage's
activations. A module there that needs the batch itself (a multi-token-prediction head needs the
token ids and the labels, block-causal attention the document ids) gets it as a keyword input
of the model's forward: the trainer passes the same keywords to every stage (torch's schedules
cut keyword inputs into the same microbatches as the positional input) and to the whole model
without PP, in training and in validation. The model declares what it takes in
``ModelSpec.stage_inputs``, among:

- ``token_ids``: the microbatch's input token ids, (batch, seq) int64, as the first stage
  receives them positionally;
- ``labels``: its labels, (batch, seq) int64 (``protocols/loss.IGNORE_INDEX`` where a
  position is not scored, e.g. masked by ``Trainer.post_dataloading_process``);
- ``document_ids``: each token's document (models/attention_masks.py), given whenever
  ``[model] attn_mask_type = "block_causal"``, declared or not.

Under context parallelism ``token_ids`` and ``labels`` are the very tensors the CP context
shards in place, so a stage sees this rank's sequence chunks of them, aligned with its
activations. What a model declares is checked at start-up against its forward's keywords.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.models.attention_masks import document_ids

if TYPE_CHECKING:
    from torchtitan_like.protocols.model_spec import ModelSpec

STAGE_INPUTS = ("token_ids", "labels", "document_ids")
"""Every keyword input the trainer can hand a model's stages (module docstring)."""


def required_inputs(spec: ModelSpec, attn_mask_type: str) -> list[str]:
    """The keyword inputs the trainer passes to ``spec``'s model, in ``STAGE_INPUTS`` order."""
    wanted = set(spec.stage_inputs) | ({"document_ids"} if attn_mask_type == "block_causal"
                                       else set())
    return [name for name in STAGE_INPUTS if name in wanted]


def check_stage_inputs(spec: ModelSpec, attn_mask_type: str) -> None:
    """ConfigError if ``spec`` declares an unknown stage input, or one (or the document ids of
    block-causal attention) that its model's forward takes no keyword for."""
    unknown = sorted(set(spec.stage_inputs) - set(STAGE_INPUTS))
    if unknown:
        raise ConfigError(f"model {spec.name!r}: ModelSpec.stage_inputs has unknown {unknown}; "
                          f"use some of {', '.join(STAGE_INPUTS)}")
    forward = getattr(spec.model_cls, "forward", None)
    if not inspect.isclass(spec.model_cls) or forward is None:
        return  # a factory function: its model's forward is known only once built
    parameters = inspect.signature(forward).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return
    keywords = {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    for name in required_inputs(spec, attn_mask_type):
        if name not in keywords:
            why = ("[model] attn_mask_type = \"block_causal\" passes it" if name == "document_ids"
                   and name not in spec.stage_inputs else "ModelSpec.stage_inputs declares it")
            raise ConfigError(
                f"model {spec.name!r}: {why}, but {spec.model_cls.__name__}.forward takes no "
                f"keyword {name!r}; add `{name}=None` to the forward or drop it from "
                "ModelSpec.stage_inputs")


def batch_inputs(names: list[str], inputs: torch.Tensor, labels: torch.Tensor,
                 eos_id: int) -> dict[str, torch.Tensor]:
    """The keyword inputs ``names`` (``required_inputs``) of one microbatch."""
    available = {"token_ids": lambda: inputs, "labels": lambda: labels,
                 "document_ids": lambda: document_ids(inputs, eos_id)}
    return {name: available[name]() for name in names}
