"""A test model for ``[job] custom_import``: the tiny Llama whose blocks add a z-loss-like term
on their output through the loss hook and report metrics (protocols/step_hooks.py),
registered as ``[model] name = "llama3_zloss"``.

Each block adds ``Z_COEF * sum_t logsumexp(h_t)^2`` over its output's tokens, records the
number of tokens it saw ("z/tokens", sum), its largest logsumexp ("z/max", max) and its mean
("z/mean", mean); the last block also records [sum, count] with a ``derive`` giving their
ratio ("z/last_mean"), which under PP only the last stage knows how to derive.
"""

import dataclasses

import torch
from torch import nn

from torchtitan_like.models.llama3 import Llama3Args, llama3_flavors, parallelize_llama
from torchtitan_like.models.llama3.model import Transformer, TransformerBlock
from torchtitan_like.models.llama3.pipeline import pipeline_llama
from torchtitan_like.models.registry import register_model
from torchtitan_like.protocols.model_spec import ModelSpec

Z_COEF = 1e-2


def _ratio(total: torch.Tensor) -> float:
    return float(total[0] / total[1])


class ZLossBlock(TransformerBlock):
    def __init__(self, layer_id: int, args: Llama3Args):
        super().__init__(layer_id, args)
        self.last = layer_id == args.n_layers - 1
        self.step_hooks = None

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = super().forward(x, rope)
        if self.step_hooks is None:
            return h
        z = torch.logsumexp(h.float(), dim=-1)
        h = self.step_hooks.add_loss("z", h, Z_COEF * (z**2).sum())
        self.step_hooks.record_metric("z/tokens", z.new_tensor(float(z.numel())))
        self.step_hooks.record_metric("z/max", z.detach().amax(), reduce="max")
        self.step_hooks.record_metric("z/mean", z.detach().mean(), reduce="mean", console=False)
        if self.last:
            stats = torch.stack([z.detach().sum(), z.new_tensor(float(z.numel()))])
            self.step_hooks.record_metric("z/last_mean", stats, derive=_ratio)
        return h


class ZLossTransformer(Transformer):
    def __init__(self, args: Llama3Args):
        super().__init__(args)
        self.layers = nn.ModuleDict({str(i): ZLossBlock(i, args) for i in range(args.n_layers)})


register_model(ModelSpec(name="llama3_zloss", model_cls=ZLossTransformer,
                         flavors={"tiny": dataclasses.replace(llama3_flavors["tiny"])},
                         parallelize_fn=parallelize_llama, pipelining_fn=pipeline_llama))
