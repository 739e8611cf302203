from torchtitan_like.models.attention_masks import MASK_TYPES
from torchtitan_like.models.llama3.args import Llama3Args, llama3_flavors
from torchtitan_like.models.llama3.hf_adapter import Llama3HFAdapter
from torchtitan_like.models.llama3.model import Transformer
from torchtitan_like.models.llama3.parallelize import context_parallel_buffers, parallelize_llama
from torchtitan_like.models.llama3.pipeline import pipeline_llama
from torchtitan_like.models.registry import register_model
from torchtitan_like.protocols.model_spec import ModelSpec

register_model(
    ModelSpec(
        name="llama3",
        model_cls=Transformer,
        flavors=llama3_flavors,
        parallelize_fn=parallelize_llama,
        hf_adapter=Llama3HFAdapter,
        context_parallel_buffers=context_parallel_buffers,
        pipelining_fn=pipeline_llama,
        attn_mask_types=MASK_TYPES,
    )
)

__all__ = ["Llama3Args", "Llama3HFAdapter", "Transformer", "context_parallel_buffers",
           "llama3_flavors", "parallelize_llama", "pipeline_llama"]
