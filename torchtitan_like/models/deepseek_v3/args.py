"""DeepSeek-V2/V3 hyper-parameters, the published flavors, and their parameter and FLOP counts.

Counts follow the published convention: the total counts every parameter of the main model
(embedding and head included, DeepSeek-V3's multi-token-prediction module excluded: 671B, not
the 685B of its checkpoint; with ``mtp_depth`` > 0 the MTP depths' own parameters count too,
their shared embedding and head once). The active count is what one token's computation multiplies:
the routed experts it is sent to (``top_k``, not all) and no embedding table (a lookup):
36.6B for DeepSeek-V3 (published 37B), 20.9B for V2 (21B), 2.45B for V2-Lite (2.4B). The
published figures are rounded; tests/unit/test_deepseek_v3.py pins ours."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from torchtitan_like.config.derived import float8_enabled
from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed.layout_rules import (
    check_moe_tensor_parallel,
    check_multi_token_prediction,
    check_tensor_parallel_shapes,
)
from torchtitan_like.models.moe import MoEArgs
from torchtitan_like.models.stage_layout import fqns_per_stage
from torchtitan_like.protocols.model_args import BaseModelArgs, check_arg_ranges

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import ParallelDims


@dataclasses.dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling as DeepSeek publishes it: beyond ``original_max_position`` the low
    frequencies are divided by ``factor`` with a ramp between the ``beta_fast`` and
    ``beta_slow`` rotation counts, and attention logits are scaled by mscale(mscale_all_dim)^2."""

    factor: float = 40.0
    original_max_position: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 1.0


@dataclasses.dataclass
class DeepSeekV3Args(BaseModelArgs):
    dim: int = 7168
    n_layers: int = 61
    n_dense_layers: int = 3  # the first blocks use a dense SwiGLU instead of the MoE
    n_heads: int = 128
    vocab_size: int = 129280
    inter_dim: int = 18432  # hidden size of the dense blocks' SwiGLU
    moe_inter_dim: int = 2048  # hidden size of one expert (shared experts: times their count)
    moe: MoEArgs = dataclasses.field(default_factory=MoEArgs)
    q_lora_rank: int = 1536  # 0 = queries projected directly (no low-rank compression)
    kv_lora_rank: int = 512  # the compressed KV latent
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64  # the decoupled RoPE part of each query/key head
    v_head_dim: int = 128
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: YarnScaling | None = YarnScaling()
    max_seq_len: int = 4096  # rows of the RoPE table; set to training.seq_len by the trainer
    depth_init: bool = True  # init std of output projections shrinks with layer depth
    mtp_depth: int = 0  # multi-token prediction modules (mtp.py); DeepSeek-V3 trains with 1
    mtp_loss_weight: float = 0.3  # lambda of the MTP loss (DeepSeek-V3: 0.3, later 0.1)

    @property
    def mtp_modules(self) -> list[str]:
        """The modules after the head (models/stage_layout.py): the MTP depths, if any."""
        return ["mtp"] if self.mtp_depth else []

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def yarn_active(self) -> bool:
        """YaRN applies only when training past the original context (as DeepSeek's
        reference code): pre-training at 4K uses plain RoPE, the long-context phases YaRN."""
        s = self.rope_scaling
        return s is not None and self.max_seq_len > s.original_max_position

    def update_from_config(self, job_config: JobConfig) -> None:
        self.max_seq_len = job_config.training.seq_len

    def validate(self, job_config: JobConfig, parallel_dims: ParallelDims) -> None:
        flavor = f"[model] flavor {job_config.model.flavor}"
        check_arg_ranges(self, flavor, positive=(
            "dim", "n_layers", "n_heads", "vocab_size", "inter_dim", "moe_inter_dim",
            "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "norm_eps",
            "rope_theta", "max_seq_len", "rope_scaling.factor",
            "rope_scaling.original_max_position", "rope_scaling.beta_fast",
            "rope_scaling.beta_slow"), non_negative=(
            "q_lora_rank", "n_dense_layers", "rope_scaling.mscale", "rope_scaling.mscale_all_dim",
            "mtp_depth", "mtp_loss_weight"))
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"{flavor}: qk_rope_head_dim {self.qk_rope_head_dim} must be even "
                              "(RoPE rotates pairs)")
        if self.mtp_depth:
            check_multi_token_prediction(parallel_dims.cp, job_config.compile.compiles_blocks,
                                         flavor)
        if not 0 <= self.n_dense_layers <= self.n_layers:
            raise ConfigError(f"{flavor}: n_dense_layers {self.n_dense_layers} must be in "
                              f"0..n_layers ({self.n_layers})")
        if parallel_dims.pp > 1:  # llama3's module layout, then the MTP modules
            fqns_per_stage(self.n_layers, job_config, self.mtp_modules)
        # MLA splits by heads (queries, keys and values alike), as llama's attention
        check_tensor_parallel_shapes(parallel_dims.tp, self.n_heads, self.n_heads,
                                     self.vocab_size, flavor)
        check_moe_tensor_parallel(parallel_dims.tp, float8=float8_enabled(job_config),
                                  where=flavor)

    def _attention_params(self) -> int:
        d, h = self.dim, self.n_heads
        if self.q_lora_rank:
            q = d * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * h * self.qk_head_dim
        else:
            q = d * h * self.qk_head_dim
        kv = (d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
              + self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim))
        return q + kv + h * self.v_head_dim * d

    def _moe_params(self, experts: int) -> int:
        """One MoE feed-forward with ``experts`` routed experts counted (all, or top_k)."""
        m, d = self.moe, self.dim
        shared = 3 * d * self.moe_inter_dim * m.num_shared_experts
        return d * m.num_experts + 3 * experts * d * self.moe_inter_dim + shared

    def _block(self, layer_id: int, routed_experts: int) -> int:
        attention = self._attention_params() + 2 * self.dim  # + two RMSNorm weights
        if layer_id < self.n_dense_layers:
            return attention + 3 * self.dim * self.inter_dim
        return attention + self._moe_params(routed_experts)

    def _mtp_params(self, routed_experts: int) -> int:
        """The MTP depths' own parameters (mtp.py): three norms, the 2 dim -> dim projection
        and a block each; embedding and head are shared."""
        return sum(3 * self.dim + 2 * self.dim * self.dim + self._block(self.n_layers + k,
                                                                        routed_experts)
                   for k in range(self.mtp_depth))

    def _count(self, routed_experts_per_layer: int) -> int:
        blocks = sum(self._block(i, routed_experts_per_layer) for i in range(self.n_layers))
        return (blocks + 2 * self.vocab_size * self.dim + self.dim  # + final norm
                + self._mtp_params(routed_experts_per_layer))

    def num_routed_experts(self) -> int:
        return self.moe.num_experts if self.n_layers > self.n_dense_layers else 0

    def num_params(self) -> int:
        return self._count(self.moe.num_experts)

    def num_active_params(self) -> int:
        """Parameters that multiply one token: its top_k routed experts, not all of them, and
        no embedding lookup (the head is a matmul and counts)."""
        return self._count(self.moe.top_k) - self.vocab_size * self.dim

    def flops_per_token(self, seq_len: int) -> int:
        """6 FLOPs per *active* weight (2 forward, 4 backward), so MFU is right for MoE, plus
        attention: per layer and head, QK^T over qk_head_dim and AV over v_head_dim cost
        2 * seq_len * (qk + v) forward, x3 with backward (the full score matrix, as llama3).
        Each MTP depth adds its block's attention and multiplies by the shared head again."""
        layers = self.n_layers + self.mtp_depth
        attention = 6 * layers * self.n_heads * seq_len * (self.qk_head_dim + self.v_head_dim)
        head_again = self.mtp_depth * self.vocab_size * self.dim
        return 6 * (self.num_active_params() + head_again) + attention


_DEBUG = DeepSeekV3Args(
    dim=128, n_layers=4, n_dense_layers=1, n_heads=4, vocab_size=2048, inter_dim=256,
    moe_inter_dim=64,
    moe=MoEArgs(num_experts=8, top_k=2, score_func="sigmoid", route_norm=True, route_scale=1.0,
                num_expert_groups=4, num_limited_groups=2, num_shared_experts=1,
                load_balance_coeff=1e-3),
    q_lora_rank=0, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
    rope_scaling=None,
)
_V2_YARN = YarnScaling(factor=40.0, mscale=0.707, mscale_all_dim=0.707)

deepseek_v3_flavors: dict[str, DeepSeekV3Args] = {
    # Tests and quick CPU runs: 1 dense + 3 MoE blocks, 8 experts top-2 in 4 groups (2 used).
    "debugmodel": _DEBUG,
    # The same with the sequence-wise auxiliary loss instead of the bias (alpha 100x V3's
    # 1e-4, so that it shows in a few CPU steps).
    "debugmodel_aux": dataclasses.replace(_DEBUG, moe=dataclasses.replace(
        _DEBUG.moe, load_balance_coeff=None, aux_loss_coeff=1e-2)),
    # DeepSeek-V2-Lite (15.7B total, 2.4B active).
    "16B": DeepSeekV3Args(
        dim=2048, n_layers=27, n_dense_layers=1, n_heads=16, vocab_size=102400,
        inter_dim=10944, moe_inter_dim=1408,
        moe=MoEArgs(num_experts=64, top_k=6, score_func="softmax", route_norm=False,
                    route_scale=1.0, num_shared_experts=2, load_balance_coeff=None),
        q_lora_rank=0, rope_scaling=_V2_YARN,
    ),
    # DeepSeek-V2 (236B total, 21B active).
    "236B": DeepSeekV3Args(
        dim=5120, n_layers=60, n_dense_layers=1, n_heads=128, vocab_size=102400,
        inter_dim=12288, moe_inter_dim=1536,
        moe=MoEArgs(num_experts=160, top_k=6, score_func="softmax", route_norm=False,
                    route_scale=16.0, num_expert_groups=8, num_limited_groups=3,
                    num_shared_experts=2, load_balance_coeff=None),
        rope_scaling=_V2_YARN,
    ),
    # DeepSeek-V3 (671B total, 37B active).
    "671B": DeepSeekV3Args(
        moe=MoEArgs(num_experts=256, top_k=8, score_func="sigmoid", route_norm=True,
                    route_scale=2.5, num_expert_groups=8, num_limited_groups=4,
                    num_shared_experts=1, load_balance_coeff=1e-3),
    ),
}
