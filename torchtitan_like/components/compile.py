"""torch.compile, applied per transformer block (and optionally to the loss).

Compiling each block rather than the whole model keeps compile time flat in depth (all blocks
share one graph and its cache entry) and leaves the FSDP/PP boundaries between blocks in eager
code, where their hooks run. ``Module.compile`` compiles a block in place, so parameter names
do not change. ``fullgraph=True`` turns any graph break into an error instead of a silent
slowdown.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

from torchtitan_like.config.job_config import Compile


def apply_compile(blocks: nn.ModuleDict, config: Compile) -> None:
    """Compile each block in place (after activation checkpointing wrapped it, before FSDP)."""
    if not (config.enable and "model" in config.components):
        return
    for block in blocks.values():
        block.compile(fullgraph=True)


def maybe_compile_loss(loss_fn: Callable, config: Compile) -> Callable:
    if config.enable and "loss" in config.components:
        return torch.compile(loss_fn)
    return loss_fn


def set_inductor_cache(config: Compile) -> None:
    """Point inductor at a persistent cache folder, so repeat runs skip most compilation.

    The config wins over an inherited TORCHINDUCTOR_CACHE_DIR: inductor writes its default
    into that variable on first use, so only an explicit assignment takes effect.
    """
    if config.enable and config.cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(config.cache_dir)
