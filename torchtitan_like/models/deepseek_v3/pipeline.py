"""The DeepSeek-V3 pipeline split: llama3's module layout (models/stage_layout.py, cut by
distributed/pipeline.py), plus the MTP modules.

With ``mtp_depth`` > 0 the model ends with ``mtp`` (models/deepseek_v3/mtp.py), on the last
stage, where the MTP modules keep their reference to the embedding: that stage's copy of a
weight tied across stages (distributed/tied_weights.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchtitan_like.distributed.pipeline import prune_to_stage
from torchtitan_like.models.stage_layout import fqns_per_stage

if TYPE_CHECKING:
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.models.deepseek_v3.model import DeepSeekV3Model


def pipeline_deepseek_v3(model: DeepSeekV3Model, stage_ids: list[int], config: JobConfig
                         ) -> list[DeepSeekV3Model]:
    fqns = fqns_per_stage(model.args.n_layers, config, model.args.mtp_modules)
    return [prune_to_stage(model, fqns[stage]) for stage in stage_ids]
