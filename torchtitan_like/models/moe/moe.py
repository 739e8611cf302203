"""The MoE feed-forward layer: route -> sort by expert -> experts -> unsort and combine, plus
the shared experts. Dropless: every token reaches all of its top-k experts.

Load balancing lives here as state, not as parallelism: ``expert_bias`` (persistent, saved in
checkpoints) steers the choice of experts and is updated after each optimizer step by
balancing.py from ``tokens_per_expert``, which this layer counts in forward (completed by
the step hooks where ranks route parts of one group's tokens). The sequence-wise auxiliary
loss reaches the training loss through the step hooks (``step_hooks.add_loss``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from torchtitan_like.models.feed_forward import FeedForward
from torchtitan_like.models.moe.args import MoEArgs
from torchtitan_like.models.moe.experts import GroupedExperts
from torchtitan_like.models.moe.router import TokenChoiceTopKRouter
from torchtitan_like.protocols.step_hooks import recomputing


class MoE(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, args: MoEArgs, layer_id: int = 0,
                 num_layers: int = 1):
        """``hidden_dim`` is one expert's SwiGLU width; ``layer_id`` of ``num_layers`` names
        this layer in the load metrics."""
        super().__init__()
        self.args = args
        self.layer_id, self.num_layers = layer_id, num_layers
        self.router = TokenChoiceTopKRouter(dim, args)
        self.experts = GroupedExperts(dim, hidden_dim, args.num_experts, args.use_grouped_mm)
        self.shared_experts = (FeedForward(dim, hidden_dim * args.num_shared_experts)
                               if args.num_shared_experts else None)
        self.expert_bias: torch.Tensor | None
        if args.load_balance_coeff is None:
            self.expert_bias = None
        else:
            self.register_buffer("expert_bias", torch.zeros(args.num_experts), persistent=True)
        self.register_buffer("tokens_per_expert", torch.zeros(args.num_experts),
                             persistent=False)
        self.step_hooks = None  # set by attach_step_hooks (protocols/step_hooks.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (bs, seq, dim) -> (bs, seq, dim)."""
        bs, seq_len, dim = x.shape
        flat = x.reshape(-1, dim)
        weights, selected, scores = self.router(flat, self.expert_bias)
        counts = torch.zeros(self.args.num_experts, dtype=torch.int64, device=x.device)
        counts.scatter_add_(0, selected.flatten(), torch.ones_like(selected.flatten()))
        self._count_tokens(counts)
        if self.step_hooks is not None and self.args.aux_loss_coeff > 0:
            aux = sequence_balance_loss(scores, selected, bs, self.args,
                                        self.step_hooks.sequence_sum,
                                        self.step_hooks.sequence_shards)
            x = self.step_hooks.add_loss("moe_aux", x, aux)
            flat = x.reshape(-1, dim)
        # Sort the (token, choice) pairs by expert; a stable sort keeps token order within an
        # expert, so the layout of every expert's rows is fixed by the data alone.
        order = torch.argsort(selected.flatten(), stable=True)
        routed = self.experts(flat[order // self.args.top_k], counts)
        unsorted = routed[torch.argsort(order)].view(-1, self.args.top_k, dim)
        out = (unsorted.float() * weights.unsqueeze(-1)).sum(dim=1).type_as(x)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(bs, seq_len, dim)

    def _count_tokens(self, counts: torch.Tensor) -> None:
        """Accumulate the load for the bias update, and record it as a metric, in the
        forwards of real training microbatches only: with step hooks attached, exactly the
        forwards they record (not a pipeline's metadata-inference forward on uninitialised
        tensors); without, training-mode forwards with autograd on. Never while activation
        checkpointing recomputes a forward inside backward, which would count every token
        twice."""
        if self.step_hooks is not None:
            counted = self.step_hooks.records_now
        else:
            counted = self.training and torch.is_grad_enabled() and not recomputing()
        if not counted:
            return
        if self.step_hooks is None:
            self.tokens_per_expert.add_(counts.to(self.tokens_per_expert.dtype))
            return
        # ranks routing shards of the same sequences (ETP = 1) each counted their own tokens
        load = self.step_hooks.sum_unreduced_splits(counts)
        self.tokens_per_expert.add_(load.to(self.tokens_per_expert.dtype))
        self._record_load(load)

    def _record_load(self, counts: torch.Tensor) -> None:
        """Per step, this layer's max/mean tokens per expert over the global batch (metrics
        file and TensorBoard), and on the console the worst MoE layer's: every layer adds its
        counts as its own row of one (num_layers, num_experts) table."""
        counts = counts.float()
        self.step_hooks.record_metric(f"moe_imbalance/layer{self.layer_id}", counts,
                                      derive=load_imbalance, console=False)
        table = torch.zeros(self.num_layers, counts.numel(), device=counts.device)
        table[self.layer_id] = counts
        self.step_hooks.record_metric("moe_imbalance/worst", table, derive=worst_imbalance)

    def init_weights(self, init_std: float) -> None:
        self.router.init_weights(init_std)
        self.experts.init_weights(init_std)
        if self.shared_experts is not None:
            self.shared_experts.init_weights(init_std)
        if self.expert_bias is not None:
            self.expert_bias.zero_()
        self.tokens_per_expert.zero_()


def routed_experts(blocks: Iterable[nn.Module]) -> list[GroupedExperts]:
    """The GroupedExperts of the MoE layers among ``blocks`` (a model part's blocks, each with
    ``moe_enabled`` and ``moe``): what expert parallelism shards."""
    return [block.moe.experts for block in blocks if block.moe_enabled]


def load_imbalance(tokens_per_expert: torch.Tensor) -> float:
    """max / mean tokens per expert (1 = perfectly balanced, num_experts = all on one)."""
    return (tokens_per_expert.max() / tokens_per_expert.mean().clamp(min=1e-12)).item()


def worst_imbalance(tokens_per_expert_per_layer: torch.Tensor) -> float:
    """The highest ``load_imbalance`` among the rows (layers) that received tokens."""
    return max(load_imbalance(row) for row in tokens_per_expert_per_layer if row.sum() > 0)


def sequence_balance_loss(scores: torch.Tensor, selected: torch.Tensor, batch_size: int,
                          args: MoEArgs,
                          sequence_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
                          shards: int = 1) -> torch.Tensor:
    """DeepSeek-V3's complementary sequence-wise balance loss, summed over the sequences:
    per sequence of T tokens, alpha * sum_i f_i * P_i with
    f_i = N_r / (K_r * T) * #{tokens choosing expert i} and P_i = mean_t s'_{i,t}, where s' are
    the affinities normalised over all experts. Multiplied by T, the sum is in the units of a
    cross-entropy *sum*, so the trainer's division by the global token count yields the mean
    over sequences whatever the layout.

    Under context parallelism a rank holds T / ``shards`` tokens of every sequence. The term is
    bilinear: f_i is a count over the whole sequence (``sequence_sum`` of the ranks' counts:
    integers, exact, no gradient) and P_i a sum over tokens; so each rank adds
    alpha * T * sum_i f_i * (its tokens' sum of s'_i) / T, and the ranks' terms add up to the
    one-process term, whose gradient reaches each token's scores on the rank that holds it."""
    experts, k = args.num_experts, args.top_k
    scores = scores.view(batch_size, -1, experts)
    seq_len = scores.shape[1] * shards
    normalised = scores / scores.sum(dim=-1, keepdim=True)
    p = normalised.sum(dim=1) / seq_len  # (bs, experts): this rank's share of the mean
    chosen = torch.zeros_like(p).scatter_add_(
        1, selected.view(batch_size, -1), torch.ones_like(selected.view(batch_size, -1),
                                                          dtype=p.dtype))
    f = sequence_sum(chosen) * experts / (k * seq_len)
    return args.aux_loss_coeff * seq_len * (f * p).sum()
