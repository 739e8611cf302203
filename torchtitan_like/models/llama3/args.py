"""Llama 3 hyper-parameters, the published flavors, and their parameter and FLOP counts."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.distributed.layout_rules import check_tensor_parallel_shapes
from torchtitan_like.models.stage_layout import fqns_per_stage
from torchtitan_like.protocols.model_args import BaseModelArgs, check_arg_ranges

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.distributed.parallel_dims import ParallelDims


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's frequency scaling: long wavelengths are slowed by ``factor``, short ones
    kept, and the band between interpolated smoothly (Meta's reference ``apply_scaling``)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclasses.dataclass
class Llama3Args(BaseModelArgs):
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None  # None = n_heads (no grouped-query attention)
    vocab_size: int = 128256
    multiple_of: int = 256  # the FFN hidden size is rounded up to a multiple of this
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling | None = RopeScaling()
    max_seq_len: int = 8192  # rows of the RoPE table; set to training.seq_len by the trainer
    depth_init: bool = True  # init std of output projections shrinks with layer depth
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ffn_hidden_dim(self) -> int:
        """SwiGLU keeps the 4*dim MLP's parameters with 2/3 of the width, then rounds up."""
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)

    def update_from_config(self, job_config: JobConfig) -> None:
        self.max_seq_len = job_config.training.seq_len

    def validate(self, job_config: JobConfig, parallel_dims: ParallelDims) -> None:
        flavor = f"[model] flavor {job_config.model.flavor}"
        check_arg_ranges(self, flavor, positive=(
            "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of",
            "ffn_dim_multiplier", "norm_eps", "rope_theta", "max_seq_len",
            *(f"rope_scaling.{f.name}" for f in dataclasses.fields(RopeScaling))))
        s = self.rope_scaling
        if s is not None and s.high_freq_factor <= s.low_freq_factor:
            raise ConfigError(f"{flavor}: rope_scaling.high_freq_factor {s.high_freq_factor} "
                              f"must exceed low_freq_factor {s.low_freq_factor} (the band "
                              "between them is interpolated)")
        if self.ffn_hidden_dim < 1:
            raise ConfigError(f"{flavor}: ffn_dim_multiplier {self.ffn_dim_multiplier} leaves "
                              "the feed-forward no width")
        if self.dim % self.n_heads or self.head_dim % 2:
            raise ConfigError(f"{flavor}: dim {self.dim} must split into n_heads {self.n_heads} "
                              "heads of an even size (RoPE rotates pairs)")
        check_heads_and_layout(self, job_config, parallel_dims)

    def num_params(self) -> int:
        d, kv = self.dim, self.kv_heads * self.head_dim
        attention = 2 * d * d + 2 * d * kv
        feed_forward = 3 * d * self.ffn_hidden_dim
        block = attention + feed_forward + 2 * d  # + two RMSNorm weights
        embeddings = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.n_layers * block + embeddings + d  # + final norm

    def flops_per_token(self, seq_len: int) -> int:
        """6 FLOPs per weight that multiplies a token (2 forward, 4 backward), i.e. every
        parameter but the embedding lookup (a tied table still costs its head matmul), plus
        attention's QK^T and AV: 6 * 2 * n_layers * dim * seq_len, counting the full (not
        causal-halved) score matrix as TorchTitan and PaLM do, so MFU figures compare."""
        matmul_params = self.num_params() - self.vocab_size * self.dim
        if self.tie_word_embeddings:
            matmul_params += self.vocab_size * self.dim
        attention = 12 * self.n_layers * self.n_heads * self.head_dim * seq_len
        return 6 * matmul_params + attention


def check_heads_and_layout(args: Llama3Args, job_config: JobConfig,
                           parallel_dims: ParallelDims) -> None:
    """The checks every model on the llama skeleton shares (Qwen3 too): grouped heads, whole
    heads and vocabulary rows per TP rank, no tied head across pipeline stages, a valid split."""
    flavor = f"[model] flavor {job_config.model.flavor}"
    if args.n_heads % args.kv_heads:
        raise ConfigError(f"{flavor}: n_heads {args.n_heads} must be a multiple of "
                          f"n_kv_heads {args.kv_heads}")
    check_tensor_parallel_shapes(parallel_dims.tp, args.n_heads, args.kv_heads,
                                 args.vocab_size, flavor)
    if parallel_dims.pp > 1:
        if args.tie_word_embeddings:
            raise ConfigError(
                f"{flavor} ties the output head to the embedding, which pipeline "
                "parallelism would put on different stages (first and last); use an "
                "untied flavor or [parallelism] pipeline_parallel_degree = 1"
            )
        fqns_per_stage(args.n_layers, job_config)


_LLAMA31 = RopeScaling(factor=8.0)
_LLAMA32 = RopeScaling(factor=32.0)

llama3_flavors: dict[str, Llama3Args] = {
    # Tests and quick CPU runs: grouped-query attention, 4 layers, vocab above the byte tokenizer's.
    "tiny": Llama3Args(
        dim=128, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=512, multiple_of=64
    ),
    # TorchTitan's debug model shape (vocab rounded to 2048).
    "debugmodel": Llama3Args(dim=256, n_layers=6, n_heads=16, vocab_size=2048),
    # Throughput benchmarks: GPT-2 small's shape (88M parameters at the debug model's vocab).
    "100M": Llama3Args(dim=768, n_layers=12, n_heads=12, vocab_size=2048),
    # Llama 3.2 1B and 3B (tied embeddings), Llama 3.1 8B, 70B and 405B.
    "1B": Llama3Args(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.5,
        rope_scaling=_LLAMA32, tie_word_embeddings=True,
    ),
    "3B": Llama3Args(
        dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_dim_multiplier=1.0,
        rope_scaling=_LLAMA32, tie_word_embeddings=True,
    ),
    "8B": Llama3Args(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.3,
        multiple_of=1024, rope_scaling=_LLAMA31,
    ),
    "70B": Llama3Args(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim_multiplier=1.3,
        multiple_of=4096, rope_scaling=_LLAMA31,
    ),
    "405B": Llama3Args(
        dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim_multiplier=1.2,
        multiple_of=4096, rope_scaling=_LLAMA31,
    ),
}
