"""A research model trained without editing the package: GPT-2 style (learned positions,
LayerNorm, GELU MLP), registered as ``tiny_gpt`` when [job] custom_import names this file.

It uses the extension points of docs/extending.md: a z-loss on the logits through the loss
hook and the largest logit log-sum-exp as a metric (protocols/step_hooks.py), a coefficient
that ``[model] overrides = { z_loss_coef = 1e-3 }`` sets, a tensor-parallel plan declared as a
``TPPlan`` (what is sharded, by name) with the attention and feed-forward styles of
distributed/tp_styles.py, the shared tail (distributed/plan_toolkit.py), and a pipeline
split; ModelSpec.supported_dims says TP and PP are the parallel dimensions besides data
parallelism it implements (CP and EP are refused at start-up).

The extra head: with ``mtp_depth = D > 0`` (an override) the model grows D multi-token-
prediction modules after the trunk (DeepSeek-V3's MTP), a second block group ``mtp`` on the
last pipeline stage. They read the batch's token ids and labels as keyword inputs
(ModelSpec.stage_inputs: every stage receives them) and share the trunk's embedding, which
under PP lives on the first stage: a weight tied across stages (distributed/tied_weights.py).
Its gathered logits (the z-loss needs whole rows) are declared with ModelSpec.loss_parallel.

    CONFIG_FILE=examples/custom_model/tiny_gpt.toml NPROC=2 ./run_train.sh
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed.pipeline import module_fqns_per_stage, prune_to_stage
from torchtitan_like.distributed.plan_toolkit import apply_block_tail
from torchtitan_like.distributed.tensor_parallel import TPPlan, apply_tp
from torchtitan_like.distributed.tp_styles import attention_plan, nested, swiglu_plan
from torchtitan_like.models import BaseModelArgs, ModelSpec, register_model
from torchtitan_like.protocols.loss import IGNORE_INDEX, cross_entropy_sum


@dataclasses.dataclass
class TinyGPTArgs(BaseModelArgs):
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = 512
    max_seq_len: int = 256
    z_loss_coef: float = 1e-4  # weight of logsumexp(logits)^2 per token (PaLM's z-loss)
    mtp_depth: int = 0  # multi-token-prediction modules (DeepSeek-V3's D); 0 = none
    mtp_loss_coef: float = 0.3  # their weight lambda: lambda / D x the sum of their losses

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
        mtp = 2 * d * d + 4 * d + block  # projection, two LayerNorms, block (embedding shared)
        return (embeddings + self.n_layers * block + 2 * d + d * self.vocab_size
                + self.mtp_depth * mtp)

    def flops_per_token(self, seq_len: int) -> int:
        """Every depth of MTP runs its block and the shared head once more."""
        matmuls = self.num_params() - (self.vocab_size + self.max_seq_len) * self.dim
        head_again = self.mtp_depth * self.dim * self.vocab_size
        blocks = self.n_layers + self.mtp_depth
        return 6 * (matmuls + head_again) + 12 * blocks * self.dim * seq_len


class Attention(nn.Module):
    """Causal self-attention; the head count comes from the width of q's output, so the same
    code runs on a TP rank holding a slice of the heads (tp_styles.attention_plan)."""

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


class MTPModule(nn.Module):
    """One multi-token-prediction depth k (DeepSeek-V3, arXiv:2412.19437, section 2.2): at
    position t it combines depth k-1's hidden state with the embedding of token t + k,
    ``h' = Block(W [norm(h); norm(emb(x_{t+k}))])``, from which the shared head predicts
    token t + k + 1. ``embed`` is the trunk's own embedding module (a shared weight)."""

    def __init__(self, args: TinyGPTArgs, embedding: nn.Embedding):
        super().__init__()
        self.embed = embedding
        self.norm_h, self.norm_e = nn.LayerNorm(args.dim), nn.LayerNorm(args.dim)
        self.proj = nn.Linear(2 * args.dim, args.dim, bias=False)
        self.block = Block(args)

    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        e = self.embed(tokens)
        return self.block(self.proj(torch.cat([self.norm_h(h), self.norm_e(e)], dim=-1)))


class TinyGPT(nn.Module):
    def __init__(self, args: TinyGPTArgs):
        super().__init__()
        self.tok_emb = nn.Embedding(args.vocab_size, args.dim)
        self.pos_emb = nn.Embedding(args.max_seq_len, args.dim)
        self.blocks = nn.ModuleDict({str(i): Block(args) for i in range(args.n_layers)})
        self.ln_f = nn.LayerNorm(args.dim)
        self.head = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.mtp = nn.ModuleDict({str(k): MTPModule(args, self.tok_emb)
                                  for k in range(args.mtp_depth)})
        self.z_loss_coef, self.mtp_loss_coef = args.z_loss_coef, args.mtp_loss_coef
        self.step_hooks = None  # given by the trainer (protocols/step_hooks.py)

    def forward(self, x: torch.Tensor, *, token_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids -> logits; a pipeline stage without the embeddings takes hidden states,
        one without the head returns them. ``token_ids`` and ``labels`` (every stage gets
        them, ModelSpec.stage_inputs) feed the MTP modules in training."""
        h = x
        if self.tok_emb is not None:
            positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
            h = self.tok_emb(x) + self.pos_emb(positions)
        for block in self.blocks.values():
            h = block(h)
        if self.head is None:
            return h
        logits = self.head(self.ln_f(h))
        if self.step_hooks is not None:
            z = torch.logsumexp(logits.float(), dim=-1)
            logits = self.step_hooks.add_loss("z_loss", logits, self.z_loss_coef * (z**2).sum())
            self.step_hooks.record_metric("max_logsumexp", z.detach().amax(), reduce="max")
            if self.mtp and self.training:
                logits = self.step_hooks.add_loss("mtp", logits,
                                                  self.mtp_loss_sum(h, token_ids, labels))
        return logits

    def mtp_loss_sum(self, h: torch.Tensor, token_ids: torch.Tensor,
                     labels: torch.Tensor) -> torch.Tensor:
        """lambda / D x the sum over depths k of the cross-entropy sum of predicting token
        t + k + 1 at every position t that has one. The stream x_0 .. x_S is the inputs and
        the last label; depth k reads x_{t+k} (0 past the end) and is scored on
        ``labels[t + k]`` = x_{t+k+1} (ignored past the end)."""
        seq = token_ids.shape[1]
        stream = torch.cat([token_ids, labels[:, -1:].clamp(min=0)], dim=1)
        total = torch.zeros((), device=h.device)
        for k, module in enumerate(self.mtp.values(), 1):
            h = module(h, F.pad(stream, (0, k))[:, k : k + seq])
            targets = F.pad(labels, (0, k), value=IGNORE_INDEX)[:, k : k + seq]
            total = total + cross_entropy_sum(self.head(self.ln_f(h)), targets)
        return self.mtp_loss_coef / len(self.mtp) * total

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
    compile and one FSDP unit per block of both block groups (trunk and MTP), the rest (the
    shared embedding among it) in the root."""
    apply_tp(model, tp_plan(model), parallel_dims, meshes, config)
    apply_block_tail(model, [model.blocks, model.mtp], parallel_dims, meshes, config)
    return model


def tp_plan(model: TinyGPT) -> TPPlan:
    """Megatron TP with sequence parallelism: hidden states between modules are this rank's
    sequence shard (Shard(1)). Both embedding tables are split by rows (token ids, positions),
    their partial lookups reduce-scattered into sequence shards; the final LayerNorm runs on
    the shard; the head gathers whole logits on every TP rank (ModelSpec.loss_parallel =
    False): the z-loss needs each row's log-sum-exp, and every TP rank computes the same loss
    terms from them. The MTP modules' embedding is the trunk's, split once (or the last
    stage's copy of it, split alike)."""
    return TPPlan(blocks={"blocks": block_tp_plan, "mtp": mtp_tp_plan}, norm="ln_f", head="head",
                  embeddings=("tok_emb", "pos_emb", *(f"mtp.{k}.embed" for k in model.mtp)))


def block_tp_plan(block: Block, device: str) -> dict[str, ParallelStyle]:
    """The toolkit's column-wise/row-wise pairs around attention and MLP, LayerNorms on the
    sequence shard."""
    return {
        "ln1": SequenceParallel(),
        **attention_plan(block, device, name="attn", qkv=("q", "k", "v"), out="proj",
                         extra_inputs=0),
        "ln2": SequenceParallel(),
        **swiglu_plan(block, device, name="mlp", gate_up=("fc",), down="out"),
    }


def mtp_tp_plan(module: MTPModule, device: str) -> dict[str, ParallelStyle]:
    """An MTP module's norms and projection on sequence shards like a norm (SequenceParallel:
    replicated weight, its gradient summed over TP); its block takes a local sequence shard."""
    return {"norm_h": SequenceParallel(), "norm_e": SequenceParallel(),
            "proj": SequenceParallel(use_local_output=True),
            **nested("block", block_tp_plan(module.block, device))}


def pipeline_tiny_gpt(model: TinyGPT, stage_ids: list[int], config) -> list[TinyGPT]:
    """Embeddings open the first stage, the final norm, head and MTP modules close the last
    (with their copy of the embedding); blocks are balanced (or split as [parallelism]
    pipeline_parallel_module_fqns_per_stage says)."""
    fqns = module_fqns_per_stage(config.parallelism, len(model.blocks),
                                 first=["tok_emb", "pos_emb"],
                                 last=["ln_f", "head", *(f"mtp.{k}" for k in model.mtp)],
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
        stage_inputs=frozenset({"token_ids", "labels"}),  # for the MTP modules
        loss_parallel=False,  # the head gathers whole logits: the z-loss needs whole rows
    )
)
