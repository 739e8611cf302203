"""The Llama 3 pipeline split: which modules each stage holds (distributed/pipeline.py cuts).

The model is ``tok_embeddings``, ``layers.0 .. layers.{n-1}``, ``norm``, ``output`` in forward
order; the embedding always opens the first stage and norm + head close the last. A stage is a
deep copy of the meta model with the other stages' modules removed, so it is still a
``Transformer`` (its forward skips what is None) with the unsplit model's parameter names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchtitan_like.distributed.pipeline import module_fqns_per_stage, prune_to_stage

if TYPE_CHECKING:  # names for annotations only: args.py calls this module to validate a split
    from torchtitan_like.config.job_config import JobConfig
    from torchtitan_like.models.llama3.args import Llama3Args
    from torchtitan_like.models.llama3.model import Transformer


def llama_fqns_per_stage(args: Llama3Args, config: JobConfig) -> list[list[str]]:
    """Module names of every stage (explicit from the config, or balanced by layers)."""
    return module_fqns_per_stage(config.parallelism, args.n_layers,
                                 first=["tok_embeddings"], last=["norm", "output"])


def pipeline_llama(model: Transformer, stage_ids: list[int], config: JobConfig
                   ) -> list[Transformer]:
    fqns = llama_fqns_per_stage(model.args, config)
    return [prune_to_stage(model, fqns[stage]) for stage in stage_ids]
