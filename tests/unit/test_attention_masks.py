"""Document masking (``[model] attn_mask_type = "block_causal"``): the mask against a hand-computed
case, a token's logits independent of the previous document in its sample (and dependent on it
under plain causal, so the switch takes effect), and the start-up refusals. The parity under
FSDP, TP and PP is in tests/parallel/test_pipeline.py."""

import dataclasses

import pytest
import torch
from harness import ROOT

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.models.attention_masks import dense_block_causal_mask, document_ids
from torchtitan_like.models.deepseek_v3 import DeepSeekV3Model, deepseek_v3_flavors
from torchtitan_like.models.llama3 import Transformer, llama3_flavors
from torchtitan_like.models.qwen3 import Qwen3Model, qwen3_flavors
from torchtitan_like.validate import parse_args

EOS = 2


def test_document_ids_and_mask_by_hand():
    # a EOS | b c EOS | d: the EOS closes its document, the id increments after it.
    tokens = torch.tensor([[5, EOS, 7, 8, EOS, 9]])
    ids = document_ids(tokens, EOS)
    assert ids.tolist() == [[0, 0, 1, 1, 1, 2]]
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ], dtype=torch.bool)
    mask = dense_block_causal_mask(ids)
    assert mask.shape == (1, 1, 6, 6) and torch.equal(mask[0, 0], expected)


def _small(flavors, name, **changes):
    return dataclasses.replace(flavors[name], n_layers=2, max_seq_len=16, **changes)


MODELS = {
    "llama3": lambda: Transformer(_small(llama3_flavors, "tiny")),
    "qwen3": lambda: Qwen3Model(_small(qwen3_flavors, "debugmodel")),
    "deepseek_v3": lambda: DeepSeekV3Model(_small(deepseek_v3_flavors, "debugmodel",
                                                  n_dense_layers=2)),
}


@pytest.mark.parametrize("name", MODELS)
def test_logits_ignore_the_previous_document(name):
    """Tokens 0-5 are document A (closed by the EOS at 5), 6-15 document B. Changing A's
    tokens leaves B's logits bitwise unchanged under block_causal (B's queries never reach A's
    keys: their scores are -inf, weights exactly 0, and B's positions, hence its RoPE angles,
    are unchanged); under causal they change."""
    torch.manual_seed(0)
    model = MODELS[name]()
    model.init_weights()
    first = torch.randint(3, 100, (1, 16))
    first[0, 5] = EOS
    second = first.clone()
    second[0, :5] = torch.randint(3, 100, (5,))
    with torch.no_grad():
        def logits(tokens, mask_type):
            ids = {"document_ids": document_ids(tokens, EOS)} if mask_type == "block_causal" else {}
            return model(tokens, **ids)[0, 6:]

        assert torch.equal(logits(first, "block_causal"), logits(second, "block_causal"))
        assert not torch.allclose(logits(first, "causal"), logits(second, "causal"))
        # With one document block_causal is causal: same function, other SDPA path.
        whole = first.clone()
        whole[0, 5] = 3
        torch.testing.assert_close(logits(whole, "block_causal"), logits(whole, "causal"))


def test_context_parallel_with_block_causal_is_refused():
    with pytest.raises(ConfigError) as error:
        parse_args(["--model.attn_mask_type=block_causal",
                    "--parallelism.context_parallel_degree=2"], 2)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("[model] attn_mask_type = 'block_causal' cannot run under "
                              "[parallelism] context_parallel_degree = 2")


def test_a_model_without_document_masking_refuses_it():
    tiny_gpt = ["--job.custom_import", str(ROOT / "examples/custom_model/tiny_gpt.py"),
                "--model.name", "tiny_gpt", "--model.flavor", "small"]
    parse_args(tiny_gpt, 1)  # causal: runs
    with pytest.raises(ConfigError) as error:
        parse_args([*tiny_gpt, "--model.attn_mask_type=block_causal"], 1)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("[model] attn_mask_type = 'block_causal', but model 'tiny_gpt' "
                              "supports only ['causal']")


def test_an_unknown_mask_type_is_refused():
    with pytest.raises(ConfigError, match="attn_mask_type"):
        parse_args(["--model.attn_mask_type=sliding"], 1)
