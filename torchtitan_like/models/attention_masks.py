"""Attention masks: plain causal, or block-causal over the documents packed into a sample.

A packed sample is ``... EOS BOS doc EOS BOS doc ...`` (components/data/datasets.py, and the
same stream in prepared shards). Under ``[model] attn_mask_type = "block_causal"`` a token
attends only to earlier tokens of its own document. A document's id is the number of EOS
tokens strictly before it in the sample, i.e. the id increments *after* each EOS (TorchTitan's
convention): an EOS belongs to the document it closes, the BOS that follows opens the next.

The trainer computes the document ids from the input tokens and hands them to the model as the
keyword input ``document_ids``, which every pipeline stage receives beside its activations
(models/stage_inputs.py; later stages never see the tokens). The model builds the mask once
per forward (``build_mask``) and each attention layer runs ``attention``:

- no mask (causal): SDPA with ``is_causal``;
- on CUDA: FlexAttention with a ``BlockMask`` from ``create_block_mask``; the (query, key)
  blocks no query of a document reaches are skipped, not computed and discarded;
- elsewhere (CPU, where torch 2.13's FlexAttention has no backward, and the ``meta`` tensors
  of a pipeline's shape inference): SDPA with an explicit boolean mask, (batch, 1, seq, seq),
  allowed = causal AND same document. Exact, at O(seq^2) memory per sample.

The mask is per (query, key) pair of whole sequences: under tensor parallelism attention sees
the whole sequence (after the sequence-parallel all-gather) and a slice of the heads, and the
mask broadcasts over heads. Context parallelism splits the sequence and swaps in ring attention,
which takes no mask: refused at start-up (distributed/layout_rules.py).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from torch.nn.attention.flex_attention import BlockMask

from torchtitan_like.config.errors import ConfigError
from torchtitan_like.models.attention import sdpa

if TYPE_CHECKING:
    from torchtitan_like.protocols.model_spec import ModelSpec

MASK_TYPES = frozenset({"causal", "block_causal"})
"""Every ``[model] attn_mask_type``; a model whose forward takes ``document_ids`` declares them
all in ``ModelSpec.attn_mask_types``."""

AttentionMask = torch.Tensor | BlockMask | None
"""What a model's layers receive: None (causal), a boolean mask, or a FlexAttention BlockMask."""


def document_ids(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(batch, seq) token ids -> (batch, seq) ids of their documents: the count of EOS tokens
    strictly before each position (an EOS belongs to the document it closes)."""
    is_eos = (tokens == eos_id).to(torch.int32)
    return torch.cumsum(is_eos, dim=1) - is_eos


def dense_block_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """(batch, seq) document ids -> (batch, 1, seq, seq) boolean, True where query i may attend
    to key j: j <= i and both in the same document."""
    seq = doc_ids.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=doc_ids.device).tril()
    same_document = doc_ids.unsqueeze(2) == doc_ids.unsqueeze(1)
    return (causal & same_document).unsqueeze(1)


def flex_block_causal_mask(doc_ids: torch.Tensor) -> BlockMask:
    """The same mask as a FlexAttention ``BlockMask`` (CUDA)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

    batch, seq = doc_ids.shape
    return create_block_mask(mask_mod, batch, None, seq, seq, device=doc_ids.device)


def build_mask(doc_ids: torch.Tensor | None) -> AttentionMask:
    """The mask every attention layer of one forward uses: None without document ids (causal),
    a BlockMask on CUDA, else the dense boolean mask."""
    if doc_ids is None:
        return None
    if doc_ids.device.type == "cuda":
        return flex_block_causal_mask(doc_ids)
    return dense_block_causal_mask(doc_ids)


@functools.cache
def _compiled_flex_attention():
    """FlexAttention compiled once per process: uncompiled, it runs an unfused reference
    implementation that materialises the whole score matrix."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
              scale: float | None = None) -> torch.Tensor:
    """Scaled dot-product attention of (batch, heads, seq, dim) queries, keys and values (as
    many key as query heads) under ``mask`` (``build_mask``); ``scale`` None = dim^-0.5."""
    if mask is None:
        return sdpa(q, k, v, is_causal=True, scale=scale)
    if isinstance(mask, BlockMask):
        return _compiled_flex_attention()(q, k, v, block_mask=mask, scale=scale)
    return sdpa(q, k, v, attn_mask=mask, scale=scale)


def check_attn_mask_type(spec: ModelSpec, attn_mask_type: str) -> None:
    """ConfigError if the model's spec does not declare ``[model] attn_mask_type``."""
    if attn_mask_type not in spec.attn_mask_types:
        raise ConfigError(
            f"[model] attn_mask_type = {attn_mask_type!r}, but model {spec.name!r} supports "
            f"only {sorted(spec.attn_mask_types)} (ModelSpec.attn_mask_types: its forward must "
            "take document_ids and mask attention with them, models/attention_masks.py); "
            "set attn_mask_type = \"causal\"")
