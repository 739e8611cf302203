"""Qwen3 hyper-parameters, the published flavors (dense and MoE), their parameter and FLOP counts.

Qwen3 is the llama skeleton with three differences that matter here: the head size is its own
hyper-parameter (128 in every published model, not dim / n_heads), queries and keys are
RMS-normalised per head before RoPE, and the MoE flavors replace every feed-forward with
token-choice top-k experts (softmax over all experts, top-k weights renormalised, no shared
expert, no selection bias). Shapes are the published config.json files of Qwen/Qwen3-*.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from torchtitan_like.config.derived import float8_enabled
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed.layout_rules import (
    check_moe_tensor_parallel,
)
from torchtitan_like.models.llama3.args import check_heads_and_layout
from torchtitan_like.models.moe import MoEArgs
from torchtitan_like.protocols.model_args import BaseModelArgs, check_arg_ranges

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import ParallelDims


def qwen3_moe(num_experts: int, top_k: int) -> MoEArgs:
    """Qwen3-MoE routing: softmax gating, renormalised top-k, no shared expert, no bias."""
    return MoEArgs(num_experts=num_experts, top_k=top_k, score_func="softmax", route_norm=True,
                   num_shared_experts=0, load_balance_coeff=None)


@dataclasses.dataclass
class Qwen3Args(BaseModelArgs):
    dim: int = 1024
    n_layers: int = 28
    n_heads: int = 16
    n_kv_heads: int = 8
    head_dim: int = 128
    hidden_dim: int = 3072  # the dense SwiGLU width (unused by MoE flavors)
    vocab_size: int = 151936
    norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_seq_len: int = 40960  # rows of the RoPE table; set to training.seq_len by the trainer
    depth_init: bool = True  # init std of output projections shrinks with layer depth
    tie_word_embeddings: bool = False
    moe: MoEArgs | None = None  # None = dense; else every feed-forward is this MoE
    moe_hidden_dim: int = 768  # one expert's SwiGLU width

    rope_scaling = None  # no frequency scaling (read by the llama skeleton's RoPE table)
    qk_norm = True  # per-head q/k RMSNorm before RoPE (read by the planner's activation count)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads

    @property
    def ffn_hidden_dim(self) -> int:
        return self.hidden_dim

    def update_from_config(self, job_config: JobConfig) -> None:
        self.max_seq_len = job_config.training.seq_len

    def validate(self, job_config: JobConfig, parallel_dims: ParallelDims) -> None:
        flavor = f"[model] flavor {job_config.model.flavor}"
        check_arg_ranges(self, flavor, positive=(
            "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "vocab_size",
            "norm_eps", "rope_theta", "max_seq_len", "moe_hidden_dim"))
        if self.head_dim % 2:
            raise ConfigError(f"{flavor}: head_dim {self.head_dim} must be even (RoPE rotates "
                              "pairs)")
        if self.moe is not None:
            check_moe_tensor_parallel(parallel_dims.tp, float8=float8_enabled(job_config),
                                      where=flavor)
        if (self.moe is not None and job_config.checkpoint.initial_load_in_hf
                and (parallel_dims.fsdp_enabled or parallel_dims.tp > 1)):
            raise ConfigError(f"{flavor}: HF expert weights are read one tensor per expert, "
                              "into unsharded stacks; with FSDP/HSDP/CP/TP convert the folder "
                              "to a seed checkpoint first (scripts/convert_hf.py from_hf) and "
                              "set initial_load_path to it with initial_load_in_hf = false")
        check_heads_and_layout(self, job_config, parallel_dims)

    def _block_params(self, experts: int) -> int:
        """One block with ``experts`` routed experts counted (all of them, or top_k)."""
        d, q, kv = self.dim, self.n_heads * self.head_dim, self.kv_heads * self.head_dim
        attention = 2 * d * q + 2 * d * kv + 2 * self.head_dim  # + the q and k norms
        if self.moe is None:
            feed_forward = 3 * d * self.hidden_dim
        else:
            feed_forward = 3 * d * self.moe_hidden_dim * experts + d * self.moe.num_experts
        return attention + feed_forward + 2 * d  # + two RMSNorm weights

    def _embedding_params(self) -> int:
        return self.vocab_size * self.dim * (1 if self.tie_word_embeddings else 2)

    def num_routed_experts(self) -> int:
        return 0 if self.moe is None else self.moe.num_experts

    def num_params(self) -> int:
        experts = 0 if self.moe is None else self.moe.num_experts
        return self.n_layers * self._block_params(experts) + self._embedding_params() + self.dim

    def num_active_params(self) -> int:
        """What one token's computation multiplies: top_k experts, no embedding lookup (the
        head's matmul counts even when tied)."""
        experts = 0 if self.moe is None else self.moe.top_k
        return self.n_layers * self._block_params(experts) + self.vocab_size * self.dim + self.dim

    def flops_per_token(self, seq_len: int) -> int:
        """6 per active weight (2 forward, 4 backward) plus attention's QK^T and AV over the
        full score matrix (as llama3, TorchTitan and PaLM count it)."""
        attention = 12 * self.n_layers * self.n_heads * self.head_dim * seq_len
        return 6 * self.num_active_params() + attention


def _dense(dim: int, n_layers: int, n_heads: int, hidden_dim: int, tied: bool) -> Qwen3Args:
    return Qwen3Args(dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=8,
                     hidden_dim=hidden_dim, tie_word_embeddings=tied)


qwen3_flavors: dict[str, Qwen3Args] = {
    # Tests and quick CPU runs: grouped-query attention, head_dim != dim / n_heads, tied.
    "debugmodel": Qwen3Args(dim=128, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=32,
                            hidden_dim=256, vocab_size=2048, tie_word_embeddings=True),
    "debugmodel_moe": Qwen3Args(dim=128, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=32,
                                vocab_size=2048, moe=qwen3_moe(8, 2), moe_hidden_dim=64),
    "0.6B": _dense(1024, 28, 16, 3072, tied=True),
    "1.7B": _dense(2048, 28, 16, 6144, tied=True),
    "4B": _dense(2560, 36, 32, 9728, tied=True),
    "8B": _dense(4096, 36, 32, 12288, tied=False),
    "14B": _dense(5120, 40, 40, 17408, tied=False),
    "32B": _dense(5120, 64, 64, 25600, tied=False),
    "30B-A3B": Qwen3Args(dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, hidden_dim=6144,
                         moe=qwen3_moe(128, 8), moe_hidden_dim=768),
    "235B-A22B": Qwen3Args(dim=4096, n_layers=94, n_heads=64, n_kv_heads=4, hidden_dim=12288,
                           moe=qwen3_moe(128, 8), moe_hidden_dim=1536),
}
