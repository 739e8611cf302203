"""A job's life around its training, through ./run_train.sh (torchtitan_like/launch.py):
starting beside another job, owning its dump folder, dying with its agent, ending with one
line and its own exit code.

Two 2-process jobs start at once (their workers meet in their agents' stores, bound before
they start: no EADDRINUSE however many start together):

- ``short`` trains 3 steps and exits 0 after "done" (no exit race);
- ``chaos`` (async_with_pinned_mem saves every 2 steps, so each trainer has a DCP writer
  process; ``[comm] train_timeout_seconds = 10``; MAX_RESTARTS=3) holds its folder: a third
  job there is refused by run_train.sh's check before torchrun starts (preflight.py, run in
  this process; exit 6, naming the holder). Then rank 1's trainer is SIGKILLed: its writer
  process dies with it and the job restarts. After the resume, rank 1 is SIGSTOPped in the
  middle of a save: rank 0's next collective times out after the configured 10 s and the job
  restarts, within a bound derived from that timeout (10 s + 60 s of stopping and monitoring
  slack, far below the 300 s and 30 min it took before). Once the third attempt's workers
  exist, the launcher is SIGKILLed: every process it started is gone (within 60 s: its
  workers may still be importing torch).

The chaos job's lock record outlives it (it died), so the next job on its folder takes the
lock over with a warning. A config error raised on rank 1 only reaches the console with
LOG_RANK=0, as the last line, with exit code 2, once although MAX_RESTARTS=3, and without
torchrun's traceback or banners. (A corrupt
checkpoint's exit code 4 and the data error's 5 are in test_rerun.py and test_preflight.py.)
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import ROOT, env, read_metrics, torchrun

from torchtitan_like.preflight import main as preflight_main

TRAIN_TIMEOUT_S = 10
TINY = ["--model.flavor=tiny", "--training.seq_len=64", "--training.local_batch_size=2",
        "--metrics.log_freq=1", "--metrics.peak_tflops=1", "--validation.enable=false",
        "--metrics.enable_tensorboard=false", "--training.dataset=local"]
CHAOS = ["--training.steps=100000", "--checkpoint.enable=true", "--checkpoint.interval=2",
         "--checkpoint.async_mode=async_with_pinned_mem", "--checkpoint.keep_latest_k=2",
         f"--comm.train_timeout_seconds={TRAIN_TIMEOUT_S}"]
START_S = 600  # an upper bound for waiting on a start-up of a loaded 2-core machine


def run_train(folder: Path, corpus: Path, *overrides: str, restarts: int = 0,
              log: Path | None = None) -> subprocess.Popen:
    extra = {"NPROC": "2", "PYTHON": sys.executable, "MAX_RESTARTS": str(restarts),
             "LOG_RANK": "0"}
    out = log.open("w") if log else subprocess.PIPE
    return subprocess.Popen(["./run_train.sh", f"--job.dump_folder={folder}", *TINY,
                             f"--training.dataset_path={corpus}", *overrides],
                            cwd=ROOT, env={**env(), **extra}, stdout=out,
                            stderr=subprocess.STDOUT, text=True)


def proc_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                if "=" in item)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return [c for c in found if alive(c)]


def workers(launcher: int) -> dict[int, int]:
    """{rank: pid} of the launcher's live workers."""
    return {int(e["RANK"]): pid for pid in children(launcher)
            if "RANK" in (e := proc_environ(pid))}


def started_by(launcher: int) -> list[int]:
    """Every live process that a worker of this launcher is, or started (writers)."""
    mark = f"{launcher}"
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
            and proc_environ(int(p.name)).get("TORCHTITAN_LIKE_AGENT_PID") == mark
            and int(p.name) != launcher and alive(int(p.name))]


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def resumes(folder: Path) -> int:
    path = folder / "metrics.jsonl"
    return sum(r.get("resumed", False) for r in read_metrics(folder)) if path.is_file() else 0


def complete_steps(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (folder / "checkpoint").glob("step-*")
                  if p.name.split("-")[1].isdigit())


def finish(proc: subprocess.Popen, timeout_s: float = START_S) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout_s)
    return proc.returncode, out or ""


@pytest.fixture(scope="module")
def jobs(corpus, tmp_path_factory):
    """Two jobs started at once, ``chaos`` (the sequence of the module docstring) and
    ``short`` (3 steps); then a third job, refused, on the chaos folder."""
    root = tmp_path_factory.mktemp("job_life")
    folder, log = root / "chaos", root / "chaos.log"
    chaos = run_train(folder, corpus, *CHAOS, restarts=3, log=log)
    short = run_train(root / "short", corpus, "--training.steps=3")
    try:
        holder = wait_for(lambda: (folder / "job.lock").is_file() and
                          (folder / "job.lock").read_text(), START_S, "the chaos job's lock")
        refused = preflight(["--job.config_file", str(ROOT / "train_configs/debug_model.toml"),
                             f"--job.dump_folder={folder}"])
        events = _kill_stop_and_orphan(chaos, folder, log)
        return {"chaos": (folder, log.read_text(), events), "short": finish(short),
                "refused": (json.loads(holder), refused)}
    finally:
        for proc in (chaos, short):
            if proc.poll() is None:
                proc.kill()


def preflight(argv: list[str]) -> tuple[int, str]:
    """run_train.sh's check before torchrun starts, in this process (the lock holder is
    another process either way): its exit code and what it logged; the logger is restored."""
    logger = logging.getLogger("torchtitan_like")
    saved = logger.handlers[:], logger.propagate, logger.level
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out):
            code = preflight_main(argv)
    finally:
        logger.handlers[:], logger.propagate = saved[0], saved[1]
        logger.setLevel(saved[2])
    return code, out.getvalue()


def two_workers(launcher: int, attempt: int) -> dict[int, int] | None:
    """{rank: pid} once both workers of this attempt (torchrun's restart count) run."""
    found = workers(launcher)
    restarts = {proc_environ(p).get("TORCHELASTIC_RESTART_COUNT") for p in found.values()}
    return found if len(found) == 2 and restarts == {str(attempt)} else None


def _kill_stop_and_orphan(job: subprocess.Popen, folder: Path, log: Path) -> dict[str, object]:
    launcher = job.pid
    # 1. A save completed: both trainers have their DCP writer process. SIGKILL rank 1.
    wait_for(lambda: complete_steps(folder), START_S, "the first checkpoint")
    ranks = wait_for(lambda: two_workers(launcher, 0), 60, "two workers")
    writers = wait_for(lambda: children(ranks[1]), 60, "rank 1's writer process")
    os.kill(ranks[1], signal.SIGKILL)
    writer_gone = wait_for(lambda: not any(alive(w) for w in writers), 60,
                           "rank 1's writer to die with it")
    # 2. Restarted and resumed; a save in flight: SIGSTOP rank 1.
    wait_for(lambda: resumes(folder) == 1, START_S, "the resume after the kill")
    after = max(complete_steps(folder))
    wait_for(lambda: max(complete_steps(folder), default=0) > after, START_S, "a new checkpoint")
    ranks = wait_for(lambda: two_workers(launcher, 1), 60, "two restarted workers")
    wait_for(lambda: list((folder / "checkpoint").glob("*.partial")), 120, "a save in flight",
             poll_s=0.01)
    os.kill(ranks[1], signal.SIGSTOP)
    stopped = time.monotonic()
    wait_for(lambda: "restart 2 of 3" in log.read_text(), TRAIN_TIMEOUT_S + START_S,
             "the restart after the stop")
    restart_s = time.monotonic() - stopped
    # 3. SIGKILL the launcher once the third attempt's workers exist.
    wait_for(lambda: two_workers(launcher, 2), START_S, "the third attempt's workers")
    processes = started_by(launcher)
    os.kill(launcher, signal.SIGKILL)
    job.wait()
    wait_for(lambda: not any(alive(p) for p in processes) and not started_by(launcher), 60,
             "every process of the killed launcher to end", poll_s=0.2)
    return {"writer_gone": writer_gone, "restart_s": restart_s, "processes": processes}


def test_jobs_started_together_finish_with_exit_code_0(jobs):
    code, out = jobs["short"]
    assert code == 0, out[-3000:]
    assert "done: metrics in" in out and "EADDRINUSE" not in out and "Traceback" not in out


def test_a_second_job_on_a_held_folder_is_refused_before_it_starts(jobs):
    holder, (code, said) = jobs["refused"]
    folder, log, _ = jobs["chaos"]
    assert code == 6, said
    (line,) = said.strip().splitlines()
    assert f"dump folder in use: {folder} is used by a running job: pid {holder['pid']}" in line
    assert "step 1/100000" in log  # the holder was training, unharmed


def test_a_killed_trainer_takes_its_writer_and_a_stopped_one_times_out(jobs):
    folder, log, events = jobs["chaos"]
    assert events["writer_gone"]
    assert "[launch] rank 1 failed: killed by SIGKILL; restarting the job (restart 1 of 3)" in log
    assert "[launch] rank 0 failed: RuntimeError: [" in log and "Timed out waiting 10000ms" in log
    assert events["restart_s"] <= TRAIN_TIMEOUT_S + 60, events
    assert resumes(folder) == 1  # the third attempt was killed while starting


def test_a_killed_launcher_leaves_no_process(jobs):
    """Its workers of the third attempt (still starting, so the watchdog may not run yet:
    it compares the parent with the launcher's pid from the environment)."""
    _, _, events = jobs["chaos"]
    assert len(events["processes"]) >= 2


def test_the_killed_jobs_lock_is_taken_over_with_a_warning(jobs, caplog):
    """The chaos job died (its second attempt of an unexpected error, its third with the
    launcher): its lock record stays, and the next job to take the folder says so."""
    from torchtitan_like.components.run_folder import FolderLock

    folder, _, _ = jobs["chaos"]
    assert json.loads((folder / "job.lock").read_text())["pid"]  # not emptied
    lock = FolderLock(folder)
    with caplog.at_level(logging.WARNING, logger="torchtitan_like"):
        lock.acquire()
    lock.release()
    assert "job.lock: taking over the lock of pid" in caplog.text
    assert "which ended without releasing it" in caplog.text


def test_an_error_on_rank_1_reaches_the_console_with_log_rank_0(tmp_path, corpus):
    """Through the launcher alone (run_train.sh adds its preflight, tested above)."""
    plugin = ROOT / "tests/e2e/rank1_fails.py"
    proc = torchrun(2, "--local-ranks-filter=0", "--role=rank", "--tee=3",
                    "-m", "torchtitan_like.train", *TINY, f"--training.dataset_path={corpus}",
                    f"--job.custom_import={plugin}", f"--job.dump_folder={tmp_path}",
                    timeout=START_S, max_restarts=3, launcher="torchtitan_like.launch")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "restarting" not in out
    assert "exitcode" not in out and "OMP_NUM_THREADS" not in out  # torchrun's banners
    last = out.strip().splitlines()[-1]
    assert last.startswith("config error: [job] custom_import:") and "ValueError: this module " \
        "refuses to run on rank 1 (rank 1, exit code 2; not restarted" in last, last
