"""DeepSeek-V3 multi-token prediction (models/deepseek_v3/mtp.py): counts, the loss term through
the step hooks, its targets (the labels), the HuggingFace layout of its weights, the pipeline
split, the start-up refusals. Parity under FSDP, TP, PP and EP:
tests/parallel/test_expert_parallel.py."""

import dataclasses

import pytest
import torch

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed.tied_weights import tied_aliases
from torchtitan_like.models.deepseek_v3 import (
    DeepSeekV3HFAdapter,
    DeepSeekV3Model,
    deepseek_v3_flavors,
)
from torchtitan_like.models.deepseek_v3.mtp import shifted_tokens
from torchtitan_like.models.deepseek_v3.pipeline import pipeline_deepseek_v3
from torchtitan_like.protocols.loss import IGNORE_INDEX, cross_entropy_sum
from torchtitan_like.protocols.step_hooks import StepHooks, attach_step_hooks
from torchtitan_like.validate import parse_args

MTP = dataclasses.replace(deepseek_v3_flavors["debugmodel"], mtp_depth=1, max_seq_len=32)


def model_with(args=MTP, seed: int = 0) -> DeepSeekV3Model:
    """Built on meta and initialised after seeding, as the trainer does."""
    with torch.device("meta"):
        model = DeepSeekV3Model(args)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    model.init_weights()
    return model


def test_counts_include_the_mtp_depth_once_with_shared_embedding_and_head():
    model = model_with()
    assert MTP.num_params() == sum(p.numel() for p in model.parameters())
    plain = deepseek_v3_flavors["debugmodel"]
    extra = MTP.num_params() - plain.num_params()
    assert extra == sum(p.numel() for p in model.mtp.depths.parameters())  # embedding shared
    # one more (MoE) block forward+backward and the head again
    assert MTP.flops_per_token(32) > plain.flops_per_token(32) + 6 * plain.vocab_size * plain.dim


def train_step(model: DeepSeekV3Model, tokens: torch.Tensor,
               labels: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    hooks = StepHooks()
    attach_step_hooks(model, hooks)
    labels = torch.roll(tokens, -1, dims=1) if labels is None else labels
    total = torch.tensor(labels.numel())
    hooks.begin_step(total)
    with hooks.recording():
        loss = cross_entropy_sum(model(tokens, labels=labels), labels) / total
    loss.backward()
    hooks.end_step()
    values, _ = hooks.reduce(_NoMesh(), _NoMesh())
    return loss.detach(), values


class _NoMesh:
    device_type = "cpu"

    def size(self) -> int:
        return 1


def test_the_mtp_term_is_in_the_gradient_and_logged_apart():
    tokens = torch.randint(0, MTP.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    weighted, off = model_with(), model_with(dataclasses.replace(MTP, mtp_loss_weight=0.0))
    loss, values = train_step(weighted, tokens)
    loss_off, values_off = train_step(off, tokens)
    assert torch.equal(loss, loss_off)  # the logged loss is the main cross-entropy
    # the MTP metric: depth 1 scores labels 1..31, i.e. 32 - 1 positions per sequence (the last
    # one against the last label), normalised by all tokens
    assert values["aux_loss/mtp_ce"] == values_off["aux_loss/mtp_ce"] > 0
    assert values["aux_loss/mtp"] == pytest.approx(0.3 * values["aux_loss/mtp_ce"])
    assert values_off["aux_loss/mtp"] == 0.0
    depth = weighted.mtp.depths["0"]
    assert depth.eh_proj.weight.grad.abs().sum() > 0
    assert off.mtp.depths["0"].eh_proj.weight.grad.abs().sum() == 0
    # the shared head learns from both losses; with lambda = 0 exactly from the main one
    assert not torch.equal(weighted.output.weight.grad, off.output.weight.grad)
    plain = model_with(dataclasses.replace(MTP, mtp_depth=0))
    train_step(plain, tokens)
    assert torch.equal(plain.output.weight.grad, off.output.weight.grad)
    assert torch.equal(plain.layers["0"].attention.wo.weight.grad,
                       off.layers["0"].attention.wo.weight.grad)


def test_the_targets_are_the_labels_k_ahead_and_ignored_labels_are_not_scored():
    """Depth 1 at position i against labels[i + 1], the last position included, masked labels
    left out: the metric equals mtp.py's formula evaluated from the model's own modules."""
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, MTP.vocab_size, (2, 32), generator=generator)
    labels = torch.randint(0, MTP.vocab_size, (2, 32), generator=generator)
    labels[:, ::3] = IGNORE_INDEX
    model = model_with()
    _, values = train_step(model, tokens, labels)
    with torch.no_grad():
        h = model.tok_embeddings(tokens)
        for layer in model.layers.values():
            h = layer(h, model.rope_cache)
        depth = model.mtp.depths["0"]
        h = depth(h, model.tok_embeddings(shifted_tokens(tokens, 1)), model.rope_cache)
        ce = cross_entropy_sum(model.output(depth.norm(h))[:, :31], labels[:, 1:])
    assert values["aux_loss/mtp_ce"] == pytest.approx(float(ce) / labels.numel(), rel=1e-6)


def test_inference_and_validation_skip_the_mtp_depths():
    model = model_with()
    with torch.no_grad():
        logits = model(torch.zeros(1, 8, dtype=torch.long))
    assert logits.shape == (1, 8, MTP.vocab_size)


def test_huggingface_round_trip_under_the_hubs_layer_numbers():
    model = model_with()
    adapter = DeepSeekV3HFAdapter(MTP)
    ours = model.state_dict()
    hf = adapter.to_hf(ours)
    n = MTP.n_layers  # the MTP depth is layer n (model.layers.61 in DeepSeek-V3)
    for name in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                 "self_attn.o_proj.weight", "mlp.experts.0.gate_proj.weight"):
        assert f"model.layers.{n}.{name}" in hf, name
    assert torch.equal(hf[f"model.layers.{n}.shared_head.head.weight"], ours["output.weight"])
    assert torch.equal(hf[f"model.layers.{n}.embed_tokens.weight"],
                       ours["tok_embeddings.weight"])
    assert adapter.hf_config(torch.float32)["num_nextn_predict_layers"] == 1
    back = adapter.from_hf(hf)
    assert set(back) == set(ours)
    assert all(torch.equal(back[k], ours[k]) for k in ours)
    # a model without MTP reads the same checkpoint and ignores the MTP layer, as transformers
    plain = DeepSeekV3HFAdapter(dataclasses.replace(MTP, mtp_depth=0)).from_hf(hf)
    assert set(plain) == {k for k in ours if not k.startswith("mtp.")}


@pytest.mark.parametrize("flags, message", [
    (["--parallelism.context_parallel_degree", "2"], "context_parallel_degree = 2 is not"),
    (["--compile.enable", "true"], "compile\\] enable .* is not built"),
])
def test_refused_at_start_up(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(["--model.name", "deepseek_v3", "--model.overrides.mtp_depth", "1",
                    "--training.seq_len", "64", *flags], world_size=2)


def test_pipeline_split_puts_mtp_on_the_last_stage_with_a_tied_embedding():
    config = parse_args(["--model.name", "deepseek_v3", "--model.overrides.mtp_depth", "1",
                         "--training.seq_len", "32",
                         "--parallelism.pipeline_parallel_degree", "2"], world_size=2)
    with torch.device("meta"):
        model = DeepSeekV3Model(MTP)
    assert tied_aliases(model) == {"mtp.embedding.weight": "tok_embeddings.weight"}
    first, last = pipeline_deepseek_v3(model, [0, 1], config)
    assert first.mtp is None and first.tok_embeddings is not None
    assert last.tok_embeddings is None and last.output is not None
    assert "mtp.embedding.weight" in dict(last.named_parameters())


@pytest.mark.parametrize("flags, message", [
    (["--parallelism.pipeline_parallel_degree", "2",
      "--parallelism.pipeline_parallel_module_fqns_per_stage="
      "tok_embeddings layers.0,layers.1 layers.2 layers.3 norm output"],
     "list every module once, in model order.* norm output mtp"),
    (["--model.overrides.mtp_depth", "-1"], "mtp_depth = -1: must be >= 0"),
    (["--model.overrides.mtp_loss_weight", "-0.1"], "mtp_loss_weight = -0.1: must be >= 0"),
])
def test_pipeline_split_and_ranges_are_checked(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(["--model.name", "deepseek_v3", "--model.overrides.mtp_depth", "1",
                    "--training.seq_len", "64", *flags], world_size=2)
