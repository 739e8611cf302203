from torchtitan_like.models.attention_masks import MASK_TYPES
from torchtitan_like.models.llama3 import context_parallel_buffers, pipeline_llama
from torchtitan_like.models.qwen3.args import Qwen3Args, qwen3_flavors
from torchtitan_like.models.qwen3.hf_adapter import Qwen3HFAdapter
from torchtitan_like.models.qwen3.model import Qwen3Model
from torchtitan_like.models.qwen3.parallelize import parallelize_qwen3
from torchtitan_like.models.registry import register_model
from torchtitan_like.protocols.model_spec import ModelSpec

register_model(
    ModelSpec(
        name="qwen3",
        model_cls=Qwen3Model,
        flavors=qwen3_flavors,
        parallelize_fn=parallelize_qwen3,
        hf_adapter=Qwen3HFAdapter,
        context_parallel_buffers=context_parallel_buffers,
        pipelining_fn=pipeline_llama,
        attn_mask_types=MASK_TYPES,
    )
)

__all__ = ["Qwen3Args", "Qwen3HFAdapter", "Qwen3Model", "parallelize_qwen3", "qwen3_flavors"]
