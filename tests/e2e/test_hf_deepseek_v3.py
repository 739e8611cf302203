"""HuggingFace interop of deepseek_v3: export -> import gives identical weights, and
transformers' DeepseekV3ForCausalLM computes our logits from the export.

Logits agree to 1e-4 in fp32: the two models run the same operations on the same weights and
differ only in rounding (RoPE tables computed in float64 here, float32 there; attention kernel
and expert summation order), ~1e-6 relative on logits of order 1; routing ties that rounding
could flip have probability ~0 on random weights.
"""

import dataclasses

import pytest
import torch

from torchtitan_like.components.hf_checkpoint import load_hf, save_hf
from torchtitan_like.models.deepseek_v3 import (
    DeepSeekV3HFAdapter,
    DeepSeekV3Model,
    YarnScaling,
    deepseek_v3_flavors,
)

DEBUG = dataclasses.replace(deepseek_v3_flavors["debugmodel"], max_seq_len=32)
SHAPES = {
    "debugmodel_bias": DEBUG,
    # Low-rank queries and YaRN active (trained past an original context of 16 tokens).
    "q_lora_yarn": dataclasses.replace(
        DEBUG, q_lora_rank=32,
        rope_scaling=YarnScaling(factor=4.0, original_max_position=16, mscale=0.8,
                                 mscale_all_dim=0.8)),
    "aux_no_bias": dataclasses.replace(deepseek_v3_flavors["debugmodel_aux"], max_seq_len=32),
}


def _model(args) -> DeepSeekV3Model:
    torch.manual_seed(0)
    model = DeepSeekV3Model(args)
    model.init_weights()
    for layer in model.layers.values():  # a trained bias, so that its mapping is exercised
        if layer.moe_enabled and layer.moe.expert_bias is not None:
            layer.moe.expert_bias.copy_(torch.randn(args.moe.num_experts) * 0.1)
    return model.eval()


@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_and_logits_match_transformers(shape, tmp_path):
    args = SHAPES[shape]
    model, adapter = _model(args), DeepSeekV3HFAdapter(args)
    ours = model.state_dict()
    save_hf(ours, adapter, tmp_path, torch.float32)
    config, hf_tensors = load_hf(tmp_path)
    assert "model.layers.1.mlp.experts.7.gate_proj.weight" in hf_tensors
    adapter.check_config(config)
    back = adapter.from_hf(hf_tensors)
    assert back.keys() == ours.keys()
    assert all(torch.equal(back[k], ours[k]) for k in ours)

    transformers = pytest.importorskip(
        "transformers", reason="the logits comparison needs transformers (extra 'hf')")
    theirs = transformers.DeepseekV3ForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    tokens = torch.randint(0, args.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (model(tokens) - theirs(tokens).logits).abs().max().item()
    assert diff < 1e-4, diff


def test_v2_style_flavors_have_no_hf_mapping():
    adapter = DeepSeekV3HFAdapter(deepseek_v3_flavors["16B"])
    with pytest.raises(ValueError, match="sigmoid gating"):
        adapter.hf_config(torch.bfloat16)


def test_config_mismatch_is_named():
    config = DeepSeekV3HFAdapter(DEBUG).hf_config(torch.float32)
    with pytest.raises(ValueError, match="n_routed_experts: HF 16, ours 8"):
        DeepSeekV3HFAdapter(DEBUG).check_config({**config, "n_routed_experts": 16})
