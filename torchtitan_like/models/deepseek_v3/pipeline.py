"""The DeepSeek-V3 pipeline split: llama3's (distributed/pipeline.py cuts), plus the MTP modules.

The model is ``tok_embeddings``, ``layers.0 .. layers.{n-1}``, ``norm``, ``output`` and, with
``mtp_depth`` > 0, ``mtp`` (models/deepseek_v3/mtp.py) in forward order: the embedding opens the
first stage; norm, head and MTP close the last, where the MTP modules keep their reference to
the embedding, that stage's copy of a weight tied across stages (distributed/tied_weights.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchtitan_like.distributed.pipeline import module_fqns_per_stage, prune_to_stage

if TYPE_CHECKING:  # names for annotations only: args.py calls this module to validate a split
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.models.deepseek_v3.args import DeepSeekV3Args
    from torchtitan_like.models.deepseek_v3.model import DeepSeekV3Model


def deepseek_fqns_per_stage(args: DeepSeekV3Args, config: JobConfig) -> list[list[str]]:
    """Module names of every stage (explicit from the config, or balanced by layers)."""
    last = ["norm", "output", *(["mtp"] if args.mtp_depth else [])]
    return module_fqns_per_stage(config.parallelism, args.n_layers, first=["tok_embeddings"],
                                 last=last)


def pipeline_deepseek_v3(model: DeepSeekV3Model, stage_ids: list[int], config: JobConfig
                         ) -> list[DeepSeekV3Model]:
    fqns = deepseek_fqns_per_stage(model.args, config)
    return [prune_to_stage(model, fqns[stage]) for stage in stage_ids]
