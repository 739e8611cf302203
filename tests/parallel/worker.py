"""torchrun entry of the parity tests: train each case of a JSON file in one process group."""

import json
import os
import sys

from torchtitan_like.distributed.lifecycle import exit_process
from torchtitan_like.distributed.utils import init_distributed
from torchtitan_like.logging import init_logger
from torchtitan_like.train import Trainer
from torchtitan_like.validate import parse_args


def main() -> None:
    init_logger()
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    world_size = int(os.environ["WORLD_SIZE"])
    device = init_distributed()
    for overrides in cases.values():
        Trainer(parse_args(overrides, world_size), device).train()
    exit_process(0)


if __name__ == "__main__":
    main()
