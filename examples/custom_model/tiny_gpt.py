"""A research model trained without editing the package: GPT-2 style (learned positions,
LayerNorm, GELU MLP), registered as ``tiny_gpt`` when [job] custom_import names this file.

    CONFIG_FILE=examples/custom_model/tiny_gpt.toml NPROC=2 ./run_train.sh
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from torchtitan_like.distributed.fsdp import apply_fsdp, reshard_after_forward
from torchtitan_like.distributed.utils import DTYPES
from torchtitan_like.models import BaseModelArgs, ModelSpec, register_model


@dataclasses.dataclass
class TinyGPTArgs(BaseModelArgs):
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = 512
    max_seq_len: int = 256

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
        self.blocks = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.ln_f = nn.LayerNorm(args.dim)
        self.head = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))

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
    """Data parallelism only: one FSDP unit per block, the rest in the root."""
    if parallel_dims.tp > 1 or parallel_dims.cp > 1 or parallel_dims.pp > 1:
        raise NotImplementedError("tiny_gpt has an FSDP/HSDP plan only")
    if parallel_dims.fsdp_enabled:
        apply_fsdp(
            model,
            meshes.fsdp,
            [[block] for block in model.blocks],
            param_dtype=DTYPES[config.training.mixed_precision_param],
            reduce_dtype=DTYPES[config.training.mixed_precision_reduce],
            reshard=reshard_after_forward(config.parallelism.fsdp_reshard_after_forward, False),
        )
    return model


register_model(
    ModelSpec(
        name="tiny_gpt",
        model_cls=TinyGPT,
        flavors={"small": TinyGPTArgs()},
        parallelize_fn=parallelize_tiny_gpt,
    )
)
