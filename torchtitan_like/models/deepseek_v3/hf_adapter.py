"""DeepSeek-V3 <-> HuggingFace ``DeepseekV3ForCausalLM``: parameter names and config.json.

The HF layout is the one DeepSeek publishes (deepseek-ai/DeepSeek-V3 on the Hub): one tensor
per expert and projection (``mlp.experts.{j}.gate_proj.weight``), which transformers 5 fuses
on load and other readers (transformers 4, inference engines) read as is. Our experts are
stacked (E, ...) tensors, so export slices them and import stacks them; every other tensor maps
one to one. RoPE needs no permutation: both models rotate DeepSeek's interleaved pairs
(``rope_interleave``). The selection bias is HF's ``e_score_correction_bias``. Only the
DeepSeek-V3 gating (sigmoid scores, shared experts) has this HF class; the softmax-gated V2
flavors are refused. The logits test is tests/e2e/test_hf_deepseek_v3.py.

Multi-token prediction (``mtp_depth``, mtp.py): depth k is the Hub's layer n_layers + k
(``model.layers.61.*`` in DeepSeek-V3's checkpoint): its block under the usual names, plus
``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` and copies of the shared embedding
(``embed_tokens``) and head (``shared_head.head``), which export writes and import drops (the
model shares the main ones: its further name of the embedding, ``mtp.embedding.weight``, is
left out of export and given the main embedding's tensor on import). transformers'
``DeepseekV3ForCausalLM`` does not run these layers (it ignores them on load); importing a
checkpoint with more MTP layers than ``mtp_depth`` ignores the extra ones likewise.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from torchtitan_like.models.deepseek_v3.args import DeepSeekV3Args
from torchtitan_like.models.hf_names import DTYPE_NAMES, HF_LAYER, LAYER, HFNames
from torchtitan_like.models.moe.hf_experts import (
    STACKED_TO_HF,
    collect_expert,
    split_experts,
    stack_experts,
)

_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wq_a.weight": "self_attn.q_a_proj.weight",
    "attention.q_norm.weight": "self_attn.q_a_layernorm.weight",
    "attention.wq_b.weight": "self_attn.q_b_proj.weight",
    "attention.wkv_a.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attention.kv_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attention.wkv_b.weight": "self_attn.kv_b_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "moe.router.gate.weight": "mlp.gate.weight",
    "moe.expert_bias": "mlp.gate.e_score_correction_bias",
    "moe.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "moe.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
    "moe.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
}
_MTP_OWN = {  # an MTP depth's own modules (mtp.py); its block's names are _BLOCK's
    "enorm.weight": "enorm.weight",
    "hnorm.weight": "hnorm.weight",
    "eh_proj.weight": "eh_proj.weight",
    "norm.weight": "shared_head.norm.weight",
}
_MTP_SHARED = {"embed_tokens.weight": "tok_embeddings.weight",
               "shared_head.head.weight": "output.weight"}
"""The copies of the shared embedding and head each MTP layer of the Hub checkpoint holds."""
_MTP_EMBEDDING = "mtp.embedding.weight"
"""The embedding's further name in our model (mtp.py holds the trunk's module): exported once,
under its first name, and given back on import with the same tensor."""
_OURS_MTP = re.compile(r"mtp\.depths\.(\d+)\.(.+)")
_SHARDED_HINT = ("deepseek_v3 reads HuggingFace weights into a sharded model only through a "
                 "seed checkpoint: convert them with scripts/convert_hf.py and set "
                 "initial_load_path to it")


class DeepSeekV3HFAdapter:
    """Converts state dicts and configs of one DeepSeek-V3 shape (``args``) to and from HF's."""

    def __init__(self, args: DeepSeekV3Args):
        self.args = args
        self.names = HFNames(_TOP, _BLOCK)

    def _to_layer_names(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """MTP depth k's names -> those of layer n_layers + k, as the Hub checkpoint numbers
        them (``model.layers.61.*`` for DeepSeek-V3), with its copies of embedding and head."""
        out, n = {}, self.args.n_layers
        for key, value in state_dict.items():
            if key == _MTP_EMBEDDING:
                continue
            m = _OURS_MTP.fullmatch(key)
            if not m:
                out[key] = value
                continue
            layer, rest = n + int(m.group(1)), m.group(2)
            if rest in _MTP_OWN:
                out[f"mtp_own.{layer}.{_MTP_OWN[rest]}"] = value
            else:
                out[f"layers.{layer}.{rest.removeprefix('block.')}"] = value
        for k in range(self.args.mtp_depth):
            out.update({f"mtp_own.{n + k}.{theirs}": state_dict[ours]
                        for theirs, ours in _MTP_SHARED.items() if ours in state_dict})
        return out

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Our FQNs -> HF names; stacked experts become one tensor per expert (views); MTP
        depths become the layers after the last (``_to_layer_names``)."""
        self._require_v3_gating()
        out = {}
        for key, value in self._to_layer_names(state_dict).items():
            if key.startswith("mtp_own."):
                out[f"model.layers.{key.removeprefix('mtp_own.')}"] = value
                continue
            m = LAYER.fullmatch(key)
            if (name := self.names.to_hf(key)) is not None:
                out[name] = value
            elif m and m.group(2) in STACKED_TO_HF:
                out.update(split_experts(m.group(1), m.group(2), value, _SHARDED_HINT))
            else:
                raise ValueError(f"no HuggingFace name for parameter {key!r}")
            unbiased = self.args.moe.load_balance_coeff is None
            if m and m.group(2) == "moe.router.gate.weight" and unbiased:
                # HF always has the bias; ours routes without one, i.e. with zeros.
                out[f"model.layers.{m.group(1)}.mlp.gate.e_score_correction_bias"] = (
                    torch.zeros(self.args.moe.num_experts, dtype=torch.float32))
        return out

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        """HF names -> our FQNs; per-expert tensors are stacked in expert order."""
        self._require_v3_gating()
        out: dict[str, Any] = {}
        experts: dict[str, dict[int, Any]] = {}
        for key, value in hf_state_dict.items():
            if key in self.names.from_top:
                out[self.names.from_top[key]] = value
                continue
            m = HF_LAYER.fullmatch(key)
            if m and int(m.group(1)) >= self.args.n_layers + self.args.mtp_depth:
                continue  # an MTP layer this model does not train (as transformers ignores it)
            if m and collect_expert(m.group(1), m.group(2), value, experts):
                continue
            if m and int(m.group(1)) >= self.args.n_layers and self._from_mtp(m, value, out):
                continue
            if (name := self.names.from_hf(key)) is not None:
                out[name] = value
            elif not (m and m.group(2).startswith("self_attn.rotary_emb")):
                raise ValueError(f"unknown HuggingFace DeepseekV3 parameter {key!r}")
        out.update(stack_experts(experts))
        if self.args.moe.load_balance_coeff is None:
            self._drop_zero_biases(out)
        if self.args.mtp_depth and "tok_embeddings.weight" in out:
            out[_MTP_EMBEDDING] = out["tok_embeddings.weight"]
        return self._to_mtp_names(out)

    def _from_mtp(self, m: re.Match, value: Any, out: dict[str, Any]) -> bool:
        """An MTP layer's own tensor (True: taken or, for the copies of the shared embedding
        and head, dropped); False for its block's tensors."""
        prefix = f"mtp.depths.{int(m.group(1)) - self.args.n_layers}."
        if m.group(2) in _MTP_SHARED:
            return True
        own = {v: k for k, v in _MTP_OWN.items()}
        if m.group(2) in own:
            out[prefix + own[m.group(2)]] = value
            return True
        return False

    def _to_mtp_names(self, state: dict[str, Any]) -> dict[str, Any]:
        """``layers.{n_layers + k}.*`` (an MTP depth's block) -> ``mtp.depths.{k}.block.*``."""
        out = {}
        for key, value in state.items():
            m = LAYER.fullmatch(key)
            if m and int(m.group(1)) >= self.args.n_layers:
                key = f"mtp.depths.{int(m.group(1)) - self.args.n_layers}.block.{m.group(2)}"
            out[key] = value
        return out

    def _require_v3_gating(self) -> None:
        if self.args.moe.score_func != "sigmoid" or self.args.moe.num_shared_experts < 1:
            raise ValueError("HuggingFace's DeepseekV3 layout has sigmoid gating and shared "
                             "experts; this flavor (DeepSeek-V2 style) has no HF mapping")

    @staticmethod
    def _drop_zero_biases(state: dict[str, Any]) -> None:
        """A model without the bias can take HF's only where it is zero (routes the same)."""
        for key in [k for k in state if k.endswith("moe.expert_bias")]:
            if torch.count_nonzero(state.pop(key)):
                raise ValueError(f"{key}: the HF checkpoint has a non-zero routing bias and "
                                 "this flavor routes without one (load_balance_coeff = None)")

    def hf_config(self, dtype: torch.dtype) -> dict[str, Any]:
        """config.json for ``DeepseekV3ForCausalLM`` (legacy ``rope_scaling`` keys)."""
        self._require_v3_gating()
        a, s = self.args, self.args.rope_scaling
        rope_scaling = None if not a.yarn_active else {
            "type": "yarn", "rope_type": "yarn", "factor": s.factor,
            "original_max_position_embeddings": s.original_max_position,
            "beta_fast": s.beta_fast, "beta_slow": s.beta_slow, "mscale": s.mscale,
            "mscale_all_dim": s.mscale_all_dim,
        }
        return {
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            **self._shape(), "rope_scaling": rope_scaling, "max_position_embeddings": a.max_seq_len,
            "scoring_func": "sigmoid", "topk_method": "noaux_tc", "rope_interleave": True,
            "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
            "initializer_range": 0.02, "torch_dtype": DTYPE_NAMES[dtype],
            "num_nextn_predict_layers": a.mtp_depth,
        }

    def _shape(self) -> dict[str, Any]:
        """The config.json fields that must equal ours for the weights to mean the same."""
        a, m = self.args, self.args.moe
        return {
            "vocab_size": a.vocab_size, "hidden_size": a.dim, "intermediate_size": a.inter_dim,
            "moe_intermediate_size": a.moe_inter_dim, "num_hidden_layers": a.n_layers,
            "num_attention_heads": a.n_heads, "num_key_value_heads": a.n_heads,
            "first_k_dense_replace": a.n_dense_layers, "n_routed_experts": m.num_experts,
            "n_shared_experts": m.num_shared_experts, "num_experts_per_tok": m.top_k,
            "routed_scaling_factor": m.route_scale, "norm_topk_prob": m.route_norm,
            "n_group": m.num_expert_groups, "topk_group": m.num_limited_groups,
            "q_lora_rank": a.q_lora_rank or None, "kv_lora_rank": a.kv_lora_rank,
            "qk_nope_head_dim": a.qk_nope_head_dim, "qk_rope_head_dim": a.qk_rope_head_dim,
            "v_head_dim": a.v_head_dim, "rms_norm_eps": a.norm_eps, "rope_theta": a.rope_theta,
        }

    def check_config(self, hf_config: dict[str, Any]) -> None:
        """ValueError naming every field where an HF config.json differs from ``args``."""
        self._require_v3_gating()
        rope = hf_config.get("rope_scaling") or hf_config.get("rope_parameters") or {}
        theirs = {**hf_config, "rope_theta": hf_config.get("rope_theta", rope.get("rope_theta"))}
        differ = [f"{k}: HF {theirs.get(k)}, ours {v}" for k, v in self._shape().items()
                  if theirs.get(k) != v]
        if differ:
            raise ValueError("the HuggingFace config.json does not describe this model ("
                             + "; ".join(differ) + "); choose the matching [model] flavor")
