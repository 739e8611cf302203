"""Save at step 5 of 10, restart, resume: the losses of steps 6-10 equal the uninterrupted run's.

Launch 1 (2 processes) trains 10 steps under FSDP=2, HSDP (replicate 2), TP=2 and PP=2, saving at
steps 5 and 10, next to uninterrupted references. Each case's step-10 checkpoint is then deleted and
launch 2 restarts the same jobs: they find step-5 by themselves and resume. Same layout ->
bitwise equal losses (fp32, deterministic): the model, optimizer, scheduler, data position and
RNG come back exactly. (The async modes' saves are resumed bitwise in test_fault_tolerance.py.)

Resharding: the FSDP=2 step-5 checkpoint is also resumed with activation checkpointing switched
on (names must not change: bitwise), under HSDP, TP=2, PP=2, one process and FSDP=2 x TP=2 (4
processes): the same losses up to the order of floating-point sums (1e-5, as the parity tests in
tests/parallel/ explain).

Damage: a copy of the FSDP=2 job's folder whose step-10 has one flipped bit inside a weight of
rank 1's file resumes in launch 2 with ``[checkpoint] fallback_on_damage``: each rank checks
the checksums of what it reads, the job falls back to step-5 (step-10 kept aside as
step-10.damaged) and steps 6-10 equal the uninterrupted run's bitwise. (Without the flag it is
one line and exit code 4: tests/e2e/test_final_failures.py.)
"""

import json
import shutil
from pathlib import Path

import pytest
from harness import FP32_PARITY_TOL, assert_close, launch, losses
from layouts import HSDP, PP2, TP2

TOL = FP32_PARITY_TOL  # class (b), reordered fp32 sums: derivation in tests/harness.py
STEPS = ["--training.steps", "10"]
CKPT = [*STEPS, "--checkpoint.enable", "true", "--checkpoint.interval", "5"]
SAVING = {"fsdp": [], "hsdp": HSDP, "tp": TP2, "pp": PP2}  # each against its own reference
# (PP2: 1F1B, 2 microbatches of 1 per schedule)
RESHARDED = {  # the FSDP=2 checkpoint of step 5, resumed by other 2-process jobs
    "ac": [*CKPT, "--activation_checkpoint.mode", "full"],  # bitwise
    "hsdp_from_fsdp": [*CKPT, *HSDP],
    "tp_from_fsdp": [*CKPT, *TP2],
    "pp_from_fsdp": [*CKPT, *PP2],
}
FALLBACK = {"fallback": [*CKPT, "--checkpoint.fallback_on_damage", "true"]}  # FSDP=2
ONE_PROCESS = {
    "one": CKPT,  # local 2 of global 4: two microbatches
    "one_no_accumulation": [*CKPT, "--training.local_batch_size", "4"],
}
FOUR_PROCESSES = {"fsdp_tp": [*CKPT, *TP2]}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("resume")


@pytest.fixture(scope="module")
def runs(corpus, root):
    saving = {case: [*CKPT, *layout] for case, layout in SAVING.items()}
    references = {f"{case}_reference": [*STEPS, *layout] for case, layout in SAVING.items()}
    first = launch(2, {**references, **saving}, root / "two", corpus)
    damaged = root / "two" / "fallback" / "checkpoint"
    shutil.copytree(root / "two" / "fsdp" / "checkpoint", damaged)
    flip_a_weight_bit(damaged / "step-10", "__1_0.distcp")
    for case in SAVING:
        shutil.rmtree(root / "two" / case / "checkpoint" / "step-10")
    step5 = root / "two" / "fsdp" / "checkpoint" / "step-5"
    for folder, cases in (("two", RESHARDED), ("one", ONE_PROCESS), ("four", FOUR_PROCESSES)):
        for case in cases:
            shutil.copytree(step5, root / folder / case / "checkpoint" / "step-5")
    return first, {**launch(2, {**saving, **RESHARDED, **FALLBACK}, root / "two", corpus),
                   **launch(1, ONE_PROCESS, root / "one", corpus),
                   **launch(4, FOUR_PROCESSES, root / "four", corpus)}


def flip_a_weight_bit(step: Path, file: str) -> None:
    """One bit in the middle of the first stored weight of ``file`` (checksums.json says
    where): finite, plausible, and until checksums, trained on unnoticed."""
    items = json.loads((step / "checksums.json").read_text())["items"][file]
    offset, length = next((o, n) for o, n, _, name in items if name.startswith("model."))
    data = bytearray((step / file).read_bytes())
    data[offset + length // 2] ^= 0x01
    (step / file).write_bytes(data)


def test_a_damaged_checkpoint_falls_back_to_the_previous_one_when_allowed(runs, root):
    first, resumed = runs
    folder = root / "two" / "fallback" / "checkpoint"
    assert sorted(p.name for p in folder.iterdir()) == ["step-10", "step-10.damaged", "step-5"]
    assert {"step": 5, "resumed": True} in resumed["fallback"]
    assert [r["step"] for r in resumed["fallback"] if "loss" in r] == list(range(6, 11))
    assert losses(resumed["fallback"]) == losses(first["fsdp_reference"])[5:]


@pytest.mark.parametrize("case", SAVING)
def test_resume_is_bitwise_exact(runs, case):
    first, resumed = runs
    reference = losses(first[f"{case}_reference"])
    assert losses(first[case]) == reference  # saving does not disturb training
    assert {"step": 5, "resumed": True} in resumed[case]  # steps 1-5 kept, the resume marked
    assert [r["step"] for r in resumed[case] if "loss" in r] == list(range(1, 11))
    assert losses(resumed[case]) == reference


def test_activation_checkpointing_resumes_bitwise(runs):
    first, resumed = runs
    assert losses(resumed["ac"]) == losses(first["fsdp_reference"])[5:]


@pytest.mark.parametrize(
    "case", [*ONE_PROCESS, "hsdp_from_fsdp", "tp_from_fsdp", "pp_from_fsdp", "fsdp_tp"]
)
def test_fsdp_checkpoint_resumes_under_other_layouts(runs, case):
    first, resumed = runs
    assert [r["step"] for r in resumed[case] if "loss" in r] == list(range(6, 11))
    assert_close(losses(resumed[case]), losses(first["fsdp_reference"])[5:], TOL)
