"""The planner's failure pricing (tools/planner/failures.py): checkpoint restarts against
replica groups that heal, worked by hand; ttl-plan prints it beside the plan."""

import math

import pytest

from torchtitan_like.tools import plan_cli
from torchtitan_like.tools.planner.failures import FailureInputs, failure_cost

# 1,000 GPUs of 10,000 h MTTF: one failure every 10 h = 36,000 s.
RUN = FailureInputs(num_gpus=1000, gpu_mttf_hours=1e4, step_seconds=2.0, checkpoint_interval=500,
                    checkpoint_seconds=10.0, restart_seconds=600.0, state_bytes_per_gpu=50e9,
                    link_gbps=25.0, groups=4, heartbeat_seconds=5.0)


def test_costs_by_hand():
    cost = failure_cost(RUN)
    rate = 1 / 36000
    assert cost.failures_per_day == pytest.approx(2.4)
    # 10 s per 1,000 s of steps, plus per failure 600 s restart + 500 steps x 2 s / 2 lost.
    assert cost.restart_lost_share == pytest.approx(0.01 + rate * 1100)
    assert cost.best_interval == round(math.sqrt(2 * 10 / rate) / 2)  # Young: 424 steps
    assert cost.heal_seconds == pytest.approx(2.0)  # 50 GB at 25 GB/s
    # One group of 4 out for restart + healing; all wait heartbeat, the step, the healing.
    assert cost.groups_lost_share == pytest.approx(0.01 + rate * (602 / 4 + 5 + 2 + 2))
    # Down at once: Poisson of mean 602 / 36,000 = 0.0167; P(N > 0) = 1.7% > 1%, P(N > 1)
    # = 1.4e-4: one group may be down, so min_replica_size 3 of 4.
    assert cost.min_replica_size == 3


def test_youngs_interval_is_the_cheapest_restart_interval():
    cost = failure_cost(RUN)
    for other in (cost.best_interval // 2, cost.best_interval * 2):
        assert failure_cost(
            FailureInputs(**{**RUN.__dict__, "checkpoint_interval": other})
        ).restart_lost_share > cost.best_lost_share


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="positive"):
        failure_cost(FailureInputs(**{**RUN.__dict__, "gpu_mttf_hours": 0}))


def test_ttl_plan_prints_the_failure_costs(capsys):
    code = plan_cli.main(["--flavor", "8B", "--num_gpus", "64", "--seq_len", "8192",
                          "--dp_replicate", "8", "--gpu_mttf_hours", "5e4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "Failures: " in out and "Young's interval" in out
    assert "8 replica groups that heal ([fault_tolerance])" in out
