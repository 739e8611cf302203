"""DeepSeek-V3's multi-token prediction (technical report, section 2.2), ``mtp_depth`` modules.

Module k (k = 1..D) combines the previous depth's hidden state at position i (the trunk's last
block output for k = 1, before the final norm) with the embedding of token i + k, and predicts
token i + k + 1 through the model's own embedding and output head (shared, as published):

    h'_i  = eh_proj([hnorm(h^{k-1}_i); enorm(Emb(t_{i+k}))])     (2 dim -> dim, no bias)
    h^k   = Block_k(h')                                          (a DeepSeek-V3 block, causal)
    p_i   = softmax(OutHead(norm_k(h^k_i)))                      (norm_k: HF's shared_head.norm)

    L_MTP = lambda / D * sum_k (1 / T) sum_i CE(p_i, t_{i+k+1})

with T the step's labelled tokens, as the main loss (protocols/loss.py). The term goes through
the step hooks (``add_loss("mtp", ...)``, protocols/step_hooks.py): the objective gains
L_MTP, the logged ``loss`` stays the main cross-entropy, and ``aux_loss/mtp`` logs L_MTP while
``aux_loss/mtp_ce`` logs the unweighted sum_k (1/T) sum_i CE (the MTP metric, also with
lambda = 0).

Shapes stay (batch, seq): module k reads the token ids shifted left by k (the last k positions
get token 0, a placeholder whose outputs come causally after every scored position and are
never scored), so sequence parallelism and the RoPE table apply unchanged. The targets are the
labels (``labels[i] = t_{i+1}``): position i at depth k is scored against ``labels[i + k]``,
i.e. seq - k positions per sequence: all DeepSeek scores, the last (i = seq - k - 1) against
the label of the last position, which the token ids alone do not hold; and a position whose label is
``protocols/loss.IGNORE_INDEX`` (masked by ``Trainer.post_dataloading_process``) is not
scored at that depth, as in the main loss. Every scored position reads only token ids
t_{j+k} with j <= i, all inside the sequence, so the placeholders never reach a score.

The embedding is the trunk's module itself, held here too (``embedding``): the unsplit model
reaches its weight as ``tok_embeddings.weight`` and ``mtp.embedding.weight``. Under pipeline
parallelism the MTP modules sit on the last stage beside the head, with that stage's copy of
the embedding, a weight tied across stages (distributed/tied_weights.py), and read the token
ids and labels as stage inputs (models/stage_inputs.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from torchtitan_like.models.attention_masks import AttentionMask
from torchtitan_like.models.deepseek_v3.args import DeepSeekV3Args
from torchtitan_like.models.norm import RMSNorm
from torchtitan_like.protocols.loss import cross_entropy_sum

BlockFactory = Callable[[int, DeepSeekV3Args], nn.Module]
"""(layer id, args) -> a DeepSeek-V3 block (model.py's DeepSeekV3Block)."""


class MultiTokenPrediction(nn.Module):
    """One MTP depth: the norms, the projection and a block (layer n_layers + k - 1, an MoE
    block in DeepSeek-V3). The embedding and head are the model's, passed in."""

    def __init__(self, block: nn.Module, args: DeepSeekV3Args):
        super().__init__()
        self.enorm = RMSNorm(args.dim, eps=args.norm_eps)
        self.hnorm = RMSNorm(args.dim, eps=args.norm_eps)
        self.eh_proj = nn.Linear(2 * args.dim, args.dim, bias=False)
        self.block = block
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, h: torch.Tensor, embedded_next: torch.Tensor, rope: torch.Tensor,
                mask: AttentionMask = None) -> torch.Tensor:
        """(previous depth's hidden state, embedding of the tokens k ahead) -> this depth's
        hidden state, before its norm."""
        combined = torch.cat([self.hnorm(h), self.enorm(embedded_next)], dim=-1)
        return self.block(self.eh_proj(combined), rope, mask=mask)

    def init_weights(self) -> None:
        for norm in (self.enorm, self.hnorm, self.norm):
            norm.reset_parameters()
        nn.init.trunc_normal_(self.eh_proj.weight, mean=0.0, std=0.02)
        self.block.init_weights()


def shifted_tokens(tokens: torch.Tensor, k: int) -> torch.Tensor:
    """Token ids moved k positions left, the last k filled with token 0 (never scored)."""
    return torch.cat([tokens[:, k:], tokens.new_zeros(tokens.shape[0], k)], dim=1)


class MTPLoss(nn.Module):
    """The MTP depths of a model and their loss term (module docstring). Holds the step hooks
    (protocols/step_hooks.py) and the trunk's embedding module (shared); the model calls
    ``forward`` with the trunk's output."""

    def __init__(self, args: DeepSeekV3Args, make_block: BlockFactory, embedding: nn.Embedding):
        super().__init__()
        self.weight = args.mtp_loss_weight
        self.embedding = embedding
        self.depths = nn.ModuleDict({
            str(k): MultiTokenPrediction(make_block(args.n_layers + k, args), args)
            for k in range(args.mtp_depth)})
        self.step_hooks = None

    def forward(self, h: torch.Tensor, token_ids: torch.Tensor, labels: torch.Tensor | None,
                head: nn.Module, rope: torch.Tensor, mask: AttentionMask = None) -> torch.Tensor:
        """Returns ``h`` (the carrier of the term, protocols/step_hooks.py); outside a
        training step (validation, inference) the depths do not run."""
        hooks = self.step_hooks
        if hooks is None or not torch.is_grad_enabled():
            return h
        if labels is None:
            raise ValueError("multi-token prediction scores against the labels: call the model "
                             "with labels=... in a training step (the trainer passes them)")
        ce = torch.zeros((), device=h.device)
        previous, seq = h, token_ids.shape[1]
        for k, depth in enumerate(self.depths.values(), start=1):
            previous = depth(previous, self.embedding(shifted_tokens(token_ids, k)), rope,
                             mask=mask)
            logits = head(depth.norm(previous))
            ce = ce + cross_entropy_sum(logits[:, :seq - k], labels[:, k:])
        h = hooks.add_loss("mtp", h, ce * (self.weight / len(self.depths)))
        return hooks.add_loss("mtp_ce", h, ce.detach())

    def init_weights(self) -> None:
        """The depths' own weights (the shared embedding is the trunk's to initialise)."""
        for depth in self.depths.values():
            depth.init_weights()
