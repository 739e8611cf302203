"""torchrun entry of the MoE parity tests: train each case (as worker.py) and record, after
every optimizer step, every MoE layer's selection bias into ``expert_bias.json`` of the case's
dump folder (rank 0), so a test can compare bias trajectories across layouts."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from torchtitan_like.distributed.lifecycle import exit_process
from torchtitan_like.distributed.utils import init_distributed
from torchtitan_like.logging import init_logger
from torchtitan_like.models.moe import MoE
from torchtitan_like.train import Trainer
from torchtitan_like.validate import parse_args


def record_biases(trainer: Trainer) -> list[dict[str, list[float]]]:
    """A list that gains {layer name: bias} after each optimizer step (after the balancing
    hook, which was registered first)."""
    trajectory: list[dict[str, list[float]]] = []
    layers = {name: module for part in trainer.model_parts
              for name, module in part.named_modules() if isinstance(module, MoE)}

    def record(*_args) -> None:
        trajectory.append({name: layer.expert_bias.tolist() for name, layer in layers.items()
                           if layer.expert_bias is not None})

    trainer.optimizers.optimizers[-1].register_step_post_hook(record)
    return trajectory


def main() -> None:
    init_logger()
    cases = json.loads(Path(sys.argv[1]).read_text())
    world_size = int(os.environ["WORLD_SIZE"])
    device = init_distributed()
    for overrides in cases.values():
        # Each case is a job of its own: without this, dynamo would carry the shapes seen by
        # an earlier case's compiled code over (automatic dynamic shapes) and compile a later
        # case's blocks for a symbolic batch size, which no single job does.
        torch._dynamo.reset()
        trainer = Trainer(parse_args(overrides, world_size), device)
        trajectory = record_biases(trainer)
        trainer.train()
        if dist.get_rank() == 0:
            out = Path(trainer.config.job.dump_folder) / "expert_bias.json"
            out.write_text(json.dumps(trajectory))
    exit_process(0)


if __name__ == "__main__":
    main()
