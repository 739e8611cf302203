"""A Trainer subclass for ``[job] trainer = "tests/plugins/custom_trainer.py:CountingTrainer"``.

It trains exactly like the built-in Trainer and leaves ``trainer.json`` in the dump folder (its
class and the microbatches its ``post_dataloading_process`` saw), so a test can tell that
run_train.sh, ttl-ablate or the test worker ran it. ``NotATrainer`` is a class that is not one.
"""

import json
from pathlib import Path

import torch.distributed as dist

from torchtitan_like.train import Trainer


class CountingTrainer(Trainer):
    def __init__(self, config, device):
        super().__init__(config, device)
        self.microbatches = 0

    def post_dataloading_process(self, inputs, labels):
        self.microbatches += 1
        return inputs, labels

    def train(self) -> None:
        super().train()
        if dist.get_rank() == 0:
            Path(self.config.job.dump_folder, "trainer.json").write_text(json.dumps(
                {"class": type(self).__name__, "microbatches": self.microbatches}))


class NotATrainer:
    pass
