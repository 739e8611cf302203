"""Qwen3 HuggingFace interop, dense and MoE, against ``transformers`` itself.

A random tiny ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` saved with ``save_pretrained`` is
the job's ``[checkpoint] initial_load_path``; the trainer's first-step loss equals the loss
transformers computes on the same batch, and an export of the trained checkpoint, read back by
``AutoModelForCausalLM``, gives the trainer's logits (the export is the trainer's own
``[checkpoint] last_save_in_hf``, which scripts/convert_hf.py to_hf shares).

Tolerance 1e-5 (fp32): both sides run the same operations on the same weights (RMSNorm, RoPE
with theta 1e6, SDPA, SwiGLU, fp32 softmax routing); they differ only in summation order and
in how the RoPE table and norms round (each ~1e-7 relative per op, a few dozen ops deep on
O(1) activations), so the mean cross-entropy over 128 tokens differs by ~1e-6 at most. The
MoE routing could flip only if two experts' scores tied within that rounding, which random
weights make improbable; the loss would then differ by far more than 1e-5 and the test says so.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from harness import build_trainer, job_args
from qwen3_shapes import hf_config

from torchtitan_like.components.data.dataloader import build_dataloader
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.models.qwen3 import qwen3_flavors
from torchtitan_like.validate import parse_args

transformers = pytest.importorskip("transformers", reason="the comparison needs transformers")

QWEN3 = ["--model.name", "qwen3", "--training.global_batch_size", "2",
         "--optimizer.lr", "1e-2"]


def _save_hf_model(flavor: str, folder):
    """A random transformers model of the flavor's shape, saved as a HuggingFace folder."""
    torch.manual_seed(0)
    args = qwen3_flavors[flavor]
    cls = transformers.Qwen3ForCausalLM if args.moe is None else transformers.Qwen3MoeForCausalLM
    model = cls(hf_config(args)).float().eval()
    model.save_pretrained(folder)
    return model


def _hf_loss(model, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(inputs).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                           ignore_index=-100).item()


@pytest.mark.parametrize("flavor", ["debugmodel", "debugmodel_moe"])
def test_first_loss_and_export_match_transformers(flavor, one_process_group, corpus, tmp_path):
    hf_in = tmp_path / "hf_in"
    theirs = _save_hf_model(flavor, hf_in)
    job = [*QWEN3, "--model.flavor", flavor, "--checkpoint.initial_load_path", str(hf_in),
           "--checkpoint.initial_load_in_hf", "true", "--checkpoint.enable", "true",
           "--training.steps", "2", "--checkpoint.last_save_in_hf", "true"]
    trainer = build_trainer(job, tmp_path / "run", corpus, one_process_group)
    inputs, labels = next(iter(build_dataloader(trainer.config.training, trainer.tokenizer,
                                                dp_rank=0, dp_degree=1)))
    trainer.train()
    first = json.loads((tmp_path / "run/metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1
    assert abs(first["loss"] - _hf_loss(theirs, inputs, labels)) < 1e-5

    hf_out = tmp_path / "run/checkpoint/step-2-hf"  # [checkpoint] last_save_in_hf
    exported = transformers.AutoModelForCausalLM.from_pretrained(hf_out, dtype=torch.float32)
    model = trainer.model_parts[0].eval()
    with torch.no_grad():
        diff = (model(inputs) - exported.eval()(inputs).logits).abs().max().item()
    assert diff < 1e-4, diff


def test_mismatched_hf_folder_is_refused_before_start(corpus, tmp_path):
    """The config.json of another shape: one ConfigError naming the differing fields, at
    validation (no process group, no model)."""
    _save_hf_model("debugmodel", tmp_path / "hf")
    job = [*QWEN3, "--model.flavor", "debugmodel_moe",
           "--checkpoint.initial_load_path", str(tmp_path / "hf"),
           "--checkpoint.initial_load_in_hf", "true"]
    with pytest.raises(ConfigError, match=r"model_type: HF qwen3, ours qwen3_moe; .*num_exp"):
        parse_args(job_args(job, tmp_path / "run", corpus), 1)
