"""Test models for ``[job] custom_import`` exercising the plan toolkit and the plan check.

- ``llama3_gated``: the tiny Llama whose feed-forward scales its input by a learned sigmoid
  gate, ``w2(silu(w1 g x) * w3 g x)`` with ``g = sigmoid(gate(x))``; under TP the gate is kept
  whole on every rank with ``tp_styles.NoParallel`` (as a MoE router is).
- ``llama3_lazy_plan``: the tiny Llama with a plan that only applies FSDP, claiming every
  dimension: it skips activation checkpointing, compile and TP, which the trainer must refuse.
"""

import dataclasses

import torch
from torch import nn
from torch.distributed.tensor.parallel import parallelize_module

from torchtitan_like.distributed.fsdp import apply_fsdp
from torchtitan_like.distributed.tp_styles import NoParallel
from torchtitan_like.models.llama3 import Llama3Args, llama3_flavors, parallelize_llama
from torchtitan_like.models.llama3.model import FeedForward, Transformer
from torchtitan_like.models.llama3.pipeline import pipeline_llama
from torchtitan_like.models.registry import register_model
from torchtitan_like.protocols.model_spec import ModelSpec

TINY = {"tiny": dataclasses.replace(llama3_flavors["tiny"])}


class GatedFeedForward(FeedForward):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__(dim, hidden_dim)
        self.gate = nn.Linear(dim, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * torch.sigmoid(self.gate(x)))

    def init_weights(self, init_std: float) -> None:
        super().init_weights(init_std)
        nn.init.trunc_normal_(self.gate.weight, mean=0.0, std=0.02)


class GatedTransformer(Transformer):
    def __init__(self, args: Llama3Args):
        super().__init__(args)
        for block in self.layers.values():
            block.feed_forward = GatedFeedForward(args.dim, args.ffn_hidden_dim)


def parallelize_gated(model, parallel_dims, meshes, config):
    if parallel_dims.tp_enabled:  # before the Llama plan wraps the blocks
        for block in model.layers.values():
            parallelize_module(block.feed_forward.gate, meshes.tp,
                               NoParallel(use_local_output=False))
    return parallelize_llama(model, parallel_dims, meshes, config)


def lazy_plan(model, parallel_dims, meshes, config):
    if parallel_dims.fsdp_enabled:
        apply_fsdp(model, meshes.fsdp, [], param_dtype=torch.float32,
                   reduce_dtype=torch.float32, reshard=True)
    return model


register_model(ModelSpec(name="llama3_gated", model_cls=GatedTransformer, flavors=TINY,
                         parallelize_fn=parallelize_gated, pipelining_fn=pipeline_llama))
register_model(ModelSpec(name="llama3_lazy_plan", model_cls=Transformer, flavors=TINY,
                         parallelize_fn=lazy_plan))
