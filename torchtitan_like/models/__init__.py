"""Built-in models; importing this package registers them."""

from torchtitan_like.models import deepseek_v3, llama3, qwen3  # noqa: F401
from torchtitan_like.models.registry import register_model
from torchtitan_like.protocols.model_args import BaseModelArgs
from torchtitan_like.protocols.model_spec import ModelSpec

__all__ = ["BaseModelArgs", "ModelSpec", "register_model"]
