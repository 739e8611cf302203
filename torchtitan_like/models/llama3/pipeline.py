"""The Llama 3 pipeline split: which modules each stage holds (models/stage_layout.py), cut
by distributed/pipeline.py.

A stage is a deep copy of the meta model with the other stages' modules removed, so it is still
a ``Transformer`` (its forward skips what is None) with the unsplit model's parameter names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchtitan_like.distributed.pipeline import prune_to_stage
from torchtitan_like.models.stage_layout import fqns_per_stage

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.models.llama3.model import Transformer


def pipeline_llama(model: Transformer, stage_ids: list[int], config: JobConfig
                   ) -> list[Transformer]:
    fqns = fqns_per_stage(model.args.n_layers, config)
    return [prune_to_stage(model, fqns[stage]) for stage in stage_ids]
