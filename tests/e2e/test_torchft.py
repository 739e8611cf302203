"""Replica groups through torchft (distributed/fault_tolerance.py, docs/fault-tolerance.md):
one lighthouse, 2 replica groups of FSDP over 2 processes each (gloo, CPU), one run.

The run: both groups train ``STEPS`` steps; once group 1 has logged step ``KILL_AFTER``, the
test SIGKILLs group 1's launcher (agent): its workers die with it (lifecycle.die_with_agent).
Group 0 keeps training alone. Group 1 is started again with the same command: it loads group
0's latest persistent checkpoint (written every ``CKPT_INTERVAL`` steps, by group 0 only, into
the shared folder), then *heals* from group 0 at its first quorum (model, optimizer, LR
schedule, step, RNG and data position over the managed process group) and trains with it to
the end. Checked:

- (a) no failure yet: the steps both groups committed before the kill have the per-step
  losses of one process training on the joint global batch, within ``FP32_PARITY_TOL``
  (harness.py: the same fp32 terms, summed in another order: the tokens and gradients of
  the groups are *summed* across groups, as HSDP sums across its replicate dimension, so
  only the order of the sums differs from one process);
- (b) kill and rejoin: group 0's launcher never restarts (one torchrun attempt, exit 0, every
  step 1..STEPS committed once, some with 1 participant); group 1 heals and commits steps
  with 2 participants after that; every parameter and optimizer state shard is then bitwise
  equal across the groups (each group applied the same summed gradients to the same state,
  or received it bit for bit); both launchers end with exit 0;
- participants and committed are in every step's metrics record;
- (c) one process replaying group 0's participation log (which steps were dropped, which had
  1 participant) gives group 0's per-step losses, failure and healing included.

The steps before the kill are checked against the replay's, which are then those of one
process training the joint batch (no reference run of its own).
"""

import os
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
KILL_AFTER = 5
CKPT_INTERVAL = 4
# A constant LR after warmup: the one-process reference of the first steps needs no more steps.
LR = ["--lr_scheduler.decay_ratio", "0"]
TRAINING = [*LR, "--training.global_batch_size", "8", "--training.steps", str(STEPS)]
GROUP_ARGS = [*TRAINING, "--checkpoint.enable", "true", "--checkpoint.interval",
              str(CKPT_INTERVAL)]
TRAINER = str(ROOT / "tests" / "plugins" / "ft_trainer.py") + ":FTTestTrainer"


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


def _group(replica_id: int, root: Path, corpus: Path, lighthouse: str) -> subprocess.Popen:
    ft = ["--fault_tolerance.enable", "true", "--fault_tolerance.replica_id", str(replica_id),
          "--fault_tolerance.group_size", "2", "--fault_tolerance.manager_hostname", "localhost",
          "--fault_tolerance.process_group_timeout_ms", "5000", "--job.trainer", TRAINER]
    cmd = torchrun_argv(2, "-m", "torchtitan_like.train",
                        *job_args([*GROUP_ARGS, *ft], root, corpus), max_restarts=0,
                        launcher="torchtitan_like.launch")
    log = (root / f"group{replica_id}.log").open("a")
    return subprocess.Popen(cmd, cwd=ROOT, env={**env(), "TORCHFT_LIGHTHOUSE": lighthouse},
                            stdout=log, stderr=subprocess.STDOUT)


def _logged_step(folder: Path) -> int:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return 0
    return max((r["step"] for r in read_metrics(folder) if "loss" in r), default=0)


def _wait(proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    code = proc.wait(timeout=timeout)
    assert code == 0, f"exit {code}:\n{log.read_text()[-6000:]}"


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("torchft")
    lighthouse, address = _lighthouse(root / "lighthouse.log")
    try:
        groups = [_group(i, root, corpus, address) for i in (0, 1)]
        deadline = time.monotonic() + 180
        while _logged_step(root / "replica_1") < KILL_AFTER and time.monotonic() < deadline:
            assert groups[1].poll() is None, (root / "group1.log").read_text()[-6000:]
            time.sleep(0.05)
        os.kill(groups[1].pid, signal.SIGKILL)  # the agent; its workers follow within 0.5 s
        groups[1].wait()
        killed_at = _logged_step(root / "replica_1")
        restarted = _group(1, root, corpus, address)
        _wait(groups[0], root / "group0.log")
        _wait(restarted, root / "group1.log")
    finally:
        lighthouse.kill()
    return root, killed_at


@pytest.fixture(scope="module")
def replay(run, corpus, one_process_group):
    """Group 0's participation log replayed by one process (``Trainer.train_step`` on the
    joint global batch of 8 sequences, 4 microbatches of 2: microbatches 0-1 are group 0's
    share, 2-3 group 1's): each attempted step takes the next 4; an uncommitted one drops
    them, a step with 1 participant (group 0, the survivor) trains on group 0's share only.
    Returns the replayed per-step losses."""
    root, _ = run
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
    root, _ = run
    group0 = _steps(read_metrics(root / "replica_0"))
    together = [r for r in group0[:KILL_AFTER] if r["participants"] == 2]
    assert len(together) == KILL_AFTER  # both groups in every step up to the kill
    assert_close([r["loss"] for r in together], replay[:KILL_AFTER], FP32_PARITY_TOL)
    group1 = _steps(read_metrics(root / "replica_1"))[:KILL_AFTER]
    assert [r["loss"] for r in group1] == [r["loss"] for r in together]  # the same sums


def test_survivor_continues_alone_and_the_restarted_group_heals(run):
    root, killed_at = run
    group0 = read_metrics(root / "replica_0")
    assert not any(r.get("resumed") for r in group0)  # one attempt: never restarted
    assert [r["step"] for r in _steps(group0)] == list(range(1, STEPS + 1))
    assert all(r["committed"] for r in _steps(group0))
    alone = [r["step"] for r in _steps(group0) if r["participants"] == 1]
    assert alone and alone[0] > killed_at
    rejoined = [r["step"] for r in _steps(group0)
                if r["participants"] == 2 and r["step"] > alone[0]]
    assert rejoined and rejoined[-1] == STEPS
    records1 = read_metrics(root / "replica_1")
    loaded = [r["step"] for r in records1 if r.get("resumed")]  # group 0's DCP checkpoint
    assert len(loaded) == 1 and loaded[0] % CKPT_INTERVAL == 0 and loaded[0] < rejoined[0] - 1
    assert f"healed from a peer at step {rejoined[0] - 1}" in (root / "group1.log").read_text()
    group1 = _steps(records1)
    after = [r for r in group1 if r["step"] >= rejoined[0]]
    assert [r["step"] for r in after] == rejoined
    by_step = {r["step"]: r["loss"] for r in _steps(group0)}
    assert all(r["loss"] == by_step[r["step"]] for r in after)


def test_states_are_bitwise_equal_across_groups(run):
    root, _ = run
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
    root, _ = run
    logged = [r["loss"] for r in _steps(read_metrics(root / "replica_0"))]
    assert_close(logged, replay, FP32_PARITY_TOL)
