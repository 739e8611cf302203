"""Save at step 5 of 10, restart, resume: the losses of steps 6-10 equal the uninterrupted run's.

Launch 1 (2 processes) trains 10 steps under FSDP=2 with sync, async and async_with_pinned_mem
saves, and under HSDP (replicate 2), next to uninterrupted references. Each case's step-10
checkpoint is then deleted and launch 2 restarts the same jobs: they find step-5 by themselves
and resume. Same layout -> bitwise equal losses (fp32, deterministic): the model, optimizer,
scheduler, data position and RNG come back exactly. The FSDP=2 step-5 checkpoint is also
resumed with activation checkpointing switched on (names must not change: bitwise too), under
HSDP and by one process (resharding: same losses up to the order of floating-point sums, see
tests/parallel/test_fsdp.py for the 1e-5 tolerance).
"""

import shutil

import pytest
from harness import assert_close, launch, losses

TOL = 1e-5
STEPS = ["--training.steps", "10"]
CKPT = [*STEPS, "--checkpoint.enable", "true", "--checkpoint.interval", "5"]
HSDP = ["--parallelism.data_parallel_replicate_degree", "2"]
SAVING = {
    "sync": CKPT,
    "async": [*CKPT, "--checkpoint.async_mode", "async"],
    "pinned": [*CKPT, "--checkpoint.async_mode", "async_with_pinned_mem"],
    "hsdp": [*CKPT, *HSDP],
}
RESHARDED = {  # the FSDP=2 checkpoint of step 5, resumed by other 2-process jobs
    "ac": [*CKPT, "--activation_checkpoint.mode", "full"],  # bitwise
    "hsdp_from_fsdp": [*CKPT, *HSDP],  # within TOL
}
ONE_PROCESS = {
    "one": CKPT,  # local 2 of global 4: two microbatches
    "one_no_accumulation": [*CKPT, "--training.local_batch_size", "4"],
}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    two, one = root / "two", root / "one"
    first = launch(2, {"reference": STEPS, "hsdp_reference": [*STEPS, *HSDP], **SAVING}, two,
                   corpus)
    for case in SAVING:
        shutil.rmtree(two / case / "checkpoint" / "step-10")
    step5 = two / "sync" / "checkpoint" / "step-5"
    for folder in [*(two / case for case in RESHARDED), *(one / case for case in ONE_PROCESS)]:
        shutil.copytree(step5, folder / "checkpoint" / "step-5")
    second = launch(2, {**SAVING, **RESHARDED}, two, corpus)
    third = launch(1, ONE_PROCESS, one, corpus)
    return first, {**second, **third}


@pytest.mark.parametrize("case", [*SAVING, "ac"])
def test_resume_is_bitwise_exact(runs, case):
    first, resumed = runs
    reference = first["hsdp_reference" if case == "hsdp" else "reference"]
    if case in SAVING:  # saving does not disturb training; the relaunch kept steps 1-5 of
        assert losses(first[case]) == losses(reference)  # the first run and marked the resume
        assert {"step": 5, "resumed": True} in resumed[case]
        assert [r["step"] for r in resumed[case] if "loss" in r] == list(range(1, 11))
        assert losses(resumed[case]) == losses(reference)
    else:
        assert losses(resumed[case]) == losses(reference)[5:]


@pytest.mark.parametrize("case", [*ONE_PROCESS, "hsdp_from_fsdp"])
def test_fsdp_checkpoint_resumes_under_other_layouts(runs, case):
    first, resumed = runs
    assert [r["step"] for r in resumed[case] if "loss" in r] == list(range(6, 11))
    assert_close(losses(resumed[case]), losses(first["reference"])[5:], TOL)
