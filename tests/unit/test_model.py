"""Llama 3 shapes, parameter and FLOP counts (on meta), RoPE, causality, weight tying."""

import dataclasses

import pytest
import torch

from torchtitan_like.models.llama3.args import Llama3Args, RopeScaling, llama3_flavors
from torchtitan_like.models.llama3.model import Transformer, apply_rope, rope_frequencies

# Meta's published parameter counts (Llama 3.2 1B/3B tie the embedding and the head).
PUBLISHED = {
    "1B": 1_235_814_400,
    "3B": 3_212_749_824,
    "8B": 8_030_261_248,
    "70B": 70_553_706_496,
    "405B": 405_853_388_800,
}
FFN_HIDDEN = {"debugmodel": 768, "100M": 2048, "1B": 8192, "3B": 8192, "8B": 14336, "70B": 28672,
              "405B": 53248}


@pytest.mark.parametrize("flavor", list(PUBLISHED))
def test_published_parameter_counts(flavor):
    assert llama3_flavors[flavor].num_params() == PUBLISHED[flavor]


@pytest.mark.parametrize("flavor", ["tiny", "debugmodel", "100M", "1B", "8B"])
def test_meta_model_matches_analytic_count(flavor):
    with torch.device("meta"):
        model = Transformer(llama3_flavors[flavor])
    unique = {id(p): p.numel() for p in model.parameters()}
    assert sum(unique.values()) == llama3_flavors[flavor].num_params()


@pytest.mark.parametrize("flavor", list(FFN_HIDDEN))
def test_ffn_hidden_dims(flavor):
    assert llama3_flavors[flavor].ffn_hidden_dim == FFN_HIDDEN[flavor]


def test_debugmodel_is_torchtitans_shape():
    a = llama3_flavors["debugmodel"]
    assert (a.dim, a.n_layers, a.n_heads, a.ffn_hidden_dim, a.vocab_size) == (256, 6, 16, 768, 2048)


def test_flops_per_token_is_6n_plus_attention():
    a = llama3_flavors["8B"]
    dense = a.num_params() - a.vocab_size * a.dim  # the embedding lookup does no matmul
    assert a.flops_per_token(4096) == 6 * dense + 12 * a.n_layers * a.dim * 4096
    tied = llama3_flavors["1B"]  # the tied table still multiplies in the head
    assert tied.flops_per_token(0) == 6 * tied.num_params()


def tiny_model(**changes) -> Transformer:
    model = Transformer(dataclasses.replace(llama3_flavors["tiny"], max_seq_len=32, **changes))
    torch.manual_seed(0)
    model.init_weights()
    return model


def test_forward_shape_and_causality():
    model = tiny_model()
    tokens = torch.randint(0, 512, (2, 32))
    logits = model(tokens)
    assert logits.shape == (2, 32, 512)
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 512
    # Bitwise by construction (a row never reads later tokens; measured 0); 1e-6 is 2 ulps of
    # logits < 5, room for a kernel that blocks rows another way, far below a causality leak.
    assert torch.allclose(model(changed)[:, :20], logits[:, :20], atol=1e-6)
    assert not torch.allclose(model(changed)[:, 20:], logits[:, 20:])


def test_meta_build_then_init_equals_direct_init():
    with torch.device("meta"):
        meta = Transformer(dataclasses.replace(llama3_flavors["tiny"], max_seq_len=32))
    meta.to_empty(device="cpu")
    torch.manual_seed(0)
    meta.init_weights()
    direct = tiny_model()
    for (name, a), b in zip(meta.state_dict().items(), direct.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(meta.rope_cache, direct.rope_cache)


def test_tied_head_is_the_embedding_table():
    model = tiny_model(tie_word_embeddings=True)
    assert model.output is None
    tokens = torch.randint(0, 512, (1, 8))
    hidden = model.norm(model.layers["3"](
        model.layers["2"](model.layers["1"](model.layers["0"](
            model.tok_embeddings(tokens), model.rope_cache), model.rope_cache),
            model.rope_cache), model.rope_cache))
    # The same products summed by F.linear's kernel or by @ (class b): logits < 12, ulp 9.5e-7.
    assert torch.allclose(model(tokens), hidden @ model.tok_embeddings.weight.T, atol=1e-5)


def test_rope_is_a_rotation_and_relative():
    cache = Transformer(dataclasses.replace(llama3_flavors["tiny"], max_seq_len=16)).rope_cache
    q, k = torch.randn(1, 16, 1, 16), torch.randn(1, 1, 1, 16)
    rq = apply_rope(q, cache)
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-5)  # |q| ~ 4: 20 ulps
    # The score between positions i and j depends on i - j only.
    k_all = apply_rope(k.expand(1, 16, 1, 16).contiguous(), cache)
    q_all = apply_rope(q[:, :1].expand(1, 16, 1, 16).contiguous(), cache)
    scores = (q_all * k_all).sum(-1).squeeze()
    # Angles pos x theta (pos < 16) rounded in fp32: <= 16 eps, times |q||k| ~ 16: 3e-5.
    assert torch.allclose(scores, scores[0].expand(16), atol=1e-4)


def test_llama31_scaling_keeps_high_and_divides_low_frequencies():
    plain = rope_frequencies(128, 500000.0, None)
    scaled = rope_frequencies(128, 500000.0, RopeScaling(factor=8.0))
    assert torch.allclose(scaled[:10], plain[:10])  # short wavelengths untouched
    assert torch.allclose(scaled[-5:], plain[-5:] / 8)  # long ones slowed by the factor


def test_invalid_shapes_are_refused():
    from torchtitan_like.config.errors import ConfigError
    from torchtitan_like.models.llama3 import args as args_module
    from torchtitan_like.validate import parse_args

    args_module.llama3_flavors["odd"] = Llama3Args(dim=96, n_layers=1, n_heads=6, n_kv_heads=4)
    try:
        with pytest.raises(ConfigError, match="multiple of n_kv_heads"):
            parse_args(["--model.flavor=odd"], 1)
    finally:
        del args_module.llama3_flavors["odd"]
