import itertools
import math

import pytest
import torch

from torchtitan_like.components.lr_scheduler import LRSchedulersContainer, lr_factor
from torchtitan_like.components.optimizer import OptimizersContainer
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.optimization import LRScheduler, Optimizer


def factors(steps=10, **kw):
    config = LRScheduler(**kw)
    return [lr_factor(s, config, steps) for s in range(steps)]


def test_linear_warmup_never_starts_at_zero():
    f = factors(warmup_steps=4, decay_ratio=0)
    assert f[:4] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert f[4:] == [1.0] * 6


@pytest.mark.parametrize(
    ("decay_type", "shape"),
    [("linear", lambda p: 1 - p), ("sqrt", lambda p: 1 - math.sqrt(p)),
     ("cosine", lambda p: 0.5 * (1 + math.cos(math.pi * p)))],
)
def test_wsd_decay_shapes_with_floor(decay_type, shape):
    # 10 steps, 2 warmup, decay over half of the remaining 8 -> stable 2..5, decay 6..9.
    f = factors(warmup_steps=2, decay_ratio=0.5, decay_type=decay_type, min_lr_factor=0.1)
    assert f[2:6] == [1.0] * 4
    for step in range(6, 10):
        assert f[step] == pytest.approx(0.1 + 0.9 * shape((step - 6) / 4))


def test_default_decays_over_everything_after_warmup():
    f = factors(warmup_steps=2, decay_ratio=-1, min_lr_factor=0.0)
    assert f[2] == 1.0 and f[-1] == pytest.approx(1 / 8)
    assert all(a > b for a, b in itertools.pairwise(f[2:]))


def test_container_drives_every_optimizer():
    parts = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    optimizers = OptimizersContainer(parts, JobConfig(optimizer=Optimizer(lr=1.0)))
    schedulers = LRSchedulersContainer(optimizers, LRScheduler(warmup_steps=3), steps=10)
    assert schedulers.last_lr == pytest.approx(0.25)
    optimizers.step()
    schedulers.step()
    assert [o.param_groups[0]["lr"] for o in optimizers.optimizers] == pytest.approx([0.5, 0.5])
