"""A research model trained without editing the package: GPT-2 style (learned positions,
LayerNorm, GELU MLP), registered as ``tiny_gpt`` when [job] custom_import names this file.

It uses the extension points of docs/extending.md: a z-loss on the logits through the loss
hook and the largest logit log-sum-exp as a metric (components/model_hooks.py), a coefficient
that ``[model] overrides = { z_loss_coef = 1e-3 }`` sets, the plan toolkit's shared tail
(distributed/plan_toolkit.py) and a pipeline split; ModelSpec.supported_dims says PP is the
one parallel dimension besides data parallelism it implements.

    CONFIG_FILE=examples/custom_model/tiny_gpt.toml NPROC=2 ./run_train.sh
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from torchtitan_like.distributed.pipeline import module_fqns_per_stage, prune_to_stage
from torchtitan_like.distributed.plan_toolkit import apply_block_tail
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

    def num_params(self) -> int:
        d = self.dim
        block = 4 * d * d + 4 * d + 8 * d * d + 5 * d + 4 * d  # attention, MLP, two LayerNorms
        embeddings = (self.vocab_size + self.max_seq_len) * d
        return embeddings + self.n_layers * block + 2 * d + d * self.vocab_size

    def flops_per_token(self, seq_len: int) -> int:
        matmuls = self.num_params() - (self.vocab_size + self.max_seq_len) * self.dim
        return 6 * matmuls + 12 * self.n_layers * self.dim * seq_len


class Block(nn.Module):
    def __init__(self, args: TinyGPTArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.ln1, self.ln2 = nn.LayerNorm(args.dim), nn.LayerNorm(args.dim)
        self.qkv = nn.Linear(args.dim, 3 * args.dim)
        self.proj = nn.Linear(args.dim, args.dim)
        self.fc = nn.Linear(args.dim, 4 * args.dim)
        self.out = nn.Linear(4 * args.dim, args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seq, dim = x.shape
        q, k, v = (t.view(bs, seq, self.n_heads, -1).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(bs, seq, dim))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


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
            positions = torch.arange(tokens.shape[1], device=tokens.device)
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
    """Data parallelism and PP (each stage comes here like a whole model): activation
    checkpointing, compile and one FSDP unit per block, the rest in the root."""
    apply_block_tail(model, model.blocks, parallel_dims, meshes, config)
    return model


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
        supported_dims=frozenset({"pp"}),
    )
)
