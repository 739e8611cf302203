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

Muon (components/optim/muon.py) rides in the same launches: 10 steps under FSDP 2 (saving at 5
and 10, then resumed: bitwise), TP 2, PP 2, HSDP 2 x 2 and FSDP 2 x TP 2 against one process,
and the FSDP 2 step-5 checkpoint resumed by one process (the momentum resharded), each within
MUON_TOL; and the Newton-Schulz work each rank does (``MuonCountingTrainer``).
"""

import json
import shutil
from pathlib import Path

import pytest
from harness import FP32_PARITY_TOL, MUON_PARITY_TOL, ROOT, assert_close, launch, losses
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
COUNTING = f"--job.trainer={ROOT / 'tests/plugins/muon_counts.py'}:MuonCountingTrainer"
MUON = ["--optimizer.name=Muon", "--muon.ns_dtype=float32", COUNTING]
MUON_TWO = {"muon": [*CKPT, *MUON], "muon_tp": [*STEPS, *MUON, *TP2],
            "muon_pp": [*STEPS, *MUON, *PP2]}  # "muon" (FSDP 2) saves, and resumes below
MUON_ONE = {"muon_one": [*STEPS, *MUON], "muon_one_from_fsdp": [*CKPT, *MUON]}
MUON_FOUR = {"muon_hsdp": [*STEPS, *MUON, *HSDP, "--training.local_batch_size=1"],
             "muon_fsdp_tp": [*STEPS, *MUON, *TP2]}
MUON_TOL = MUON_PARITY_TOL  # 10 steps of Muon, fp32 iteration: derivation in tests/harness.py
MATRICES = 28
"""Matrices of the tiny Llama: 4 blocks x (wq, wk, wv, wo, w1, w2, w3)."""


def counts(folder) -> list[float]:
    """Matrices each rank orthogonalized over the run, in rank order (MuonCountingTrainer)."""
    files = sorted((folder / "orthogonalized").glob("rank*.json"), key=lambda f: int(f.stem[4:]))
    return [json.loads(f.read_text()) for f in files]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("resume")


@pytest.fixture(scope="module")
def runs(corpus, root):
    saving = {case: [*CKPT, *layout] for case, layout in SAVING.items()}
    references = {f"{case}_reference": [*STEPS, *layout] for case, layout in SAVING.items()}
    first = launch(2, {**references, **saving, **MUON_TWO}, root / "two", corpus)
    work = {case: counts(root / "two" / case) for case in MUON_TWO}
    damaged = root / "two" / "fallback" / "checkpoint"
    shutil.copytree(root / "two" / "fsdp" / "checkpoint", damaged)
    flip_a_weight_bit(damaged / "step-10", "__1_0.distcp")
    for case in [*SAVING, "muon"]:
        shutil.rmtree(root / "two" / case / "checkpoint" / "step-10")
    step5 = root / "two" / "fsdp" / "checkpoint" / "step-5"
    for folder, cases in (("two", RESHARDED), ("one", ONE_PROCESS), ("four", FOUR_PROCESSES)):
        for case in cases:
            shutil.copytree(step5, root / folder / case / "checkpoint" / "step-5")
    shutil.copytree(root / "two" / "muon" / "checkpoint" / "step-5",
                    root / "one" / "muon_one_from_fsdp" / "checkpoint" / "step-5")
    resumed = {**launch(2, {**saving, **RESHARDED, **FALLBACK, "muon": MUON_TWO["muon"]},
                        root / "two", corpus),
               **launch(1, {**ONE_PROCESS, **MUON_ONE}, root / "one", corpus),
               **launch(4, {**FOUR_PROCESSES, **MUON_FOUR}, root / "four", corpus)}
    work.update({case: counts(root / "four" / case) for case in MUON_FOUR})
    return first, resumed, work


def flip_a_weight_bit(step: Path, file: str) -> None:
    """One bit in the middle of the first stored weight of ``file`` (checksums.json says
    where): finite, plausible, and until checksums, trained on unnoticed."""
    items = json.loads((step / "checksums.json").read_text())["items"][file]
    offset, length = next((o, n) for o, n, _, name in items if name.startswith("model."))
    data = bytearray((step / file).read_bytes())
    data[offset + length // 2] ^= 0x01
    (step / file).write_bytes(data)


def test_a_damaged_checkpoint_falls_back_to_the_previous_one_when_allowed(runs, root):
    first, resumed, _ = runs
    folder = root / "two" / "fallback" / "checkpoint"
    assert sorted(p.name for p in folder.iterdir()) == ["step-10", "step-10.damaged", "step-5"]
    assert {"step": 5, "resumed": True} in resumed["fallback"]
    assert [r["step"] for r in resumed["fallback"] if "loss" in r] == list(range(6, 11))
    assert losses(resumed["fallback"]) == losses(first["fsdp_reference"])[5:]


@pytest.mark.parametrize("case", SAVING)
def test_resume_is_bitwise_exact(runs, case):
    first, resumed, _ = runs
    reference = losses(first[f"{case}_reference"])
    assert losses(first[case]) == reference  # saving does not disturb training
    assert {"step": 5, "resumed": True} in resumed[case]  # steps 1-5 kept, the resume marked
    assert [r["step"] for r in resumed[case] if "loss" in r] == list(range(1, 11))
    assert losses(resumed[case]) == reference


def test_activation_checkpointing_resumes_bitwise(runs):
    first, resumed, _ = runs
    assert losses(resumed["ac"]) == losses(first["fsdp_reference"])[5:]


@pytest.mark.parametrize(
    "case", [*ONE_PROCESS, "hsdp_from_fsdp", "tp_from_fsdp", "pp_from_fsdp", "fsdp_tp"]
)
def test_fsdp_checkpoint_resumes_under_other_layouts(runs, case):
    first, resumed, _ = runs
    assert [r["step"] for r in resumed[case] if "loss" in r] == list(range(6, 11))
    assert_close(losses(resumed[case]), losses(first["fsdp_reference"])[5:], TOL)


@pytest.mark.parametrize("case", ["muon", "muon_tp", "muon_pp", "muon_hsdp", "muon_fsdp_tp"])
def test_muon_matches_one_process(runs, case):
    first, resumed, _ = runs
    ours = losses(resumed[case] if case in MUON_FOUR else first[case])
    assert len(ours) == 10
    assert_close(ours, losses(resumed["muon_one"]), MUON_TOL)


def test_muon_resumes_bitwise_and_resharded_within_the_bound(runs):
    """FSDP 2 resumes its step-5 checkpoint bitwise (momentum, AdamW moments, schedule); one
    process resumes it (DCP reshards the momentum's DTensor shards into whole matrices) within
    the parity bound of the uninterrupted FSDP 2 run."""
    first, resumed, _ = runs
    assert {"step": 5, "resumed": True} in resumed["muon"]
    assert losses(resumed["muon"]) == losses(first["muon"])
    assert [r["step"] for r in resumed["muon_one_from_fsdp"] if "loss" in r] == list(range(6, 11))
    assert_close(losses(resumed["muon_one_from_fsdp"]), losses(first["muon"])[5:], MUON_TOL)


@pytest.mark.parametrize(("case", "owners", "copies"), [
    ("muon", 2, 1), ("muon_tp", 2, 1), ("muon_pp", 1, 2), ("muon_hsdp", 2, 2),
    ("muon_fsdp_tp", 4, 1)])
def test_each_owner_orthogonalizes_its_share(runs, case, owners, copies):
    """Each matrix is iterated once per step by one of the ``owners`` ranks that hold its
    shards (dp_shard x tp), once per HSDP replica; a pipeline stage iterates its own blocks'
    (``copies``: the ranks doing the same share). Every shape's matrices are a multiple of the
    owners here, so each rank iterates exactly MATRICES / (owners x stages) per step."""
    _, _, work = runs
    stages = 2 if case == "muon_pp" else 1
    assert work[case] == [10 * MATRICES / (owners * stages)] * (owners * copies)
