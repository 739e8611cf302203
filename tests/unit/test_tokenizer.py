import json

import pytest

from torchtitan_like.components.data.tokenizer import ByteTokenizer, build_tokenizer
from torchtitan_like.config.errors import ConfigError


@pytest.mark.parametrize("text", ["", "plain ascii", "ünïcödé ✓ 日本語", "tabs\tand\nnewlines"])
def test_byte_tokenizer_round_trip(text):
    tok = build_tokenizer("")
    assert isinstance(tok, ByteTokenizer)
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode([tok.bos_id, *ids, tok.eos_id]) == text
    assert tok.vocab_size == 258 and {tok.bos_id, tok.eos_id} == {256, 257}


def test_huggingface_tokenizer_json(tmp_path):
    tokenizers = pytest.importorskip("tokenizers", reason="optional extra `hf` not installed")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|begin_of_text|>",
                                                                  "<|end_of_text|>"])
    tok.train_from_iterator(["the rank holds a shard of the mesh"] * 50, trainer)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.save(str(tmp_path / "tokenizer.json"))

    loaded = build_tokenizer(str(tmp_path))  # a folder holding tokenizer.json
    assert loaded.bos_id == tok.token_to_id("<|begin_of_text|>")
    assert loaded.eos_id == tok.token_to_id("<|end_of_text|>")
    assert loaded.decode(loaded.encode("the mesh holds a shard")) == "the mesh holds a shard"

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<unk>"}))
    assert build_tokenizer(str(tmp_path / "tokenizer.json")).bos_id == tok.token_to_id("<unk>")


def test_missing_tokenizer_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        build_tokenizer(str(tmp_path / "nope.json"))
