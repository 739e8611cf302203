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
never scored), so sequence parallelism and the RoPE table apply unchanged. Targets come from
the token ids too: position i is scored while i + k + 1 < seq, i.e. seq - k - 1 positions per
sequence (DeepSeek also scores position seq - k, whose target is the label of the last
position, which the model does not see; labels on every stage are issue 25's). Positions whose
label a ``post_dataloading_process`` masks are not masked here (the built-in data masks none).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from torchtitan_like.models.attention_masks import AttentionMask
from torchtitan_like.models.deepseek_v3.args import DeepSeekV3Args
from torchtitan_like.protocols.loss import cross_entropy_sum

BlockFactory = Callable[[int, DeepSeekV3Args], nn.Module]
"""(layer id, args) -> a DeepSeek-V3 block (model.py's DeepSeekV3Block)."""


class MultiTokenPrediction(nn.Module):
    """One MTP depth: the norms, the projection and a block (layer n_layers + k - 1, an MoE
    block in DeepSeek-V3). The embedding and head are the model's, passed in."""

    def __init__(self, block: nn.Module, args: DeepSeekV3Args):
        super().__init__()
        self.enorm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.hnorm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.eh_proj = nn.Linear(2 * args.dim, args.dim, bias=False)
        self.block = block
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)

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
    (protocols/step_hooks.py); the model calls ``forward`` with the trunk's output."""

    def __init__(self, args: DeepSeekV3Args, make_block: BlockFactory):
        super().__init__()
        self.weight = args.mtp_loss_weight
        self.depths = nn.ModuleDict({
            str(k): MultiTokenPrediction(make_block(args.n_layers + k, args), args)
            for k in range(args.mtp_depth)})
        self.step_hooks = None

    def forward(self, h: torch.Tensor, tokens: torch.Tensor, embedding: nn.Module,
                head: nn.Module, rope: torch.Tensor, mask: AttentionMask = None) -> torch.Tensor:
        """Returns ``h`` (the carrier of the term, protocols/step_hooks.py); outside a
        training step (validation, inference) the depths do not run."""
        hooks = self.step_hooks
        if hooks is None or not torch.is_grad_enabled():
            return h
        ce = torch.zeros((), device=tokens.device)
        previous = h
        for k, depth in enumerate(self.depths.values(), start=1):
            previous = depth(previous, embedding(shifted_tokens(tokens, k)), rope, mask=mask)
            logits = head(depth.norm(previous))
            scored = tokens.shape[1] - k - 1
            ce = ce + cross_entropy_sum(logits[:, :scored], tokens[:, k + 1:])
        h = hooks.add_loss("mtp", h, ce * (self.weight / len(self.depths)))
        return hooks.add_loss("mtp_ce", h, ce.detach())

    def init_weights(self) -> None:
        for depth in self.depths.values():
            depth.init_weights()
