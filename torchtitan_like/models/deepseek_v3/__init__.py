from torchtitan_like.models.attention_masks import MASK_TYPES
from torchtitan_like.models.deepseek_v3.args import (
    DeepSeekV3Args,
    YarnScaling,
    deepseek_v3_flavors,
)
from torchtitan_like.models.deepseek_v3.hf_adapter import DeepSeekV3HFAdapter
from torchtitan_like.models.deepseek_v3.model import DeepSeekV3Model
from torchtitan_like.models.deepseek_v3.parallelize import (
    parallelize_deepseek_v3,
    register_optimizer_hooks,
)
from torchtitan_like.models.deepseek_v3.pipeline import pipeline_deepseek_v3
from torchtitan_like.models.llama3 import context_parallel_buffers
from torchtitan_like.models.registry import register_model
from torchtitan_like.protocols.model_spec import ModelSpec

register_model(
    ModelSpec(
        name="deepseek_v3",
        model_cls=DeepSeekV3Model,
        flavors=deepseek_v3_flavors,
        parallelize_fn=parallelize_deepseek_v3,
        hf_adapter=DeepSeekV3HFAdapter,
        # tok_embeddings, layers.0 .. n-1, norm, output (as llama3), then the MTP modules
        pipelining_fn=pipeline_deepseek_v3,
        # the MTP modules, on the last stage under PP, read the token ids and the labels
        stage_inputs=frozenset({"token_ids", "labels"}),
        register_optimizer_hooks=register_optimizer_hooks,
        # Its RoPE table, (seq_len, qk_rope_head_dim), by rows, as llama3's; the values, narrower
        # than queries and keys, are padded for ring attention (distributed/context_parallel.py).
        context_parallel_buffers=context_parallel_buffers,
        attn_mask_types=MASK_TYPES,
    )
)

__all__ = ["DeepSeekV3Args", "DeepSeekV3HFAdapter", "DeepSeekV3Model", "YarnScaling",
           "deepseek_v3_flavors", "parallelize_deepseek_v3", "register_optimizer_hooks"]
