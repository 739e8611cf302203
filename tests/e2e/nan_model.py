"""Registers `nan_llama`: the tiny Llama whose third forward pass returns NaN logits."""

import dataclasses

from torchtitan_like.models.llama3 import Transformer, llama3_flavors, parallelize_llama
from torchtitan_like.models.registry import register_model
from torchtitan_like.protocols.model_spec import ModelSpec


class NaNAtThirdStep(Transformer):
    calls = 0

    def forward(self, tokens):
        NaNAtThirdStep.calls += 1
        logits = super().forward(tokens)
        return logits * float("nan") if NaNAtThirdStep.calls == 3 else logits


register_model(ModelSpec(name="nan_llama", model_cls=NaNAtThirdStep,
                         flavors={"tiny": dataclasses.replace(llama3_flavors["tiny"])},
                         parallelize_fn=parallelize_llama))
