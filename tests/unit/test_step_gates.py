"""The optimizer step's gates and the step that is counted only once committed.

``OptimizersContainer.step`` asks its gates in order (components/optimizer.py): a gate that
says no withholds the update, one that raises abandons the step. The trainer's first gate is
the replica groups' commit (distributed/fault_tolerance.py): a step a group failed raises
``StepDropped``, ends in ``ft.quorum`` with its record, and is not counted; the next batch
trains that step again. Here a stand-in for the groups drops the second attempt once (no
torchft: tests/e2e/test_torchft.py runs the real one): the run then equals, bitwise, a run
whose data lacks those batches (the same kernels on the same inputs in the same order, class
a of harness.py), every step is logged once and the counters never count the dropped one.
Another stand-in heals once, as a group behind does in its quorum: the step it attempts next
is the one after the peer's, never one counted before the heal.
"""

import pytest
import torch
from harness import OmittedStep, build_trainer, job_args, losses, read_metrics
from torchdata.stateful_dataloader import StatefulDataLoader

from torchtitan_like.components.data.dataloader import StepBatches
from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.optimization import Optimizer
from torchtitan_like.distributed.fault_tolerance import SingleGroup, StepDropped
from torchtitan_like.train import Trainer
from torchtitan_like.validate import parse_args

DROPPED = 2  # the attempt the stand-in drops, once


def test_a_gate_withholds_the_update_and_the_first_no_ends_the_asking():
    part = torch.nn.Linear(2, 2)
    optimizers = OptimizersContainer([part], JobConfig(optimizer=Optimizer(lr=1.0)))
    asked = []
    optimizers.gates += [lambda: asked.append(1) or False, lambda: asked.append(2) or True]
    part(torch.ones(1, 2)).sum().backward()
    before = part.weight.detach().clone()
    assert optimizers.step() is False and asked == [1]
    assert torch.equal(part.weight, before)
    optimizers.gates[:] = [lambda: True]
    assert optimizers.step() is True and not torch.equal(part.weight, before)


def test_step_batches_restart_where_a_loaded_state_says():
    loader = StatefulDataLoader(list(range(10)), batch_size=1)
    batches = StepBatches(lambda: loader, 2)
    batches.next_step()
    state = batches.state_dict()
    second = batches.next_step()
    batches.load_state_dict(state)  # a resume, or healing from a peer
    assert [int(b) for b in batches.next_step()] == [int(b) for b in second] == [2, 3]


class DropsOnce(SingleGroup):
    """A single group whose commit fails at attempt ``DROPPED`` (counted by its quorums)."""

    def __init__(self):
        self.attempts, self.committed = 0, True

    def start_step(self) -> bool:
        self.attempts += 1
        return False

    def commit(self) -> bool:
        self.committed = self.attempts != DROPPED
        if not self.committed:
            raise StepDropped("a replica group failed (stand-in)")
        return True

    def record(self) -> dict:
        return {"committed": self.committed}


class HealsOnce(SingleGroup):
    """A single group that heals at its third quorum: a peer two steps ahead replaces its train
    state (step and tokens seen; the weights, which this test does not read, stay)."""

    def __init__(self, trainer: Trainer):
        self.trainer, self.quorums = trainer, 0

    def start_step(self) -> bool:
        self.quorums += 1
        if self.quorums == 3:
            state = self.trainer.state_dict()
            state["step"] += 2
            state["tokens_seen"] += 2 * self.trainer.tokens_per_rank_step
            self.trainer.load_state_dict(state)
        return self.quorums == 3


class DroppingTrainer(Trainer):
    def _load_checkpoint(self, config, spec):
        super()._load_checkpoint(config, spec)
        self.ft = DropsOnce()  # before the gates are set (build step 10)


class HealingTrainer(Trainer):
    def _load_checkpoint(self, config, spec):
        super()._load_checkpoint(config, spec)
        self.ft = HealsOnce(self)


@pytest.fixture(scope="module")
def runs(one_process_group, corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("gates")
    plain = build_trainer([], root / "plain", corpus, one_process_group)
    plain.dataloader = OmittedStep(plain.dataloader, DROPPED, plain.grad_accumulation_steps)
    plain.train()
    config = parse_args(job_args([], root / "dropped", corpus), 1)
    dropped = DroppingTrainer(config, one_process_group)
    dropped.train()
    return read_metrics(root / "dropped"), read_metrics(root / "plain"), dropped


def test_a_dropped_step_is_retried_and_counted_once(runs):
    records, plain, trainer = runs
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5]
    assert [r for r in records if "loss" not in r] == [{"step": DROPPED, "committed": False}]
    assert trainer.step == 5 and trainer.ft.attempts == 6
    assert trainer.tokens_seen == 5 * trainer.tokens_per_rank_step  # one rank, one group
    assert losses(records) == losses(plain)  # bitwise: the dropped batches never trained


def test_after_a_heal_the_step_attempted_follows_the_peers(one_process_group, corpus, tmp_path):
    trainer = HealingTrainer(parse_args(job_args([], tmp_path, corpus), 1), one_process_group)
    trainer.train()
    assert [r["step"] for r in read_metrics(tmp_path) if "loss" in r] == [1, 2, 5]
    assert trainer.step == 5 and trainer.ft.quorums == 3
    assert trainer.tokens_seen == 5 * trainer.tokens_per_rank_step
