"""One renaming table for the HF adapters (models/*/hf_adapter.py): our FQNs <-> HF's.

Every family maps its top-level tensors one to one (``tok_embeddings.weight`` <->
``model.embed_tokens.weight``) and its blocks' tensors by name inside a numbered block
(``layers.{i}.<ours>`` <-> ``model.layers.{i}.<theirs>``). ``HFNames`` holds the two tables
and answers both directions; what a family adds (stacked experts, MTP layers, ignored buffers)
stays in its adapter, around these lookups.
"""

from __future__ import annotations

import re

import torch

LAYER = re.compile(r"layers\.(\d+)\.(.+)")
"""Our block tensor: ``layers.{i}.{name inside the block}``."""
HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
"""HF's block tensor: ``model.layers.{i}.{name inside the block}``."""
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
"""config.json's ``torch_dtype`` names."""


class HFNames:
    """The top-level and per-block renamings of one family, in both directions."""

    def __init__(self, top: dict[str, str], block: dict[str, str]):
        self.top, self.block = top, block
        self.from_top = {theirs: ours for ours, theirs in top.items()}
        self.from_block = {theirs: ours for ours, theirs in block.items()}

    def to_hf(self, key: str) -> str | None:
        """HF's name for our tensor ``key``, or None when neither table has it."""
        if key in self.top:
            return self.top[key]
        m = LAYER.fullmatch(key)
        if m and m.group(2) in self.block:
            return f"model.layers.{m.group(1)}.{self.block[m.group(2)]}"
        return None

    def from_hf(self, key: str) -> str | None:
        """Our name for HF's tensor ``key``, or None when neither table has it."""
        if key in self.from_top:
            return self.from_top[key]
        m = HF_LAYER.fullmatch(key)
        if m and m.group(2) in self.from_block:
            return f"layers.{m.group(1)}.{self.from_block[m.group(2)]}"
        return None
