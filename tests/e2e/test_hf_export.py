"""A job's HuggingFace export works as an HF model, and generation agrees with transformers.

A short job with ``[checkpoint] last_save_in_hf`` writes step-N-hf; ``transformers.pipeline``
loads it as it is (tokenizer, generation config, BOS/EOS); its tokenization equals the
platform's ``[BOS] + encode`` and its greedy output equals scripts/generate.py's, from the HF
folder and from the DCP checkpoint alike. Greedy tokens compare exactly: the two models' fp32
logits differ by ~2e-6 (tests/e2e/test_hf.py), far below the gap between the top two logits of
a trained model at these steps (checked below, so a near-tie would show as such, not as a
flaky mismatch). The job's metrics records carry the progress fields.
"""

import pytest
import torch
from harness import build_trainer, read_metrics

from torchtitan_like.components.data.tokenizer import ByteTokenizer
from torchtitan_like.tools.generate import generate, load_model, main, prompt_ids

transformers = pytest.importorskip("transformers", reason="needs the 'hf' extra")

PROMPTS = ["The model ", "Shard the rank: ", "héllo ✓"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def trained(one_process_group, corpus, tmp_path_factory):
    dump = tmp_path_factory.mktemp("job")
    trainer = build_trainer(["--training.steps", "12", "--metrics.log_freq", "4",
                             "--checkpoint.enable", "true", "--checkpoint.interval", "6",
                             "--checkpoint.last_save_in_hf", "true"], dump, corpus,
                            one_process_group)
    trainer.train()
    return dump


def test_progress_fields_are_recorded(trained):
    train = [r for r in read_metrics(trained) if "loss" in r]
    assert [r["step"] for r in train] == [1, 4, 8, 12]
    assert [r["tokens_seen"] for r in train] == [256 * s for s in (1, 4, 8, 12)]
    assert all(r["epoch"] == 0 and r["mfu_peak_tflops"] == 1 for r in train)
    assert train[-1]["eta_seconds"] == 0 and train[-1]["elapsed_seconds"] > 0
    assert train[2]["checkpoint_seconds"] > 0  # the save after step 6, outside the window


def test_pipeline_tokenizes_and_generates_like_the_platform(trained):
    hf = trained / "checkpoint/step-12-hf"
    pipe = transformers.pipeline("text-generation", model=str(hf), dtype=torch.float32)
    byte = ByteTokenizer()
    model, max_seq_len = load_model(hf)
    for prompt in PROMPTS:
        ids = prompt_ids(byte, prompt)
        assert pipe.tokenizer(prompt).input_ids == ids
        ours = generate(model, ids, max_new_tokens=NEW_TOKENS, max_seq_len=max_seq_len,
                        eos_id=byte.eos_id)
        text = pipe(prompt, max_new_tokens=NEW_TOKENS, do_sample=False,
                    return_full_text=False)[0]["generated_text"]
        assert text == byte.decode(ours) and len(ours) == NEW_TOKENS  # no early EOS


def test_greedy_generation_equals_transformers_generate(trained, capsys):
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        trained / "checkpoint/step-12-hf", dtype=torch.float32).eval()
    dcp_model, max_seq_len = load_model(trained / "checkpoint/step-12")
    byte = ByteTokenizer()
    for prompt in PROMPTS:
        ids = prompt_ids(byte, prompt)
        ours = generate(dcp_model, ids, max_new_tokens=NEW_TOKENS, max_seq_len=max_seq_len,
                        eos_id=byte.eos_id)
        theirs = hf_model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS,
                                   do_sample=False)[0, len(ids):].tolist()
        assert ours == theirs, prompt
        with torch.no_grad():  # the margin that makes an exact comparison meaningful
            top2 = dcp_model(torch.tensor([ids + ours[:-1]]))[0, len(ids) - 1:].topk(2).values
        assert (top2[:, 0] - top2[:, 1]).min() > 1e-4
    assert main([str(trained / "checkpoint/step-12"), "--prompt", PROMPTS[0],
                 "--max_new_tokens", "5", "--temperature", "0.7", "--top_k", "20",
                 "--top_p", "0.9"]) == 0
    assert capsys.readouterr().out.startswith(PROMPTS[0])


@pytest.mark.parametrize(("field", "value"), [
    ("rms_norm_eps", 1e-6), ("head_dim", 32), ("hidden_act", "gelu"), ("mlp_bias", True)])
def test_hf_import_compares_every_defining_field(field, value):
    from torchtitan_like.models.llama3 import Llama3HFAdapter, llama3_flavors

    adapter = Llama3HFAdapter(llama3_flavors["tiny"])
    config = adapter.hf_config(torch.float32)
    adapter.check_config(config)
    with pytest.raises(ValueError, match=f"{field}: HF {value}"):
        adapter.check_config({**config, field: value})
