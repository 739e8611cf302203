"""A test model for ``[job] custom_import``: the tiny Llama with tied embedding and head weights
(as the 1B and 3B flavors have), registered as ``[model] name = "llama3_tied"``."""

import dataclasses

from torchtitan_like.models.llama3 import (
    Llama3Args,
    Transformer,
    context_parallel_buffers,
    llama3_flavors,
    parallelize_llama,
)
from torchtitan_like.models.registry import register_model
from torchtitan_like.protocols.model_spec import ModelSpec

TIED: dict[str, Llama3Args] = {
    "tiny": dataclasses.replace(llama3_flavors["tiny"], tie_word_embeddings=True)
}

register_model(ModelSpec(name="llama3_tied", model_cls=Transformer, flavors=TIED,
                         parallelize_fn=parallelize_llama,
                         context_parallel_buffers=context_parallel_buffers))
