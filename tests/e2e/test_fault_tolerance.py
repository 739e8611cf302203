"""A rank killed mid-run: torchrun restarts the job, which resumes from the latest *complete*
checkpoint and finishes with the losses of an uninterrupted run (bitwise, fp32).

One launch of 2 processes with ``--max-restarts=3`` trains, in turn:

- ``reference``: 10 uninterrupted steps (checkpointed, so that restarts skip it);
- ``killed_after_step``: rank 1 SIGKILLed after step 6; the restart resumes from step-5;
- ``killed_in_async_save``: rank 1 SIGKILLed while the async (thread) save of step 8 is in
  flight, after writing its files; step-8 never completed, so the restart resumes from step-4;
- ``killed_in_pinned_save``: the same with async_with_pinned_mem, killed in the writer process;
- ``slow_rank_1``: rank 1 sleeps 0.2 s in every step's data loading (a straggler): each logged
  step names it as the slowest rank, and the losses are the reference's (bitwise: timing
  changes no number).

Each fault fires once (a marker file in the dump folder), costing one restart each.
"""

import pytest
from harness import launch, losses

CKPT = ["--training.steps", "10", "--checkpoint.enable", "true"]
KILL_RANK_1 = ["--debug.fault_rank", "1"]
CASES = {
    "reference": CKPT,
    "killed_after_step": [*CKPT, "--checkpoint.interval", "5", *KILL_RANK_1,
                          "--debug.fault_step", "6"],
    "killed_in_async_save": [*CKPT, "--checkpoint.interval", "4", "--checkpoint.async_mode",
                             "async", *KILL_RANK_1, "--debug.fault_step", "8",
                             "--debug.fault_point", "save"],
    "killed_in_pinned_save": [*CKPT, "--checkpoint.interval", "4", "--checkpoint.async_mode",
                              "async_with_pinned_mem", *KILL_RANK_1, "--debug.fault_step", "8",
                              "--debug.fault_point", "save"],
    "slow_rank_1": [*CKPT, "--debug.slow_rank", "1", "--metrics.log_freq", "5"],
}
RESUMED_FROM = {"killed_after_step": 5, "killed_in_async_save": 4, "killed_in_pinned_save": 4}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    return root, launch(2, CASES, root, corpus, max_restarts=3)


@pytest.mark.parametrize("case", RESUMED_FROM)
def test_job_recovers_with_the_uninterrupted_losses(runs, case):
    root, records = runs
    assert len(list((root / case).glob(".fault_injected_rank1_*"))) == 1  # it did fire
    resumes = [r["step"] for r in records[case] if r.get("resumed")]
    assert resumes[0] == RESUMED_FROM[case]  # the newest *complete* checkpoint
    assert [r["step"] for r in records[case] if "loss" in r] == list(range(1, 11))
    assert losses(records[case]) == losses(records["reference"])
    assert not list((root / case / "checkpoint").glob("*.partial"))


def test_a_slow_rank_is_named_the_slowest(runs):
    _, records = runs
    logged = [r for r in records["slow_rank_1"] if "loss" in r]
    assert [r["step"] for r in logged] == [1, 5, 10]
    assert [r["slowest_rank"] for r in logged[1:]] == [1, 1]  # medians over steps 2-5, 6-10
    reference = {r["step"]: r["loss"] for r in records["reference"] if "loss" in r}
    assert [r["loss"] for r in logged] == [reference[r["step"]] for r in logged]
