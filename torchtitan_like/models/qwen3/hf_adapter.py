"""This Qwen3 <-> HuggingFace ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM``: names and config.json.

Dense blocks map one to one, as llama's do (models/llama3/hf_adapter.py), plus the per-head
``q_norm``/``k_norm``. A MoE block's router is HF's ``mlp.gate``; its experts are stacked here
(w1, w3: (E, hidden, dim), w2: (E, dim, hidden)) and stored one tensor per expert in HF's
files (``mlp.experts.{e}.gate_proj|up_proj|down_proj.weight``, each ``w[e]``), so ``to_hf``
hands out per-expert views of the stacked weights and ``from_hf`` stacks them again. Both
compute the same function: softmax gating in fp32, top-k, renormalised when ``norm_topk_prob``
(tests/e2e/test_qwen3_hf.py checks loss and logits against ``transformers``).
"""

from __future__ import annotations

from typing import Any

import torch

from torchtitan_like.models.hf_names import DTYPE_NAMES, HF_LAYER, LAYER, HFNames
from torchtitan_like.models.llama3.hf_adapter import _BLOCK, _TOP
from torchtitan_like.models.moe.hf_experts import (
    STACKED_TO_HF,
    collect_expert,
    split_experts,
    stack_experts,
)
from torchtitan_like.models.qwen3.args import Qwen3Args

_QWEN3_BLOCK = {
    **_BLOCK,
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
    "moe.router.gate.weight": "mlp.gate.weight",
}
_SHARDED_HINT = ("HF expert weights are read and written by whole experts, in one process or "
                 "unsharded")


class Qwen3HFAdapter:
    """Converts state dicts and configs of one Qwen3 shape (``args``) to and from HF's."""

    def __init__(self, args: Qwen3Args):
        self.args = args
        self.names = HFNames(_TOP, _QWEN3_BLOCK)

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Our FQNs -> HF names; stacked expert weights become per-expert views (loading
        into them fills the stacked tensor in place)."""
        out = {}
        for key, value in state_dict.items():
            m = LAYER.fullmatch(key)
            if (name := self.names.to_hf(key)) is not None:
                out[name] = value
            elif m and m.group(2) in STACKED_TO_HF:
                out.update(split_experts(m.group(1), m.group(2), value, _SHARDED_HINT))
            else:
                raise ValueError(f"no HuggingFace name for parameter {key!r}")
        return out

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        """HF names -> our FQNs, per-expert tensors stacked in expert order."""
        out: dict[str, Any] = {}
        experts: dict[str, dict[int, torch.Tensor]] = {}
        for key, value in hf_state_dict.items():
            m = HF_LAYER.fullmatch(key)
            if key == "lm_head.weight" and self.args.tie_word_embeddings:
                continue
            if (name := self.names.from_hf(key)) is not None:
                out[name] = value
            elif not (m and collect_expert(m.group(1), m.group(2), value, experts)):
                raise ValueError(f"unknown HuggingFace Qwen3 parameter {key!r}")
        out.update(stack_experts(experts))
        return out

    def hf_config(self, dtype: torch.dtype) -> dict[str, Any]:
        """config.json for ``Qwen3ForCausalLM`` or, with experts, ``Qwen3MoeForCausalLM``."""
        a = self.args
        config = {
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "hidden_size": a.dim, "intermediate_size": a.hidden_dim,
            "num_hidden_layers": a.n_layers, "num_attention_heads": a.n_heads,
            "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
            "vocab_size": a.vocab_size, "rms_norm_eps": a.norm_eps, "rope_theta": a.rope_theta,
            "rope_scaling": None, "max_position_embeddings": a.max_seq_len,
            "tie_word_embeddings": a.tie_word_embeddings, "hidden_act": "silu",
            "attention_bias": False, "initializer_range": 0.02,
            "torch_dtype": DTYPE_NAMES[dtype],
        }
        if a.moe is not None:
            config.update({
                "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                "num_experts": a.moe.num_experts, "num_experts_per_tok": a.moe.top_k,
                "moe_intermediate_size": a.moe_hidden_dim, "norm_topk_prob": a.moe.route_norm,
                "decoder_sparse_step": 1, "mlp_only_layers": [],
                "output_router_logits": False,
            })
        return config

    def check_config(self, hf_config: dict[str, Any]) -> None:
        """ValueError naming every shape- or function-defining field where an HF config.json
        differs from ``args``."""
        rope = hf_config.get("rope_scaling") or hf_config.get("rope_parameters") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"unsupported HuggingFace rope type {rope.get('rope_type')!r}")
        ours = self.hf_config(torch.float32)
        fields = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings"]
        fields += (["intermediate_size"] if self.args.moe is None else
                   ["num_experts", "num_experts_per_tok", "moe_intermediate_size",
                    "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"])
        defaults = {"tie_word_embeddings": False, "norm_topk_prob": False,  # transformers'
                    "decoder_sparse_step": 1, "mlp_only_layers": [],
                    "head_dim": hf_config.get("hidden_size", 0)
                    // max(1, hf_config.get("num_attention_heads", 1))}
        aliases = {"num_experts": "num_local_experts"}  # the name transformers 5 writes
        theirs = {k: hf_config.get(k, hf_config.get(aliases.get(k, ""), defaults.get(k)))
                  for k in fields}
        theirs["rope_theta"] = hf_config.get("rope_theta", rope.get("rope_theta"))
        # Function-defining fields too: another epsilon, activation or bias computes another
        # model (defaults are transformers' Qwen3Config's).
        theirs["rms_norm_eps"] = hf_config.get("rms_norm_eps", 1e-6)
        theirs["hidden_act"] = hf_config.get("hidden_act", "silu")
        theirs["attention_bias"] = hf_config.get("attention_bias", False)
        differ = [f"{k}: HF {v}, ours {ours[k]}" for k, v in theirs.items() if v != ours[k]]
        if differ:
            raise ValueError("the HuggingFace config.json does not describe this model ("
                             + "; ".join(differ) + "); choose the matching [model] flavor")
