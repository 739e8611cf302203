"""A Trainer subclass for the torchft test (tests/e2e/test_torchft.py).

It trains exactly like the built-in Trainer, with these additions for the test:

- a survivor commits ``ALONE_STEPS`` steps alone (``ALONE_ENV`` if set; and more until its
  latest step is not a checkpoint's: the restarted group must need its peer), then waits at
  the start of each step (its quorum asked again every 0.2 s, up to ``REJOIN_TIMEOUT_S``)
  until the restarted group is back, so that the rejoin happens before the end however long
  the restart takes on a busy CPU (seconds to minutes);
- a kill at a chosen point, from ``KILL_ENV`` (one per launch, so the test's one run can kill
  one group several times at different points): ``allreduce:<k>`` SIGKILLs the group inside
  step k's gradient all-reduce (after every rank issued its flat all-reduce over the groups,
  before it completes), ``heal`` inside healing (the peer's state received into this
  group's tensors, not yet loaded into its states), ``save:<k>`` where group 0 starts
  writing checkpoint k, ``writer:<k>`` inside this group's own save of checkpoint k (every
  rank's DCP files written, before the coordinator's .metadata and the publication: the save
  is cut short, as the plain job's ``--debug.fault_point save``). Every rank of the group
  dies there: rank 0 kills the group's torchrun agent (``lifecycle.AGENT_PID_ENV``), then
  itself; the others themselves once the agent is gone, so the agent and all workers die, as
  in a node failure.
  ``worker:<k>`` kills rank 1 alone at that point of step k: its agent restarts the group's
  workers (a kill only in the launch's first attempt). Before dying a
  rank appends its point, step, pid and rank to ``kills.jsonl`` in its group's dump folder
  (at ``writer``, also the files then in the save's partial folder);
- with ``LOAD_AFTER_ENV``, the checkpoint is looked for only once a given path exists;
- every rank appends its pid to ``pids_rank<r>.txt`` when it starts (a survivor that never
  restarted has exactly one line, equal to the pid of its final state) and its step and
  torchft's ``batches_committed`` as loaded to ``starts_rank<r>.jsonl``; at the end every rank
  saves its shard of the parameters and optimizer states (``final_state_rank<r>.pt`` in its
  group's dump folder) and its pid, for the bitwise comparison across groups.
"""

import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.tensor import DTensor

from torchtitan_like.distributed.lifecycle import AGENT_PID_ENV
from torchtitan_like.train import Trainer

ALONE_STEPS = 3
REJOIN_TIMEOUT_S = 180
AGENT_DEATH_TIMEOUT_S = 120
"""How long a rank at an agent kill waits for rank 0 to kill the agent before dying anyway."""
KILL_ENV = "FT_TEST_KILL"
"""Where this launch of the group dies: ``allreduce:<step>``, ``heal``, ``save:<step>``,
``writer:<step>``, ``worker:<step>``, or unset (never)."""
ALONE_ENV = "FT_TEST_ALONE"
"""Steps this launch commits alone before it waits for the others (default ``ALONE_STEPS``)."""
LOAD_AFTER_ENV = "FT_TEST_LOAD_AFTER"
"""A path: this launch starts up (processes, model) at once, but looks for its checkpoint
only once the path exists, so that which checkpoint it loads is known."""


def _local(tensor):
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach().clone()


class FTTestTrainer(Trainer):
    def _load_checkpoint(self, config, spec):
        wait_for = os.environ.get(LOAD_AFTER_ENV)
        deadline = time.monotonic() + REJOIN_TIMEOUT_S
        while wait_for and not Path(wait_for).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        super()._load_checkpoint(config, spec)

    def __init__(self, config, device):
        super().__init__(config, device)
        self.steps_alone = 0
        self.alone_steps = int(os.environ.get(ALONE_ENV) or ALONE_STEPS)
        self._start_step = self.ft.start_step
        self.ft.start_step = self._start_step_waiting
        self._folder = Path(config.job.dump_folder)
        with (self._folder / f"pids_rank{dist.get_rank()}.txt").open("a") as f:
            f.write(f"{os.getpid()}\n")
        with (self._folder / f"starts_rank{dist.get_rank()}.jsonl").open("a") as f:
            f.write(json.dumps({"step": self.step,
                                "batches_committed": self.ft.manager.batches_committed()}) + "\n")
        point = os.environ.get(KILL_ENV, "")
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            point = ""  # torchrun restarted this launch's workers: its kill happened
        if point.startswith("allreduce:"):
            self._arm_allreduce_kill(int(point.split(":")[1]))
        elif point == "heal":
            self._arm_heal_kill()
        elif point.startswith("save:"):
            self._arm_save_kill(int(point.split(":")[1]))
        elif point.startswith("writer:"):
            self._arm_writer_kill(int(point.split(":")[1]))
        elif point.startswith("worker:") and dist.get_rank() == 1:
            self._arm_save_kill(int(point.split(":")[1]), agent=False)

    def _die(self, point: str, agent: bool = True, **extra) -> None:
        """SIGKILL the group here: rank 0 its agent first, then every rank itself (or, not
        ``agent``, only this worker: its agent restarts the group's workers). The other ranks
        die only once the agent is gone: a rank that reached the point first and died while
        the agent lived would be a worker's failure to the agent, which then stops rank 0
        (SIGTERM) before it gets there and exits 1 itself, not a node's loss."""
        with (self._folder / "kills.jsonl").open("a") as f:
            f.write(json.dumps({"point": point, "step": self.step, "pid": os.getpid(),
                                "rank": dist.get_rank(), **extra}) + "\n")
        launcher = int(os.environ[AGENT_PID_ENV])
        if agent and dist.get_rank() == 0:
            os.kill(launcher, signal.SIGKILL)
        deadline = time.monotonic() + AGENT_DEATH_TIMEOUT_S
        while agent and os.getppid() == launcher and time.monotonic() < deadline:
            time.sleep(0.05)  # the agent's watchdog (lifecycle.die_with_agent) may end us first
        os.kill(os.getpid(), signal.SIGKILL)

    def _arm_allreduce_kill(self, step: int) -> None:
        """Die right after issuing the gradients' all-reduce over the groups in ``step``."""
        reduce_gradients, allreduce = self.ft.reduce_gradients, self.ft.manager.allreduce
        in_gradients = [False]

        def reduce_gradients_then_die(parts, loss):
            in_gradients[0] = True
            try:
                return reduce_gradients(parts, loss)
            finally:
                in_gradients[0] = False

        def allreduce_then_die(tensor, **kwargs):
            work = allreduce(tensor, **kwargs)
            if in_gradients[0] and self.step + 1 == step:  # self.step: the steps committed
                self._die("allreduce", step=step)
            return work

        self.ft.reduce_gradients = reduce_gradients_then_die
        self.ft.manager.allreduce = allreduce_then_die

    def _arm_heal_kill(self) -> None:
        """Die inside healing: the peer's state received (PGTransport writes it straight into
        this group's tensors), its loading into the trainer's states not yet done."""
        fns = self.ft.manager._load_state_dict_fns  # torchft 0.2.0: the Manager's callbacks

        def load_then_die(received):
            self._die("heal")

        fns["default"] = load_then_die

    def _arm_save_kill(self, step: int, agent: bool = True) -> None:
        """Die where group 0 starts writing checkpoint ``step`` (the end of that committed
        step, after its metrics: the point of the trainer's ``save``; this group writes none,
        and the groups are in lockstep there, both past the step's commit)."""
        after_step = self.faults.after_step

        def after_step_then_die(done: int) -> None:
            after_step(done)
            if done == step:
                self._die("save" if agent else "worker", agent)

        self.faults.after_step = after_step_then_die

    def _arm_writer_kill(self, step: int) -> None:
        """Die inside this group's save of checkpoint ``step`` (its writer then: rank 0 of the
        step's quorum), right after this rank's DCP files are written: the save is cut short
        before rank 0, DCP's coordinator, writes .metadata and publishes the folder."""
        storage_writer, trainer = self.faults.storage_writer, self

        class DyingWriter(FileSystemWriter):
            def write_data(self, plan, planner):
                written = super().write_data(plan, planner)
                written.wait()
                trainer._die("writer", partial=sorted(os.listdir(self.path)))
                return written

        def writer_or_dying(path: str, at: int):
            return DyingWriter(path) if at == step else storage_writer(path, at)

        self.faults.storage_writer = writer_or_dying

    def _start_step_waiting(self) -> bool:
        groups = self.config.fault_tolerance.group_size
        healed = self._start_step()
        self.steps_alone += self.ft.participants < groups
        deadline = time.monotonic() + REJOIN_TIMEOUT_S
        while (self.steps_alone > self.alone_steps and self.ft.participants < groups
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
        state["batches_committed"] = self.ft.manager.batches_committed()
        torch.save(state, Path(self.config.job.dump_folder,
                               f"final_state_rank{dist.get_rank()}.pt"))
