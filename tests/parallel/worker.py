"""torchrun entry of the parity tests: train each case of a JSON file in one process group."""

import json
import os
import sys

from torchtitan_like.distributed.lifecycle import exit_process
from torchtitan_like.distributed.utils import init_distributed
from torchtitan_like.entry import trainer_class
from torchtitan_like.logging import init_logger
from torchtitan_like.validate import parse_args


def main() -> None:
    init_logger()
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    world_size = int(os.environ["WORLD_SIZE"])
    device = init_distributed()
    for overrides in cases.values():
        config = parse_args(overrides, world_size)
        trainer_class(config)(config, device).train()  # [job] trainer, else Trainer
    exit_process(0)


if __name__ == "__main__":
    main()
