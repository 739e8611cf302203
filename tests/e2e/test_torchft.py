"""Replica groups through torchft (distributed/fault_tolerance.py, docs/fault-tolerance.md):
one lighthouse, 2 replica groups of FSDP over 2 processes each (gloo, CPU), one run.

The run: both groups train ``STEPS`` steps. Group 1 is launched 4 times, each launch with a
kill point for the test trainer (tests/plugins/ft_trainer.py, ``KILLS``): the first SIGKILLs
group 1 (its agent, then every worker) inside step ``KILL_STEP``'s gradient all-reduce over
the groups; the second, restarted from the latest persistent checkpoint (written every
``CKPT_INTERVAL`` steps into the shared folder by the step's writer, rank 0 of its quorum:
group 0 while it lives), dies inside healing from group 0; the third heals (model,
optimizer, LR schedule, step, RNG and data position over the managed process group), trains
with group 0, and dies where group 0 starts writing checkpoint ``SAVE_STEP``; the fourth
(``--max-restarts=1``) loads that checkpoint, heals, trains, and loses its rank 1 alone after
step ``WORKER_STEP``: torchrun restarts its workers, which load the checkpoint again, heal in
a fresh per-attempt store (fault_tolerance.attempt_store) and train with group 0. Then group 0,
the writer, is SIGKILLed inside its own save of checkpoint ``WRITER_STEP`` (its files written,
not its .metadata: never complete). Group 1 goes on alone with the same processes, becomes
the writer and writes checkpoint ``TAKEOVER``; group 0, launched again at once (it looks
for a checkpoint only once that one is there), removes its cut-short save, loads
``TAKEOVER``, heals from group 1 and both train to the end. Survivors: group 0's first
launch from step 1 to ``WRITER_STEP``, group 1's last workers from their healing to the end.
Checked:

- (a) no failure yet: the steps both groups committed before the first kill have the
  per-step losses of one process training on the joint global batch, within
  ``FP32_PARITY_TOL`` (harness.py: the same fp32 terms, summed in another order: the tokens
  and gradients of the groups are *summed* across groups, as HSDP sums across its replicate
  dimension, so only the order of the sums differs from one process);
- (b) kill and rejoin: each kill happened at its point and step (the dying rank's record);
  the killed launches' workers are gone; each survivor's workers are the same processes
  throughout its phase (one pid per rank) and its launcher never restarts; every step is
  committed once by each group that took part in it, a group alone exactly from a kill of
  the other to the other's healing; every parameter and optimizer state shard is then bitwise
  equal across the groups (each group applied the same summed gradients to the same state, or
  received it bit for bit); both final launchers exit 0;
- writer failover: the complete checkpoints are those of the steps written by their writer
  (group 0's, then group 1's ``TAKEOVER``, then group 0's last), never ``WRITER_STEP``, and no
  group ever loaded anything else;
- participants and committed are in every step's metrics record;
- (c) one process replaying the participation log of the job (both groups' records: which
  steps were dropped, which group trained alone) gives the logged per-step losses, failures
  and healings included.

The steps before the kill are checked against the replay's, which are then those of one
process training the joint batch (no reference run of its own).
"""

import json
import math
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

STEPS = 24
KILL_STEP = 6
SAVE_STEP = 12
WORKER_STEP = 14
WRITER_STEP = 16
"""Group 0, the writer, dies inside its save of this checkpoint (``writer:<k>``), once group
1's last workers healed (after step WORKER_STEP) and trained with it."""
KILLS = [f"allreduce:{KILL_STEP}", "heal", f"save:{SAVE_STEP}"]
"""Group 1's killed launches (ft_trainer.py's KILL_ENV): inside step KILL_STEP's gradient
all-reduce; restarted, inside its healing; restarted, it heals and trains until group 0
starts writing checkpoint SAVE_STEP, where it dies again; its fourth launch heals, loses a
worker after WORKER_STEP (torchrun restarts the group's workers), heals again and ends."""
CKPT_INTERVAL = 4
TAKEOVER = WRITER_STEP + CKPT_INTERVAL
"""The checkpoint group 1 writes alone, the next due after the one cut short: its last launch
commits CKPT_INTERVAL steps alone before it waits for group 0 (ft_trainer.py's ALONE_ENV)."""
# A constant LR after warmup: the one-process reference of the first steps needs no more steps.
LR = ["--lr_scheduler.decay_ratio", "0"]
TRAINING = [*LR, "--training.global_batch_size", "8", "--training.steps", str(STEPS)]
GROUP_ARGS = [*TRAINING, "--checkpoint.enable", "true", "--checkpoint.interval",
              str(CKPT_INTERVAL)]
TRAINER = str(ROOT / "tests" / "plugins" / "ft_trainer.py") + ":FTTestTrainer"
KILL_ENV, ALONE_ENV, LOAD_AFTER_ENV = "FT_TEST_KILL", "FT_TEST_ALONE", "FT_TEST_LOAD_AFTER"


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
           kill: str = "", max_restarts: int = 0, alone: int = 0,
           load_after: str = "") -> subprocess.Popen:
    ft = ["--fault_tolerance.enable", "true", "--fault_tolerance.replica_id", str(replica_id),
          "--fault_tolerance.group_size", "2", "--fault_tolerance.manager_hostname", "localhost",
          "--fault_tolerance.process_group_timeout_ms", "5000", "--job.trainer", TRAINER]
    cmd = torchrun_argv(2, "-m", "torchtitan_like.train",
                        *job_args([*GROUP_ARGS, *ft], root, corpus), max_restarts=max_restarts,
                        launcher="torchtitan_like.launch")
    log = (root / f"group{replica_id}.log").open("a")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**env(), "TORCHFT_LIGHTHOUSE": lighthouse, KILL_ENV: kill,
                                 ALONE_ENV: str(alone or ""), LOAD_AFTER_ENV: load_after})


def _wait(proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    code = proc.wait(timeout=timeout)
    assert code == 0, f"exit {code}:\n{log.read_text()[-6000:]}"


def _wait_for(path: Path, alive: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert alive.poll() is None and time.monotonic() < deadline, log.read_text()[-6000:]
        time.sleep(0.1)


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    """Group 1 is launched 4 times (``KILLS``, then a worker's death), group 0 twice (killed
    in its save of WRITER_STEP; again at once, its start-up overlapping group 1's steps alone,
    looking for its checkpoint only once group 1 wrote TAKEOVER): each killed launch must end
    by SIGKILL (its agent's exit -9) before the next of its group is started."""
    root = tmp_path_factory.mktemp("torchft")
    lighthouse, address = _lighthouse(root / "lighthouse.log")
    launched: list[subprocess.Popen] = []

    def launch(replica_id: int, *args, **kwargs) -> subprocess.Popen:
        launched.append(_group(replica_id, root, corpus, address, *args, **kwargs))
        return launched[-1]

    try:
        survivor = launch(0, f"writer:{WRITER_STEP}")
        for kill in KILLS:
            code = launch(1, kill).wait(timeout=240)
            assert code == -signal.SIGKILL, (code, (root / "group1.log").read_text()[-6000:])
            assert survivor.poll() is None, (root / "group0.log").read_text()[-6000:]
        last = launch(1, f"worker:{WORKER_STEP}", max_restarts=1, alone=CKPT_INTERVAL)
        code = survivor.wait(timeout=240)
        assert code == -signal.SIGKILL, (code, (root / "group0.log").read_text()[-6000:])
        takeover = root / "checkpoint" / f"step-{TAKEOVER}"  # group 1's, written alone
        rejoined = launch(0, load_after=str(takeover))  # starts up now
        _wait_for(takeover, last, root / "group1.log")
        _wait(rejoined, root / "group0.log")
        _wait(last, root / "group1.log")
    finally:  # a failed run leaves no launcher behind (its workers die with it)
        for proc in launched:
            if proc.poll() is None:
                proc.kill()
        lighthouse.kill()
    return root


def _attempts(root: Path) -> list[dict]:
    """The job's attempted steps in order, from both groups' logs: for each step, the records
    (uncommitted attempts, then the commit) of the lowest group that committed it. A step's
    commit is the job's (a group behind heals to it, never trains it again), and the group
    that committed it saw every attempt of it that anyone survived to log."""
    by_group = []
    for group in (0, 1):
        steps: dict[int, list[dict]] = {}
        for record in read_metrics(root / f"replica_{group}"):
            if "loss" in record or record.get("committed") is False:
                steps.setdefault(record["step"], []).append(record)
        by_group.append(steps)
    attempts = []
    for step in range(1, STEPS + 1):
        group = next(g for g in by_group if any("loss" in r for r in g.get(step, [])))
        attempts += group[step]
    return attempts


@pytest.fixture(scope="module")
def replay(run, corpus, one_process_group):
    """The job's participation log (``_attempts``) replayed by one process
    (``Trainer.train_step`` on the joint global batch of 8 sequences, 4 microbatches of 2:
    microbatches 0-1 are group 0's share, 2-3 group 1's): each attempted step takes the next
    4; an uncommitted one drops them, a step with 1 participant trains on the share of the
    group that logged it (the one alive). Returns the replayed per-step losses."""
    root = run
    trainer = build_trainer(TRAINING, root / "replay", corpus, one_process_group)
    data, replayed = iter(trainer.dataloader), []
    for record in _attempts(root):
        microbatches = [next(data) for _ in range(4)]
        if "loss" in record:
            trainer.step += 1
            share = (microbatches if record["participants"] == 2
                     else microbatches[2 * record["replica_id"]:][:2])
            loss, _ = trainer.train_step(share)
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


def _kills(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "kills.jsonl").open()]


def test_the_kills_hit_their_points_and_the_survivors_keep_their_processes(run):
    """Each group died where told (rank 0's record, written just before its SIGKILL), its
    killed launches' workers are gone (no orphans); group 0's first workers are the same
    processes from start to their kill, group 1's last ones (its last launch's second
    attempt) from their start to the end (one pid per rank, the one that saved the final
    state), and group 0's second launch saved its final state."""
    root = run
    kills = _kills(root / "replica_1")
    by_rank0 = [(k["point"], k["step"]) for k in kills if k["rank"] == 0]
    assert by_rank0[0] == ("allreduce", KILL_STEP) and by_rank0[2] == ("save", SAVE_STEP)
    assert len(by_rank0) == 3 and by_rank0[1][0] == "heal"
    assert by_rank0[1][1] % CKPT_INTERVAL == 0  # its step then: the checkpoint's it loaded
    assert [(k["point"], k["step"]) for k in kills if k["rank"] == 1][-1] == (
        "worker", WORKER_STEP)  # the last launch's rank 1, alone
    writer = _kills(root / "replica_0")  # rank 1's record only if it got there first
    assert [(k["point"], k["step"]) for k in writer if k["rank"] == 0] == [
        ("writer", WRITER_STEP)]
    for k in writer:  # its own DCP file written, the coordinator's .metadata not
        assert f"__{k['rank']}_0.distcp" in k["partial"] and ".metadata" not in k["partial"]
    for rank in (0, 1):
        launches = _pids(root / "replica_1", rank)
        assert len(launches) == 5 and not any(_alive(pid) for pid in launches[:4])
        restarted = torch.load(root / "replica_1" / f"final_state_rank{rank}.pt")
        assert restarted["pid"] == launches[-1]
        first, second = _pids(root / "replica_0", rank)
        assert not _alive(first)
        final = torch.load(root / "replica_0" / f"final_state_rank{rank}.pt")
        assert final["pid"] == second != restarted["pid"]
    assert [k["pid"] for k in writer if k["rank"] == 0] == [_pids(root / "replica_0", 0)[0]]


def _healed(log: Path) -> list[int]:
    return sorted({int(s) for s in re.findall(r"healed from a peer at step (\d+)",
                                              log.read_text())})


def test_survivors_continue_alone_and_the_restarted_groups_heal(run):
    """Each step is committed once by each group that took part; a group trains alone exactly
    from a kill of the other until the other healed back. Group 0: every step until its kill
    in WRITER_STEP's save, alone from each kill of group 1 to its next healing (the all-reduce
    the first kill interrupted either failed, the step retried alone, or had completed on
    group 0's side: committed with both groups' data, KILL_STEP + 1 alone), then, launched
    again, the steps after its healing. Group 1: the steps before KILL_STEP (it never commits
    the step it dies in), then after its last healing every step, alone from WRITER_STEP + 1
    until group 0 healed."""
    root = run
    group0, records1 = read_metrics(root / "replica_0"), read_metrics(root / "replica_1")
    healed = _healed(root / "group1.log")
    assert len(healed) == 3  # the heal-killed launch never finished healing
    assert healed[1] < WORKER_STEP <= healed[2] < WRITER_STEP  # torchrun's restart healed
    rejoined = _healed(root / "group0.log")
    assert len(rejoined) == 1 and rejoined[0] > TAKEOVER  # it loaded TAKEOVER: behind
    steps0 = _steps(group0)
    assert [r["step"] for r in steps0] == [*range(1, WRITER_STEP + 1),
                                           *range(rejoined[0] + 1, STEPS + 1)]  # each once
    assert all(r["committed"] for r in steps0)
    # group 0's first launch never restarted; its second loaded TAKEOVER, group 1's, never
    # the WRITER_STEP it was writing when it died (its start-up removed that cut-short save)
    assert [r["step"] for r in group0 if r.get("resumed")] == [TAKEOVER]
    alone = [r["step"] for r in steps0 if r["participants"] == 1]
    first = alone[0]
    assert first in (KILL_STEP, KILL_STEP + 1)
    assert alone == [*range(first, healed[0] + 1), *range(SAVE_STEP + 1, healed[1] + 1),
                     *range(WORKER_STEP + 1, healed[2] + 1)]
    heal_kill = [r for r in group0 if r.get("committed") is False and r["participants"] == 2
                 and first < r["step"] <= healed[0] + 1]
    assert heal_kill  # the step group 1 joined, healed into, and died in: not committed
    # the healed launches of group 1 loaded group 0's DCP checkpoints first: the last one the
    # checkpoint group 0 wrote while group 1 died (a killed launch's buffered metrics die
    # with it)
    loaded = [r["step"] for r in records1 if r.get("resumed")]
    assert loaded[-1] == SAVE_STEP and all(s % CKPT_INTERVAL == 0 for s in loaded)
    assert loaded[0] < healed[0] and loaded[-1] < healed[1]  # behind: each had to heal
    # committed once; the records of steps healed[1] + 1 .. WORKER_STEP were dropped by the
    # restarted workers' resume from checkpoint SAVE_STEP (metrics.py)
    steps1 = _steps(records1)
    assert [r["step"] for r in steps1] == [*range(1, KILL_STEP),  # it died inside KILL_STEP
                                           *range(healed[0] + 1, SAVE_STEP + 1),
                                           *range(healed[2] + 1, STEPS + 1)]
    assert all(r["committed"] for r in steps1)
    assert [r["step"] for r in steps1 if r["participants"] == 1] == list(
        range(WRITER_STEP + 1, rejoined[0] + 1))  # alone from the writer's death to its heal
    log1 = (root / "group1.log").read_text()
    assert log1.count("restarting the job (restart 1 of 1)") == 1  # the worker's death
    by_step = {r["step"]: r for r in steps0}
    both = [r for r in steps1 if r["step"] in by_step]
    assert all(r["loss"] == by_step[r["step"]]["loss"] for r in both)  # the same sums
    assert all(r["participants"] == by_step[r["step"]]["participants"] == 2 for r in both)
    # the writer of each step was rank 0 of its quorum: group 0 whenever it took part
    assert all(r["quorum_rank"] == 0 for r in steps0)
    assert all(r["quorum_rank"] == (r["participants"] == 2) for r in steps1)


def test_the_writer_fails_over_and_a_cut_short_save_is_never_loaded(run):
    """The complete checkpoints are exactly the due steps whose writer committed and saved
    them: group 0's, then group 1's TAKEOVER (group 0 dead), then group 0's last; WRITER_STEP
    never completed and its partial folder is gone, removed by group 0's second launch at its
    start-up; every start of either group loaded a complete checkpoint (or none); torchft's
    ``batches_committed`` (participants summed over the committed steps), as each start
    loaded it (a checkpoint's, derived from its tokens_seen) and at the end, is the job's."""
    root = run
    folder = root / "checkpoint"
    written = {int(p.name.removeprefix("step-")): json.loads((p / "checkpoint.json").read_text())
               for p in folder.glob("step-*") if p.is_dir()}
    due = [s for s in range(CKPT_INTERVAL, STEPS + 1, CKPT_INTERVAL) if s != WRITER_STEP]
    assert sorted(written) == due and not list(folder.glob("*.partial"))
    assert {s: info["writer"] for s, info in written.items()} == {
        s: "replica_1" if s == TAKEOVER else "replica_0" for s in due}
    assert f"removing step-{WRITER_STEP}.replica_0.partial" in (
        root / "group0.log").read_text()
    loaded = [r["step"] for r in read_metrics(root / "replica_1") if r.get("resumed")]
    counted = [0]
    for record in _attempts(root):
        if "loss" in record:
            counted.append(counted[-1] + record["participants"])
    assert len(counted) == STEPS + 1
    for rank in (0, 1):
        starts = {group: [json.loads(line) for line in (
            root / f"replica_{group}" / f"starts_rank{rank}.jsonl").open()] for group in (0, 1)}
        steps = [s["step"] for s in starts[1]]  # 5 starts: 0, the heal-killed one's, `loaded`
        assert len(steps) == 5 and steps[0] == 0 and steps[2:] == loaded
        assert steps[1] % CKPT_INTERVAL == 0 and steps[1] < WRITER_STEP
        assert [s["step"] for s in starts[0]] == [0, TAKEOVER]
        assert all(s["batches_committed"] == counted[s["step"]]
                   for s in starts[0] + starts[1])
        for group in (0, 1):
            final = torch.load(root / f"replica_{group}" / f"final_state_rank{rank}.pt")
            assert final["batches_committed"] == counted[STEPS]


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
    """(c) The trajectory is predictable from the log alone, failures, healings and the
    writer's failover included. Bound: class b over ``STEPS`` steps instead of harness.py's
    5, a couple of ulps of the loss per step (the error of each step's sums reorderings, which
    the weights carry into every later step), summed over the steps at their own losses' ulps
    (fp32: 2^-23 of the power of two below the loss)."""
    root = run
    logged = [r["loss"] for r in _attempts(root) if "loss" in r]
    bound = sum(2 * 2.0 ** (math.floor(math.log2(loss)) - 23) for loss in logged)
    print(f"replay bound {bound:.3g} over {len(logged)} steps")
    assert_close(logged, replay, bound)
