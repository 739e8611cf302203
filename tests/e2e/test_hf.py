"""HuggingFace interop: export -> import gives identical weights; transformers' LlamaForCausalLM
computes our logits from the export; a job starts from HF weights (converted or read directly).

Logits agree to 1e-4 in fp32 (measured ~2e-6: RoPE tables and RMSNorm differ only in rounding).
The bound is the worst case of the RoPE tables: angles up to 64 rad computed another way differ
by up to 64 eps = 7.6e-6, a relative error that reaches logits of order 10 as ~1e-4.
"""

import dataclasses
import importlib.util
import json

import pytest
import torch
from harness import ROOT, build_trainer

from torchtitan_like.components.hf_checkpoint import load_hf, save_hf
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.models.llama3 import Llama3HFAdapter, Transformer, llama3_flavors

TINY = dataclasses.replace(llama3_flavors["tiny"], max_seq_len=64)
SHAPES = {
    "gqa_llama3_rope": TINY,  # grouped-query attention, Llama 3.1 RoPE scaling
    "tied_plain_rope": dataclasses.replace(TINY, tie_word_embeddings=True, rope_scaling=None,
                                           n_kv_heads=None),
}


def _convert_hf():
    spec = importlib.util.spec_from_file_location("convert_hf", ROOT / "scripts/convert_hf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _model(args) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(args)
    model.init_weights()
    return model.eval()


@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_and_logits_match_transformers(shape, tmp_path):
    args = SHAPES[shape]
    model, adapter = _model(args), Llama3HFAdapter(args)
    ours = model.state_dict()
    files = save_hf(ours, adapter, tmp_path, torch.float32, max_shard_bytes=2**20)
    assert len(files) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    config, hf_tensors = load_hf(tmp_path)
    assert ("lm_head.weight" in hf_tensors) == (not args.tie_word_embeddings)
    adapter.check_config(config)
    back = adapter.from_hf(hf_tensors)
    assert back.keys() == ours.keys()
    assert all(torch.equal(back[k], ours[k]) for k in ours)

    transformers = pytest.importorskip(
        "transformers", reason="the logits comparison needs transformers (extra 'hf')")
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    tokens = torch.randint(0, args.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (model(tokens) - theirs(tokens).logits).abs().max().item()
    assert diff < 1e-4, diff


def test_config_mismatch_is_named(tmp_path):
    save_hf(_model(TINY).state_dict(), Llama3HFAdapter(TINY), tmp_path, torch.bfloat16)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rope_scaling"]["rope_type"] == "llama3" and config["torch_dtype"] == "bfloat16"
    with pytest.raises(ValueError, match=r"hidden_size: HF 128, ours 256"):
        Llama3HFAdapter(llama3_flavors["debugmodel"]).check_config(config)


def test_jobs_start_from_hf_weights(one_process_group, corpus, tmp_path):
    """Checkpoint -> HF (script) -> a job reading it directly, and -> a seed checkpoint."""
    ckpt = ["--checkpoint.enable", "true", "--training.steps", "2"]
    trained = build_trainer(ckpt, tmp_path / "trained", corpus, one_process_group)
    trained.train()
    weights = trained.model_parts[0].state_dict()
    convert = _convert_hf()
    hf = tmp_path / "hf"
    assert convert(["to_hf", str(tmp_path / "trained/checkpoint/step-2"), str(hf),
                    "--dtype", "float32"]) == 0

    direct = build_trainer(["--checkpoint.initial_load_path", str(hf),
                            "--checkpoint.initial_load_in_hf", "true"], tmp_path / "direct",
                           corpus, one_process_group)
    assert convert(["from_hf", str(hf), str(tmp_path / "seeded/checkpoint")]) == 0
    seeded = build_trainer(ckpt, tmp_path / "seeded", corpus, one_process_group)
    assert seeded.step == 0
    for trainer in (direct, seeded):
        for key, value in trainer.model_parts[0].state_dict().items():
            assert torch.equal(value, weights[key]), key

    with pytest.raises(ConfigError, match=r"does not describe this model .*hidden_size"):
        build_trainer(["--model.flavor", "debugmodel", "--checkpoint.initial_load_path", str(hf),
                       "--checkpoint.initial_load_in_hf", "true"], tmp_path / "wrong", corpus,
                      one_process_group)
