"""The straggler report: the spread of ranks' median step times, the slowest rank named, and
a warning past the threshold (the multi-process case, a slow rank 1 of 2 named in
metrics.jsonl, is in tests/e2e/test_fault_tolerance.py)."""

import pytest

from torchtitan_like.components.stragglers import RECORD_KEYS, StepClock


def test_the_slowest_rank_is_named_and_warned_about(caplog):
    caplog.set_level("WARNING", logger="torchtitan_like")
    clock = StepClock(world_size=3, threshold=0.2)
    stats = clock.summarise([[0.01, 0.10], [0.31, 0.10], [0.02, 0.11]])
    assert stats["slowest_rank"] == 1 and set(stats) == RECORD_KEYS  # ttl-ablate's exclusions
    assert stats["data_seconds_max"] == 0.31 and stats["compute_seconds_min"] == 0.10
    assert stats["slowest_rank_excess"] == pytest.approx(0.41 / 0.12 - 1)  # others: .11, .13
    assert "straggler: rank 1 takes 0.410 s a step" in caplog.text


def test_no_warning_within_the_threshold(caplog):
    clock = StepClock(world_size=2, threshold=0.5)
    stats = clock.summarise([[0.0, 1.0], [0.0, 1.4]])
    assert stats["slowest_rank"] == 1 and stats["slowest_rank_excess"] == pytest.approx(0.4)
    assert "straggler" not in caplog.text


def test_one_process_reports_its_own_medians():
    clock = StepClock(world_size=1, threshold=0.2)
    for seconds in (0.5, 0.1, 0.2):
        clock.times["data"].append(seconds)
        clock.times["compute"].append(2 * seconds)
    stats = clock.window_stats()
    assert stats["data_seconds_median"] == 0.2 and stats["compute_seconds_max"] == 0.4
    assert stats["slowest_rank"] == 0 and stats["slowest_rank_excess"] == 0
    assert clock.times == {"data": [], "compute": []}  # a new window
