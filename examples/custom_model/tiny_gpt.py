"""A research model trained without editing the package: GPT-2 style (learned positions,
LayerNorm, GELU MLP), registered as ``tiny_gpt`` when [job] custom_import names this file.

It uses the extension points of docs/extending.md: a z-loss on the logits through the loss
hook and the largest logit log-sum-exp as a metric (components/model_hooks.py), a coefficient
that ``[model] overrides = { z_loss_coef = 1e-3 }`` sets, a tensor-parallel plan from the plan
toolkit's attention and feed-forward styles and its shared tail (distributed/plan_toolkit.py),
and a pipeline split; ModelSpec.supported_dims says TP and PP are the parallel dimensions
besides data parallelism it implements (CP and EP are refused at start-up).

    CONFIG_FILE=examples/custom_model/tiny_gpt.toml NPROC=2 ./run_train.sh
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed.pipeline import module_fqns_per_stage, prune_to_stage
from torchtitan_like.distributed.plan_toolkit import apply_block_tail, attention_plan, swiglu_plan
from torchtitan_like.models import BaseModelArgs, ModelSpec, register_model


@dataclasses.dataclass
class TinyGPTArgs(BaseModelArgs):
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = 512
    max_seq_len: int = 256
    z_loss_coef: float = 1e-4  # weight of logsumexp(logits)^2 per token (PaLM's z-loss)

    def update_from_config(self, job_config) -> None:
        self.max_seq_len = job_config.training.seq_len

    def validate(self, job_config, parallel_dims) -> None:
        if self.n_heads % parallel_dims.tp:  # the TP plan gives every rank whole heads
            raise ConfigError(f"[parallelism] tensor_parallel_degree = {parallel_dims.tp} must "
                              f"divide tiny_gpt's n_heads = {self.n_heads}")

    def num_params(self) -> int:
        d = self.dim
        block = 4 * d * d + 4 * d + 8 * d * d + 5 * d + 4 * d  # attention, MLP, two LayerNorms
        embeddings = (self.vocab_size + self.max_seq_len) * d
        return embeddings + self.n_layers * block + 2 * d + d * self.vocab_size

    def flops_per_token(self, seq_len: int) -> int:
        matmuls = self.num_params() - (self.vocab_size + self.max_seq_len) * self.dim
        return 6 * matmuls + 12 * self.n_layers * self.dim * seq_len


class Attention(nn.Module):
    """Causal self-attention; the head count comes from the width of q's output, so the same
    code runs on a TP rank holding a slice of the heads (plan_toolkit.attention_plan)."""

    def __init__(self, args: TinyGPTArgs):
        super().__init__()
        self.head_dim = args.dim // args.n_heads
        self.q, self.k, self.v = (nn.Linear(args.dim, args.dim) for _ in range(3))
        self.proj = nn.Linear(args.dim, args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        q, k, v = (linear(x).view(bs, seq, -1, self.head_dim).transpose(1, 2)
                   for linear in (self.q, self.k, self.v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(attn.transpose(1, 2).reshape(bs, seq, -1))


class MLP(nn.Module):
    def __init__(self, args: TinyGPTArgs):
        super().__init__()
        self.fc = nn.Linear(args.dim, 4 * args.dim)
        self.out = nn.Linear(4 * args.dim, args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, args: TinyGPTArgs):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(args.dim), nn.LayerNorm(args.dim)
        self.attn, self.mlp = Attention(args), MLP(args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, args: TinyGPTArgs):
        super().__init__()
        self.tok_emb = nn.Embedding(args.vocab_size, args.dim)
        self.pos_emb = nn.Embedding(args.max_seq_len, args.dim)
        self.blocks = nn.ModuleDict({str(i): Block(args) for i in range(args.n_layers)})
        self.ln_f = nn.LayerNorm(args.dim)
        self.head = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.z_loss_coef = args.z_loss_coef
        self.step_hooks = None  # given by the trainer (components/model_hooks.py)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids -> logits; a pipeline stage without the embeddings takes hidden states,
        one without the head returns them."""
        h = tokens
        if self.tok_emb is not None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
            h = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks.values():
            h = block(h)
        if self.head is None:
            return h
        logits = self.head(self.ln_f(h))
        if self.step_hooks is not None:
            z = torch.logsumexp(logits.float(), dim=-1)
            logits = self.step_hooks.add_loss("z_loss", logits, self.z_loss_coef * (z**2).sum())
            self.step_hooks.record_metric("max_logsumexp", z.detach().amax(), reduce="max")
        return logits

    @torch.no_grad()
    def init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()


def parallelize_tiny_gpt(model: TinyGPT, parallel_dims, meshes, config) -> TinyGPT:
    """TP (each pipeline stage comes here like a whole model), then activation checkpointing,
    compile and one FSDP unit per block, the rest in the root."""
    if parallel_dims.tp_enabled:
        apply_tp(model, meshes.tp)
    apply_block_tail(model, model.blocks, parallel_dims, meshes, config)
    return model


def apply_tp(model: TinyGPT, tp_mesh) -> None:
    """Megatron TP with sequence parallelism: hidden states between modules are this rank's
    sequence shard (Shard(1)). Both embedding tables are split by rows (token ids, positions),
    their partial lookups reduce-scattered into sequence shards; LayerNorms run on the shard;
    attention and MLP use the toolkit's column-wise/row-wise pairs. The head gathers whole
    logits on every TP rank (no loss parallel): the z-loss needs each row's log-sum-exp, and
    every TP rank computes the same loss terms from them."""
    edges = {}
    for name in ("tok_emb", "pos_emb"):
        if getattr(model, name) is not None:
            edges[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.head is not None:
        edges["ln_f"] = SequenceParallel()
        edges["head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    parallelize_module(model, tp_mesh, edges)
    device = tp_mesh.device_type
    for block in model.blocks.values():
        parallelize_module(block, tp_mesh, {
            "ln1": SequenceParallel(),
            **attention_plan(block, device, name="attn", qkv=("q", "k", "v"), out="proj",
                             extra_inputs=0),
            "ln2": SequenceParallel(),
            **swiglu_plan(block, device, name="mlp", gate_up=("fc",), down="out"),
        })


def pipeline_tiny_gpt(model: TinyGPT, stage_ids: list[int], config) -> list[TinyGPT]:
    """Embeddings open the first stage, the final norm and head close the last; blocks are
    balanced (or split as [parallelism] pipeline_parallel_module_fqns_per_stage says)."""
    fqns = module_fqns_per_stage(config.parallelism, len(model.blocks),
                                 first=["tok_emb", "pos_emb"], last=["ln_f", "head"],
                                 blocks="blocks")
    return [prune_to_stage(model, fqns[stage]) for stage in stage_ids]


register_model(
    ModelSpec(
        name="tiny_gpt",
        model_cls=TinyGPT,
        flavors={"small": TinyGPTArgs()},
        parallelize_fn=parallelize_tiny_gpt,
        pipelining_fn=pipeline_tiny_gpt,
        supported_dims=frozenset({"tp", "pp"}),
    )
)
