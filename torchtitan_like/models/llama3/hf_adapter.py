"""This Llama 3 <-> HuggingFace ``LlamaForCausalLM``: parameter names and config.json.

The two models compute the same function with the same tensors under other names. Our RoPE
rotates halves (``x * cos + rotate_half(x) * sin``, model.py), the layout HF's Llama uses, so
the q/k projections map one to one; a checkpoint in Meta's original layout (interleaved pairs)
would need its q/k rows permuted, these do not. A tied head (``tie_word_embeddings``) is the
embedding table in both models, stored once. The logits test (tests/e2e/test_hf.py) checks the
mapping against ``transformers`` itself.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from torchtitan_like.models.hf_names import DTYPE_NAMES, HFNames
from torchtitan_like.models.llama3.args import Llama3Args, RopeScaling

_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_IGNORED_HF = re.compile(r".*rotary_emb\.inv_freq")  # a buffer some old exports contain


class Llama3HFAdapter:
    """Converts state dicts and configs of one Llama 3 shape (``args``) to and from HF's."""

    def __init__(self, args: Llama3Args):
        self.args = args
        self.names = HFNames(_TOP, _BLOCK)

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Our FQNs -> HF names (values untouched, so DTensors stay shards)."""
        out = {}
        for key, value in state_dict.items():
            if (name := self.names.to_hf(key)) is None:
                raise ValueError(f"no HuggingFace name for parameter {key!r}")
            out[name] = value
        return out

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        """HF names -> our FQNs (a tied model has no head of its own: an ``lm_head`` that some
        exports repeat is dropped)."""
        out = {}
        for key, value in hf_state_dict.items():
            if key == "lm_head.weight" and self.args.tie_word_embeddings:
                continue
            if (name := self.names.from_hf(key)) is not None:
                out[name] = value
            elif not _IGNORED_HF.fullmatch(key):
                raise ValueError(f"unknown HuggingFace Llama parameter {key!r}")
        return out

    def hf_config(self, dtype: torch.dtype) -> dict[str, Any]:
        """config.json for ``LlamaForCausalLM`` (legacy ``rope_scaling`` keys, which
        transformers 4.x and 5.x and other Llama readers all understand)."""
        a, s = self.args, self.args.rope_scaling
        rope_scaling = None if s is None else {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position,
        }
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": a.dim,
            "intermediate_size": a.ffn_hidden_dim,
            "num_hidden_layers": a.n_layers,
            "num_attention_heads": a.n_heads,
            "num_key_value_heads": a.kv_heads,
            "head_dim": a.head_dim,
            "vocab_size": a.vocab_size,
            "rms_norm_eps": a.norm_eps,
            "rope_theta": a.rope_theta,
            "rope_scaling": rope_scaling,
            # The trained context, or the one RoPE scaling stretches the original to if longer.
            "max_position_embeddings": max(
                a.max_seq_len, 0 if s is None else int(s.original_max_position * s.factor)),
            "tie_word_embeddings": a.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "initializer_range": 0.02,
            "torch_dtype": DTYPE_NAMES[dtype],
        }

    def check_config(self, hf_config: dict[str, Any]) -> None:
        """ValueError naming every shape- or function-defining field where an HF config.json
        differs from ``args`` (a differing norm epsilon or activation computes another model)."""
        rope = hf_config.get("rope_scaling") or hf_config.get("rope_parameters") or {}
        theta = hf_config.get("rope_theta", rope.get("rope_theta"))
        scaling = None
        if rope.get("rope_type", rope.get("type", "default")) == "llama3":
            scaling = RopeScaling(
                factor=rope["factor"], low_freq_factor=rope["low_freq_factor"],
                high_freq_factor=rope["high_freq_factor"],
                original_max_position=rope["original_max_position_embeddings"])
        elif rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"unsupported HuggingFace rope type {rope.get('rope_type')!r}")
        a = self.args
        expected = {
            "hidden_size": (a.dim, hf_config.get("hidden_size")),
            "intermediate_size": (a.ffn_hidden_dim, hf_config.get("intermediate_size")),
            "num_hidden_layers": (a.n_layers, hf_config.get("num_hidden_layers")),
            "num_attention_heads": (a.n_heads, hf_config.get("num_attention_heads")),
            "num_key_value_heads": (a.kv_heads, hf_config.get("num_key_value_heads",
                                                                hf_config.get("num_attention_heads"))),
            "vocab_size": (a.vocab_size, hf_config.get("vocab_size")),
            "rope_theta": (a.rope_theta, theta),
            "rope_scaling": (a.rope_scaling, scaling),
            "tie_word_embeddings": (a.tie_word_embeddings,
                                    hf_config.get("tie_word_embeddings", False)),
            # The defaults are LlamaConfig's, for config.json files that leave them out.
            "head_dim": (a.head_dim, hf_config.get("head_dim") or (
                hf_config.get("hidden_size", 0) // hf_config.get("num_attention_heads", 1))),
            "rms_norm_eps": (a.norm_eps, hf_config.get("rms_norm_eps", 1e-6)),
            "hidden_act": ("silu", hf_config.get("hidden_act", "silu")),
            "attention_bias": (False, hf_config.get("attention_bias", False)),
            "mlp_bias": (False, hf_config.get("mlp_bias", False)),
        }
        differ = [f"{k}: HF {theirs}, ours {ours}" for k, (ours, theirs) in expected.items()
                  if ours != theirs]
        if differ:
            raise ValueError("the HuggingFace config.json does not describe this model ("
                             + "; ".join(differ) + "); choose the matching [model] flavor")
