"""Replica groups through torchft (distributed/fault_tolerance.py, docs/fault-tolerance.md):
one lighthouse, 2 replica groups of FSDP over 2 processes each (gloo, CPU), one run.

The run: both groups train ``STEPS`` steps. Group 1 is launched 4 times, each launch with a
kill point for the test trainer (tests/plugins/ft_trainer.py, ``KILLS``): the first SIGKILLs
group 1 (its agent, then every worker) inside step ``KILL_STEP``'s gradient all-reduce over
the groups; the second, restarted from group 0's latest persistent checkpoint (written every
``CKPT_INTERVAL`` steps, by group 0 only, into the shared folder), dies inside healing from
group 0; the third heals (model, optimizer, LR schedule, step, RNG and data position over the
managed process group), trains with group 0, and dies where group 0 starts writing
checkpoint ``SAVE_STEP``; the fourth (``--max-restarts=1``) loads that checkpoint, heals,
trains, and loses its rank 1 alone after step ``WORKER_STEP``: torchrun restarts its
workers, which load the checkpoint again, heal in a fresh per-attempt store
(fault_tolerance.attempt_store) and train to the end.
Group 0 runs once throughout. Checked:

- (a) no failure yet: the steps both groups committed before the first kill have the
  per-step losses of one process training on the joint global batch, within
  ``FP32_PARITY_TOL`` (harness.py: the same fp32 terms, summed in another order: the tokens
  and gradients of the groups are *summed* across groups, as HSDP sums across its replicate
  dimension, so only the order of the sums differs from one process);
- (b) kill and rejoin: each kill happened at its point and step (the dying rank's record);
  the killed launches' workers are gone; group 0's workers are the same processes from start
  to end (one pid per rank) and its launcher never restarts (exit 0, every step 1..STEPS
  committed once, alone exactly from each kill to the next healing); group 1 commits each of
  its steps once, with 2 participants and group 0's losses; every parameter and optimizer
  state shard is then bitwise equal across the groups (each group applied the same summed
  gradients to the same state, or received it bit for bit); both final launchers exit 0;
- participants and committed are in every step's metrics record;
- (c) one process replaying group 0's participation log (which steps were dropped, which had
  1 participant) gives group 0's per-step losses, failure and healing included.

The steps before the kill are checked against the replay's, which are then those of one
process training the joint batch (no reference run of its own).
"""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from harness import (
    FP32_PARITY_TOL,
    ROOT,
    assert_close,
    build_trainer,
    env,
    job_args,
    read_metrics,
    torchrun_argv,
)

STEPS = 16
KILL_STEP = 6
SAVE_STEP = 12
WORKER_STEP = 14
KILLS = [f"allreduce:{KILL_STEP}", "heal", f"save:{SAVE_STEP}"]
"""Group 1's killed launches (ft_trainer.py's KILL_ENV): inside step KILL_STEP's gradient
all-reduce; restarted, inside its healing; restarted, it heals and trains until group 0
starts writing checkpoint SAVE_STEP, where it dies again; its fourth launch heals, loses a
worker after WORKER_STEP (torchrun restarts the group's workers), heals again and ends."""
CKPT_INTERVAL = 4
# A constant LR after warmup: the one-process reference of the first steps needs no more steps.
LR = ["--lr_scheduler.decay_ratio", "0"]
TRAINING = [*LR, "--training.global_batch_size", "8", "--training.steps", str(STEPS)]
GROUP_ARGS = [*TRAINING, "--checkpoint.enable", "true", "--checkpoint.interval",
              str(CKPT_INTERVAL)]
TRAINER = str(ROOT / "tests" / "plugins" / "ft_trainer.py") + ":FTTestTrainer"
KILL_ENV = "FT_TEST_KILL"  # ft_trainer.py's


def _lighthouse(log: Path) -> tuple[subprocess.Popen, str]:
    """A lighthouse on a free loopback port; a group is dead after 1 s without heartbeats."""
    exe = Path(sys.executable).parent / "torchft_lighthouse"
    proc = subprocess.Popen([str(exe), "--min_replicas", "1", "--bind", "127.0.0.1:0",
                             "--heartbeat_timeout_ms", "1000", "--join_timeout_ms", "500"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    for _ in range(600):  # up to a minute on a busy machine
        found = re.search(r"listening on: http://[^:]+:(\d+)", log.read_text())
        if found:
            return proc, f"http://127.0.0.1:{found.group(1)}"
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the lighthouse did not start: {log.read_text()}")


def _group(replica_id: int, root: Path, corpus: Path, lighthouse: str,
           kill: str = "", max_restarts: int = 0) -> subprocess.Popen:
    ft = ["--fault_tolerance.enable", "true", "--fault_tolerance.replica_id", str(replica_id),
          "--fault_tolerance.group_size", "2", "--fault_tolerance.manager_hostname", "localhost",
          "--fault_tolerance.process_group_timeout_ms", "5000", "--job.trainer", TRAINER]
    cmd = torchrun_argv(2, "-m", "torchtitan_like.train",
                        *job_args([*GROUP_ARGS, *ft], root, corpus), max_restarts=max_restarts,
                        launcher="torchtitan_like.launch")
    log = (root / f"group{replica_id}.log").open("a")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**env(), "TORCHFT_LIGHTHOUSE": lighthouse, KILL_ENV: kill})


def _wait(proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    code = proc.wait(timeout=timeout)
    assert code == 0, f"exit {code}:\n{log.read_text()[-6000:]}"


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    """Group 0 runs once; group 1 is launched 3 times (``KILLS``, then no kill): each killed
    launch must end by SIGKILL (its agent's exit -9) before the next is started."""
    root = tmp_path_factory.mktemp("torchft")
    lighthouse, address = _lighthouse(root / "lighthouse.log")
    try:
        survivor = _group(0, root, corpus, address)
        for kill in KILLS:
            killed = _group(1, root, corpus, address, kill)
            code = killed.wait(timeout=240)
            assert code == -signal.SIGKILL, (code, (root / "group1.log").read_text()[-6000:])
            assert survivor.poll() is None, (root / "group0.log").read_text()[-6000:]
        restarted = _group(1, root, corpus, address, f"worker:{WORKER_STEP}", max_restarts=1)
        _wait(survivor, root / "group0.log")
        _wait(restarted, root / "group1.log")
    finally:
        lighthouse.kill()
    return root


@pytest.fixture(scope="module")
def replay(run, corpus, one_process_group):
    """Group 0's participation log replayed by one process (``Trainer.train_step`` on the
    joint global batch of 8 sequences, 4 microbatches of 2: microbatches 0-1 are group 0's
    share, 2-3 group 1's): each attempted step takes the next 4; an uncommitted one drops
    them, a step with 1 participant (group 0, the survivor) trains on group 0's share only.
    Returns the replayed per-step losses."""
    root = run
    trainer = build_trainer(TRAINING, root / "replay", corpus, one_process_group)
    data, replayed = iter(trainer.dataloader), []
    for record in read_metrics(root / "replica_0"):
        if "loss" not in record and record.get("committed") is not False:
            continue
        microbatches = [next(data) for _ in range(4)]
        if "loss" in record:
            trainer.step += 1
            loss, _ = trainer.train_step(microbatches[:2 * record["participants"]])
            replayed.append(trainer.global_sum(loss).item())
    return replayed


def _steps(records):
    return [r for r in records if "loss" in r]


def test_losses_before_the_failure_match_one_process(run, replay):
    root = run
    before = KILL_STEP - 1  # the steps both groups committed before the first kill
    group0 = _steps(read_metrics(root / "replica_0"))
    together = [r for r in group0[:before] if r["participants"] == 2]
    assert len(together) == before  # both groups in every step up to the kill
    assert_close([r["loss"] for r in together], replay[:before], FP32_PARITY_TOL)
    group1 = _steps(read_metrics(root / "replica_1"))[:before]
    assert [r["loss"] for r in group1] == [r["loss"] for r in together]  # the same sums


def _pids(folder: Path, rank: int) -> list[int]:
    return [int(line) for line in (folder / f"pids_rank{rank}.txt").read_text().split()]


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a dead child not yet reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_the_kills_hit_their_points_and_the_survivor_never_restarts(run):
    """Group 1 died where told (rank 0's record, written just before its SIGKILL), its killed
    launches' workers are gone (no orphans); group 0's workers are the same processes from
    start to end (one pid per rank, the one that saved the final state)."""
    root = run
    kills = [json.loads(line) for line in (root / "replica_1" / "kills.jsonl").open()]
    by_rank0 = [(k["point"], k["step"]) for k in kills if k["rank"] == 0]
    assert by_rank0[0] == ("allreduce", KILL_STEP) and by_rank0[2] == ("save", SAVE_STEP)
    assert len(by_rank0) == 3 and by_rank0[1][0] == "heal"
    assert by_rank0[1][1] % CKPT_INTERVAL == 0  # its step then: the checkpoint's it loaded
    assert [(k["point"], k["step"]) for k in kills if k["rank"] == 1][-1] == (
        "worker", WORKER_STEP)  # the last launch's rank 1, alone
    for rank in (0, 1):
        launches = _pids(root / "replica_1", rank)
        assert len(launches) == 5 and not any(_alive(pid) for pid in launches[:4])
        survivor = _pids(root / "replica_0", rank)
        final = torch.load(root / "replica_0" / f"final_state_rank{rank}.pt")
        assert survivor == [final["pid"]]
        restarted = torch.load(root / "replica_1" / f"final_state_rank{rank}.pt")
        assert restarted["pid"] == launches[-1] != final["pid"]


def test_survivor_continues_alone_and_the_restarted_group_heals(run):
    """Group 0 commits every step once, alone from each kill until group 1 healed back; the
    all-reduce the first kill interrupted either failed (the step retried alone) or had
    completed on group 0's side (committed with both groups' data: KILL_STEP + 1 alone)."""
    root = run
    group0 = read_metrics(root / "replica_0")
    assert not any(r.get("resumed") for r in group0)  # one attempt: never restarted
    steps0 = _steps(group0)
    assert [r["step"] for r in steps0] == list(range(1, STEPS + 1))  # each once
    assert all(r["committed"] for r in steps0)
    healed = sorted({int(s) for s in re.findall(r"healed from a peer at step (\d+)",
                                                  (root / "group1.log").read_text())})
    assert len(healed) == 3  # the heal-killed launch never finished healing
    assert healed[1] < WORKER_STEP <= healed[2]  # torchrun's restart of the last one healed
    alone = [r["step"] for r in steps0 if r["participants"] == 1]
    first = alone[0]
    assert first in (KILL_STEP, KILL_STEP + 1)
    assert alone == [*range(first, healed[0] + 1), *range(SAVE_STEP + 1, healed[1] + 1),
                     *range(WORKER_STEP + 1, healed[2] + 1)]
    heal_kill = [r for r in group0 if r.get("committed") is False and r["participants"] == 2
                 and first < r["step"] <= healed[0] + 1]
    assert heal_kill  # the step group 1 joined, healed into, and died in: not committed
    records1 = read_metrics(root / "replica_1")
    # the healed launches loaded group 0's DCP checkpoints first: the last one the checkpoint
    # group 0 wrote while group 1 died (a killed launch's buffered metrics die with it)
    loaded = [r["step"] for r in records1 if r.get("resumed")]
    assert loaded[-1] == SAVE_STEP and all(s % CKPT_INTERVAL == 0 for s in loaded)
    assert loaded[0] < healed[0] and loaded[-1] < healed[1]  # behind: each had to heal
    # committed once, with group 0; the records of steps healed[1] + 1 .. WORKER_STEP were
    # dropped by the restarted workers' resume from checkpoint SAVE_STEP (metrics.py)
    together = [*range(1, first), *range(healed[0] + 1, SAVE_STEP + 1),
                *range(healed[2] + 1, STEPS + 1)]
    steps1 = _steps(records1)
    assert [r["step"] for r in steps1] == together
    # torchft's batches_committed (participants summed over committed steps), as each group-1
    # start loaded it (a checkpoint's, derived from its tokens_seen) and at the end
    counted = [0]
    for r in steps0:
        counted.append(counted[-1] + r["participants"])
    for rank in (0, 1):
        starts = [json.loads(line) for line in (root / "replica_1" / f"starts_rank{rank}.jsonl")
                  .open()]
        steps = [s["step"] for s in starts]  # 5 starts: 0, the heal-killed one's, `loaded`
        assert len(steps) == 5 and steps[0] == 0 and steps[2:] == loaded
        assert steps[1] % CKPT_INTERVAL == 0
        assert all(s["batches_committed"] == counted[s["step"]] for s in starts)
        final = torch.load(root / "replica_0" / f"final_state_rank{rank}.pt")
        assert final["batches_committed"] == counted[STEPS]
    log1 = (root / "group1.log").read_text()
    assert log1.count("restarting the job (restart 1 of 1)") == 1  # the worker's death
    by_step = {r["step"]: r for r in steps0}
    assert all(r["loss"] == by_step[r["step"]]["loss"] for r in steps1)
    assert all(by_step[s]["participants"] == 2 for s in together)


def test_states_are_bitwise_equal_across_groups(run):
    root = run
    for rank in (0, 1):
        a = torch.load(root / "replica_0" / f"final_state_rank{rank}.pt")
        b = torch.load(root / "replica_1" / f"final_state_rank{rank}.pt")
        assert a.keys() == b.keys()
        for key in a:
            if key == "pid":
                continue
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


def test_a_replay_of_the_participation_log_gives_the_losses(run, replay):
    """(c) The trajectory is predictable from the log alone, failure and healing included.
    Bound: class b over ``STEPS`` steps instead of harness.py's 5: a couple of ulps of the
    loss per step, steps 1-4 at losses in [4, 8) (ulp 4.8e-7), the other 12 in [2, 4) (ulp
    2.4e-7): 4 x 2 x 4.8e-7 + 12 x 2 x 2.4e-7 = 9.6e-6, within FP32_PARITY_TOL."""
    root = run
    logged = [r["loss"] for r in _steps(read_metrics(root / "replica_0"))]
    assert_close(logged, replay, FP32_PARITY_TOL)
