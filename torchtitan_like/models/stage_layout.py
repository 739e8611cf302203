"""Which modules each pipeline stage holds, for the module layout every built-in family shares.

The model is ``tok_embeddings``, ``layers.0 .. layers.{n-1}``, ``norm``, ``output`` (and a
family's extra last modules, DeepSeek-V3's ``mtp``) in forward order: the embedding always
opens the first stage, norm and head (and the extras) close the last. A family's args check a
split with it at start-up, its pipelining function cuts the model with it
(distributed/pipeline.py); neither needs the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from torchtitan_like.distributed.pipeline import module_fqns_per_stage

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig


def fqns_per_stage(n_layers: int, config: JobConfig, last: Sequence[str] = ()
                   ) -> list[list[str]]:
    """Module names of every stage (explicit from the config, or balanced by layers), with
    ``last`` modules after norm and head."""
    return module_fqns_per_stage(config.parallelism, n_layers, first=["tok_embeddings"],
                                 last=["norm", "output", *last])
