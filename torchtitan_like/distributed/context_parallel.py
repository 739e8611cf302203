"""Context parallelism (CP): ring attention over the sequence dimension, load-balanced.

**Sharding the sequence.** With c CP ranks, each rank holds S/c tokens of every sequence of the
batch: its slice of the inputs, of the labels and of every buffer indexed by position (the RoPE
table, so that each token is rotated by its *global* position). Everything in a transformer
but attention acts token by token (embedding, norms, the Q/K/V/O projections, the MLP, the
loss), so it runs on the local tokens unchanged and needs no communication. Activation memory
per rank is therefore divided by c; the parameters are the same on the c ranks, so FSDP shards
them over ``dp_shard x cp`` (distributed/parallel_dims.py).

**Ring attention** (Liu, Zaharia, Abbeel, "Ring Attention with Blockwise Transformers for
Near-Infinite Context", 2023; the ring goes back to Li et al., "Sequence Parallelism", 2021).
Rank r keeps its queries Q_r and must see every key/value block (K_j, V_j). In c steps it
attends Q_r to the block it holds while the blocks travel around the ring (``alltoall``: one
shift to the next rank per step, two blocks in memory; ``allgather``: all blocks gathered once,
one collective but all S keys/values of the layer in memory for the attention). The partial
results are merged exactly by the online softmax: a block gives its output O_j (softmax
within the block) and the log-sum-exp l_j of its scores, and two partial results combine as

    l = log(e^l_a + e^l_b),    O = (e^l_a O_a + e^l_b O_b) / e^l
      = O_a - sigmoid(l_b - l_a) (O_a - O_b),    l = l_a - logsigmoid(l_a - l_b)

(the second form is the numerically stable one torch uses), so the result equals full
attention up to floating-point rounding. Backward runs the ring again: K/V blocks travel as in
forward, and their gradients dK_j, dV_j travel along with them, accumulating each rank's
contribution, back to the rank that owns the block. Per layer each rank sends about 2 x S x
kv_dim values in forward (3x that in backward) whatever c is, while its attention compute is
~S^2/c: communication hides behind compute only when S/c is large, which is why CP is for long
sequences.

**Causal load balancing** (the head-tail layout). With contiguous chunks, rank r's queries
attend to r+1 of the c key blocks: the last rank does c times the work of the first. Instead,
cut the sequence into 2c chunks and give rank r chunks r and 2c-1-r. Chunk i attends to i
full chunks plus half of its own (the diagonal), so rank r does (r + 1/2) + (2c-1-r + 1/2) =
2c chunk-blocks of work, the same on every rank (2c^2 in all: the (2c)^2 / 2 triangle).
Inputs, labels and RoPE rows are permuted by the same layout, so each token keeps its label and
its position; the loss is a sum over tokens and does not care about their order.

**Loss.** Each rank sums the cross-entropy of its tokens and divides by the labelled tokens of
the whole global batch (counted before the batch is sharded); FSDP sums gradients over
``dp_shard x cp`` and the logged loss is summed over ``dp x cp``, so CP gives exactly the
one-process loss and gradient (protocols/loss.py).

**Values narrower than keys** (multi-head latent attention: ``v_head_dim`` < ``qk_nope_head_dim
+ qk_rope_head_dim``). The ring's per-block kernels (CPU and CUDA flash) need one head dim for
q, k and v, so under CP the values are zero-padded to the query/key head dim and the output
sliced back (``values_padded_to_key_dim``). Exact, not approximate: with P = softmax(s QK^T),
P [V, 0] = [P V, 0], so the kept columns are computed from the same terms as unpadded
attention; the online-softmax merge acts per row on the log-sum-exp, which padding does not
touch; the padded output columns are exactly 0 and get no gradient (the slice), so in backward
their dV columns are dropped (the pad) and their share of dP = dO V^T and of the row sums
rowsum(dO * O) is 0 * 0 = 0. The softmax scale is q's (an explicit ``scale``, or
q.size(-1)^-0.5), which padding v leaves alone. The cost: the value blocks travel around the
ring and enter the kernel (qk_head_dim / v_head_dim)-fold wider (1.5x for DeepSeek-V3).

Implementation: torch's ``context_parallel`` shards the buffers in place for the duration of a
microbatch (the trainer enters it through ``distributed/utils.py: train_context``) and replaces
SDPA by ring attention; on CPU, ``cp_cpu_sdpa.py`` teaches it the CPU attention kernel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.distributed import cp_cpu_sdpa
from torchtitan_like.distributed.layout_rules import check_attention_mask, check_context_parallel
from torchtitan_like.distributed.parallel_dims import ParallelDims
from torchtitan_like.distributed.utils import device_type

if TYPE_CHECKING:
    from torchtitan_like.protocols.model_spec import ModelSpec

CPContext = Callable[[torch.Tensor, torch.Tensor], contextlib.AbstractContextManager]
"""Given a microbatch's (inputs, labels): the context its forward and backward run in."""


def validate(config: JobConfig, parallel_dims: ParallelDims, model_supports_cp: bool) -> None:
    """Every CP layout error, before any process group exists."""
    cp, tp, p = parallel_dims.cp, parallel_dims.tp, config.parallelism
    if cp == 1:
        return
    check_attention_mask(cp, config.model.attn_mask_type)
    degree = f"[parallelism] context_parallel_degree = {cp}"
    if not model_supports_cp:
        raise ConfigError(
            f"[model] name = {config.model.name} cannot run under {degree}: its ModelSpec "
            "declares no context_parallel_buffers (CP shards the tokens and every buffer "
            "indexed by position, and needs causal SDPA attention, which it replaces by ring "
            "attention); set context_parallel_degree = 1"
        )
    check_context_parallel(cp, tp, config.training.seq_len, p.context_parallel_load_balancer)
    if device_type() == "cpu" and (reason := cp_cpu_sdpa.check_supported()):
        raise ConfigError(f"{degree}: {reason}")


def build_context(parallel_dims: ParallelDims, cp_mesh: DeviceMesh, config: JobConfig,
                  spec: ModelSpec, model_parts: list[nn.Module]) -> CPContext | None:
    """The per-microbatch CP context (None without CP): shards (inputs, labels) along dim 1
    and the model's sequence buffers (``spec.context_parallel_buffers``) along theirs, and runs
    attention as ring attention inside it.

    Inputs and labels are sharded in place and left sharded (they are not needed whole
    afterwards); the model's buffers are restored on exit. Rotation and load balancing are
    torch's process-wide settings, so they are set on every entry (several trainers may run in
    one process, as in the tests).
    """
    if not parallel_dims.cp_enabled:
        return None
    seq_len, parallelism = config.training.seq_len, config.parallelism
    model_buffers = [b for part in model_parts for b in spec.context_parallel_buffers(part)]
    for buffer, dim in model_buffers:
        if buffer.shape[dim] != seq_len:
            raise ValueError(
                f"context parallelism shards a model buffer of {buffer.shape[dim]} positions "
                f"along dim {dim} beside {seq_len}-token sequences: it must be exactly seq_len "
                "long (e.g. a RoPE table built for training.seq_len)"
            )
    load_balance = parallelism.context_parallel_load_balancer == "headtail"
    ring_on_cpu = cp_mesh.device_type == "cpu"

    @contextlib.contextmanager
    def context(inputs: torch.Tensor, labels: torch.Tensor) -> Iterator[None]:
        set_rotate_method(parallelism.context_parallel_rotate_method)
        previous, _cp_options.enable_load_balance = _cp_options.enable_load_balance, load_balance
        try:
            with (
                context_parallel(
                    cp_mesh,
                    buffers=[inputs, labels, *(b for b, _ in model_buffers)],
                    buffer_seq_dims=[1, 1, *(dim for _, dim in model_buffers)],
                    no_restore_buffers={inputs, labels},
                ),
                cp_cpu_sdpa.cpu_ring_attention() if ring_on_cpu else contextlib.nullcontext(),
                values_padded_to_key_dim(),
            ):
                yield
        finally:
            _cp_options.enable_load_balance = previous

    return context


@contextlib.contextmanager
def values_padded_to_key_dim() -> Iterator[None]:
    """Entered inside ``context_parallel``: values narrower than the queries are zero-padded
    to their head dim and the output sliced back (module docstring: exact); equal head dims
    pass through unchanged. torch's ``context_parallel`` installs its ring attention as
    ``torch.nn.functional.scaled_dot_product_attention`` for its duration; this wraps that
    the same way and restores it on exit, before torch restores its own."""
    ring_sdpa = F.scaled_dot_product_attention

    def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args, **kwargs
             ) -> torch.Tensor:
        width = value.shape[-1]
        if width >= query.shape[-1]:
            return ring_sdpa(query, key, value, *args, **kwargs)
        padded = F.pad(value, (0, query.shape[-1] - width))
        return ring_sdpa(query, key, padded, *args, **kwargs)[..., :width]

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = ring_sdpa
