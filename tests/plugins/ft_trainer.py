"""A Trainer subclass for the torchft test (tests/e2e/test_torchft.py).

It trains exactly like the built-in Trainer, with two additions for the test:

- a survivor commits ``ALONE_STEPS`` steps alone (and more until its latest step is not a
  checkpoint's: the restarted group must need its peer), then waits at the start of each step
  (its quorum asked again every 0.2 s, up to ``REJOIN_TIMEOUT_S``) until the restarted group
  is back, so that the rejoin happens before the end however long the restart takes on a
  busy CPU (seconds to minutes);
- at the end every rank saves its shard of the parameters and optimizer states
  (``final_state_rank<r>.pt`` in its group's dump folder) and its pid, for the bitwise
  comparison across groups.
"""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from torchtitan_like.train import Trainer

ALONE_STEPS = 3
REJOIN_TIMEOUT_S = 180


def _local(tensor):
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach().clone()


class FTTestTrainer(Trainer):
    def __init__(self, config, device):
        super().__init__(config, device)
        self.steps_alone = 0
        self._start_step = self.ft.start_step
        self.ft.start_step = self._start_step_waiting

    def _start_step_waiting(self) -> bool:
        groups = self.config.fault_tolerance.group_size
        healed = self._start_step()
        self.steps_alone += self.ft.participants < groups
        deadline = time.monotonic() + REJOIN_TIMEOUT_S
        while (self.steps_alone > ALONE_STEPS and self.ft.participants < groups
               and self.step % self.config.checkpoint.interval  # the checkpoint is behind
               and time.monotonic() < deadline):
            time.sleep(0.2)
            healed = self._start_step() or healed
        return healed

    def train(self) -> None:
        super().train()
        state = {f"model.{k}": _local(v) for k, v in
                 self.checkpointer.states["model"].state_dict().items()}
        state.update({f"optimizer.{k}": _local(v) if isinstance(v, torch.Tensor) else v
                      for k, v in self.checkpointer.states["optimizer"].state_dict().items()})
        state["pid"] = os.getpid()
        torch.save(state, Path(self.config.job.dump_folder,
                               f"final_state_rank{dist.get_rank()}.pt"))
