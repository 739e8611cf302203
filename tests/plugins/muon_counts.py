"""A Trainer for ``[job] trainer = "tests/plugins/muon_counts.py:MuonCountingTrainer"``: it
trains like the built-in one, then each rank writes how many matrices its optimizers ran the
Newton-Schulz iteration on (``Muon.orthogonalized``, all steps) to
``orthogonalized/rank<r>.json`` in the dump folder, so a test can see how the owners split
the work."""

import json
from pathlib import Path

import torch.distributed as dist

from torchtitan_like.train import Trainer


class MuonCountingTrainer(Trainer):
    def train(self) -> None:
        super().train()
        folder = Path(self.config.job.dump_folder, "orthogonalized")
        folder.mkdir(exist_ok=True)
        count = sum(opt.orthogonalized for opt in self.optimizers.optimizers)
        (folder / f"rank{dist.get_rank()}.json").write_text(json.dumps(count))
