"""Shared test machinery: a generated corpus, and multi-process launches of the real trainer.

A parity test launches its ranks once per world size: the worker (parallel/worker.py) trains
each case of a list in turn inside one process group and the per-step losses are read back
from each case's metrics.jsonl. References are one-process launches of the same cases. The
ranks are forked by the session's rank server (rank_server.py: torch and the trainer imported
once, not by every rank of every launch), torchrun's way of starting them (environment,
rendezvous store, ``__main__``) kept; launches that restart their workers use torchrun.

Determinism. Every launched process runs with ``OMP_NUM_THREADS=1`` (``env``), so each local
reduction has one order whatever the machine's core count, and with ``--debug.deterministic``
(``BASE``: ``torch.use_deterministic_algorithms``). fp32 matmuls stay at torch's default
precision ("highest": no TF32 or bf16 down-conversion, so AMX's bf16 units never touch them).
What still differs between CPUs is the kernel level ATen and oneDNN pick at run time (AVX2,
AVX-512, AMX for bf16): it changes the order of the terms inside a sum, never the terms.
``ATEN_CPU_CAPABILITY=avx2`` forces the AVX2 kernels, a cheap way to see another CPU's
arithmetic; the suite must pass both ways (docs/testing.md). An inductor cache must not be
shared between kernel levels: its FX graph cache does not key on the level, and AVX-512
kernels served to an AVX2 run train on NaN (parallel/test_ac_compile.py keeps one per level).

Tolerances come in three classes, each bound derived, not fitted to one machine:
(a) bitwise (``==``): the same kernels on the same inputs in the same order (a resumed run
    against an uninterrupted one, recomputed activations, a checkpoint round trip);
(b) ``FP32_PARITY_TOL``: the same fp32 terms summed in another order (see there);
(c) low precision (bf16, float8): derived in the test file from the format's step size.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from torchtitan_like.launch import TORCHRUN, torchrun_argv, worker_env

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).parent / "parallel" / "worker.py"
RANK_SERVER = Path(__file__).parent / "rank_server.py"

# fp32, deterministic kernels, tiny Llama (4 layers, dim 128, GQA), global batch of 4 x 64 tokens.
BASE = [
    "--model.flavor", "tiny",
    "--training.seq_len", "64",
    "--training.local_batch_size", "2",
    "--training.global_batch_size", "4",
    "--training.steps", "5",
    "--training.mixed_precision_param", "float32",
    "--lr_scheduler.warmup_steps", "2",
    "--optimizer.lr", "3e-3",
    "--metrics.log_freq", "1",
    "--metrics.peak_tflops", "1",
    "--debug.deterministic", "true",
]

FP32_PARITY_TOL = 1e-5
"""Per-step loss bound for fp32 runs that differ only in the order of their sums (class b).

A parallel layout computes the terms of one process but sums them in another order (a matmul
split over ranks, a reduce-scatter instead of a local sum, a ring merging attention blocks),
and the kernel level orders each local sum. Reordering a sum of n random-signed roundings moves
it by ~sqrt(n) eps |terms| (eps = 2^-23 = 1.2e-7): a few ulps of each value. RMS-normalised
blocks do not amplify relative errors, fp32 has no coarse grid to flip across (float8 has),
and Adam turns a relative gradient error d into a weight error lr d = 3e-3 x 1e-6, below the
ulp of weights ~2e-2. So a loss below 16 (ulp <= 9.5e-7) moves by a couple of ulps per step:
5 steps x 2 ulps = 10 ulps = 1e-5. Measured <= 3 ulps (2.9e-6, TP with a tied head, loss ~11)
on AMD EPYC (AVX-512) and Intel Xeon (AMX; default and avx2 kernels); a real error (a lost
reduction, a wrong normalisation, a misplaced shard) moves the loss by >= 1e-3, 100x more.
"""

MUON_PARITY_TOL = 6e-5
"""Per-step loss bound for 10 steps of Muon, its Newton-Schulz iteration in fp32 (``[muon]
ns_dtype = "float32"``), under a layout against one process (class b, plus what the
iteration does with it).

What differs is what differs under AdamW: the gradients' sums, reordered (relative d ~
sqrt(256) eps = 1.9e-6 per element, GRAD_NORM_RTOL). The owner rank iterates each whole matrix
with one process's kernels (components/optim/newton_schulz.py), so the iteration adds no
difference of its own, but it spreads d over the whole update and amplifies it by at most its
largest slope, a^5 = 3.4445^5 = 485 (singular values near 0; tests/unit/test_muon.py measures 26
on the tiny Llama's gradients). A matrix's update has Frobenius norm 0.2 lr sqrt(mn)
(match_rms_adamw), so after t steps the weights differ by at most |dW| <= t 485 d 0.2 lr
sqrt(N_m) (N_m the matrices' elements, lr <= 3e-3). The loss answers through <grad L, dW>, and dW
is the iteration's linear image of rounding noise, unaligned with the gradient: |grad L| |dW| /
sqrt(N) per standard deviation (N >= N_m parameters); at 4 of them, with |grad L| <= 1.6 (logged
on both test models), <= t x 4 x 1.6 x 485 x 1.9e-6 x 0.2 x 3e-3 = t x 3.5e-6. Beside it the
reordered sums of the forward and backward, FP32_PARITY_TOL's 2 ulps (1e-6) per step: at step
10, 2e-5 + 3.5e-5 = 5.5e-5, so 6e-5. Measured: <= 9.5e-7 (FSDP 2, TP 2, PP 2, HSDP 2 x 2,
FSDP 2 x TP 2, EP 2), as AdamW. A real error is far larger: orthogonalizing each rank's own
shard instead of the whole matrix (the per-block approximation) moves the loss by 2.1e-3 at step
2 and 5.6e-2 by step 10 (FSDP 2 and TP 2 alike); owners that received half-gathered matrices
(FSDP's strided shards under FSDP 2 x TP 2 taken for whole) by 1.1e-3 and 3.0e-2.
"""

GRAD_NORM_RTOL = 1e-5
"""Relative bound on the reported gradient norm (class b). Each gradient element sums the
batch's 256 tokens, reordered: ~sqrt(256) eps = 16 eps = 1.9e-6 relative; the norm inherits
about that (measured 2.8e-6 = 23 eps, TP and CP). 1e-5 = 84 eps; a double-counted or missing
gradient shard changes the norm by more than 1e-2.
"""

_WORDS = [
    "the", "model", "data", "token", "layer", "shard", "rank", "mesh", "batch", "step", "loss",
    "grad", "norm", "scale", "tensor", "pipeline", "stage", "context", "ring", "attention",
]


def write_corpus(path: Path, documents: int = 300, seed: int = 0) -> None:
    """JSONL documents of seeded random sentences: learnable (the loss falls) and small."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(documents):
            sentences = [" ".join(rng.choices(_WORDS, k=rng.randint(4, 12))).capitalize() + "."
                         for _ in range(rng.randint(2, 8))]
            f.write(json.dumps({"text": " ".join(sentences)}) + "\n")


def env() -> dict[str, str]:
    """A launch's environment (launch.worker_env). torchrun's rendezvous store stays shared
    with the workers (no port picked free and bound later: distributed/utils.init_distributed)."""
    return worker_env()


def torchrun(nproc: int, *args: str, timeout: int = 600, max_restarts: int | None = None,
             launcher: str = TORCHRUN) -> subprocess.CompletedProcess:
    """Run ``torchrun_argv`` from the repository root with ``env()``, its output captured as
    text."""
    argv = torchrun_argv(nproc, *args, max_restarts=max_restarts, launcher=launcher)
    return subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=timeout)


class _RankServer:
    """The session's rank server (rank_server.py: imports torch and the trainer once, forks
    the ranks of each launch). Started at the first launch, and again when the launches'
    environment changed (the server's own is what torch read at import: rank_server.py);
    ended at exit with any launch still running, and with the test process in any case."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.log = None
        self.buffer = b""
        self.supervisor: int | None = None
        atexit.register(self.close)

    def run(self, nproc: int, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        launch_env = env()
        if self.proc is None or self.proc.poll() is not None or \
                _without_test_name(launch_env) != _without_test_name(self.env):
            self.close()
            self.log = tempfile.TemporaryFile()  # noqa: SIM115 (the server's stderr, its life)
            self.proc = subprocess.Popen([sys.executable, str(RANK_SERVER)], cwd=ROOT,
                                         env=launch_env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self.log)
            self.env, self.buffer = launch_env, b""
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"nproc": nproc, "argv": argv, "env": launch_env, "cwd": str(ROOT),
                       "stdout": str(out), "stderr": str(err)}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            self.supervisor = self._reply(120)["pid"]
            try:
                code = self._reply(timeout)["returncode"]
            except subprocess.TimeoutExpired:
                self._kill_launch()
                self._reply(60)
                raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err)) from None
            finally:
                self.supervisor = None
            return subprocess.CompletedProcess(argv, code, _read(out), _read(err))

    def close(self) -> None:
        """End the server (EOF) and any launch of it still running (a test interrupted)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self._kill_launch()
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _kill_launch(self) -> None:
        if self.supervisor is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.supervisor, signal.SIGKILL)

    def _reply(self, timeout: float) -> dict:
        while b"\n" not in self.buffer:
            if not select.select([self.proc.stdout], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(str(RANK_SERVER), timeout)
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                self.log.seek(0)
                raise RuntimeError(f"the rank server ended (exit code {self.proc.wait()}):\n"
                                   f"{self.log.read()[-4000:].decode(errors='replace')}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


def _without_test_name(environ: dict[str, str]) -> dict[str, str]:
    """An environment but pytest's name of the running test (it changes with every test)."""
    return {k: v for k, v in environ.items() if k != "PYTEST_CURRENT_TEST"}


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


_RANK_SERVER = _RankServer()


def ranks(nproc: int, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """What ``torchrun(nproc, *args)`` does for a test worker (``args``: a script and its
    arguments, or ``-m module ...``), its ranks forked by the rank server instead of started
    by torchrun's agent: the same worker, environment and working directory, seconds less
    per launch (rank_server.py). Output captured as text."""
    return _RANK_SERVER.run(nproc, list(args), timeout)


def job_args(overrides: list[str], dump_folder: Path, corpus: Path) -> list[str]:
    """The trainer's command line for one case: BASE, the corpus, the overrides."""
    data = ["--training.dataset", "local", "--training.dataset_path", str(corpus)]
    return [*BASE, *data, *overrides, "--job.dump_folder", str(dump_folder)]


def build_trainer(overrides: list[str], dump_folder: Path, corpus: Path, device):
    """A Trainer of one case inside the test process (needs a process group of one)."""
    from torchtitan_like.train import Trainer
    from torchtitan_like.validate import parse_args

    return Trainer(parse_args(job_args(overrides, dump_folder, corpus), 1), device)


def run_in_process(argv: list[str], trainer_cls=None) -> int:
    """What ``entry.main`` does (the logger set up, then ``entry.run``: the job from its command
    line to its exit code), without ending the test process; a process group of one. The
    environment, the logger and torch's global settings are restored and the process group
    destroyed afterwards."""
    import torch
    import torch.distributed as dist

    from torchtitan_like import entry
    from torchtitan_like.logging import init_logger, logger

    saved = dict(os.environ)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)
    handlers, propagate, level = logger.handlers[:], logger.propagate, logger.level
    try:
        init_logger()
        return entry.run(argv, *(() if trainer_cls is None else (trainer_cls,)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        torch.use_deterministic_algorithms(False)
        os.environ.clear()
        os.environ.update(saved)
        logger.handlers[:], logger.propagate, logger.level = handlers, propagate, level


def launch(nproc: int, cases: dict[str, list[str]], workdir: Path, corpus: Path,
           timeout: int = 600, max_restarts: int = 0, worker: Path = WORKER
           ) -> dict[str, list[dict]]:
    """Train every case (CLI overrides on top of BASE) in one launch of ``nproc`` processes
    (``ranks``).

    Returns each case's metrics.jsonl records. Raises with the launch's output on failure.
    With ``max_restarts``, a torchrun that restarts the whole worker after a failure (cases
    that finished are retrained, or resumed from their last checkpoint when they save one).
    ``worker`` is the ranks' entry (parallel/worker.py unless a test records more).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    spec = {name: job_args(overrides, workdir / name, corpus) for name, overrides in cases.items()}
    (workdir / "cases.json").write_text(json.dumps(spec))
    if max_restarts:  # torchrun restarts the workers
        proc = torchrun(nproc, str(worker), str(workdir / "cases.json"), timeout=timeout,
                        max_restarts=max_restarts)
    else:
        proc = ranks(nproc, str(worker), str(workdir / "cases.json"), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"launch of {nproc} processes failed:\n{proc.stdout[-4000:]}\n"
                           f"{proc.stderr[-8000:]}")
    return {name: read_metrics(workdir / name) for name in cases}


def launch_layouts(layouts: dict[int, dict[str, list[str]]], root: Path,
                   corpus: Path) -> dict[str, list[dict]]:
    """``launch`` once per world size of ``{nproc: cases}``, into ``root/<nproc>``."""
    results = {}
    for nproc, cases in layouts.items():
        results.update(launch(nproc, cases, root / str(nproc), corpus))
    return results


class OmittedStep:
    """A trainer's data with the microbatches of one step left out (delegates the rest): the
    data of a run that skipped that step (a spike's, a dropped one's)."""

    def __init__(self, loader, step: int, per_step: int):
        self.loader, self.first, self.count = loader, (step - 1) * per_step, per_step

    def __iter__(self):
        for index, batch in enumerate(self.loader):
            if not self.first <= index < self.first + self.count:
                yield batch

    def __getattr__(self, name):
        return getattr(self.loader, name)


def read_metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def losses(records: list[dict]) -> list[float]:
    return [r["loss"] for r in records if "loss" in r]


def assert_close(actual: list[float], expected: list[float], tol: float) -> None:
    assert len(actual) == len(expected), (actual, expected)
    diffs = [abs(a - e) for a, e in zip(actual, expected, strict=True)]
    print(f"max |diff| {max(diffs):.3g} (bound {tol})")  # shown by pytest -rP: the margin
    assert max(diffs) <= tol, f"max |diff| {max(diffs):.3g} > {tol}: {actual} vs {expected}"


def assert_float8_drift(actual: list[float], reference: list[float], fp32: list[float],
                        exact_steps: int = 2) -> None:
    """Class (c) for two low-precision runs of one model under two layouts, ``fp32`` the
    reference's layout in fp32 (derivation: test_float8_fsdp.py, the TP test). Steps
    1..exact_steps: Adam's first update is +-lr whatever the gradients' rounding, so the
    weights, hence the casts, agree and only fp32 sums differ: FP32_PARITY_TOL. Later the
    roundings flip independently, each flip one float8 step, twice the half-step error the
    reference makes against fp32: at most twice the reference's distance from fp32 so far."""
    assert len(actual) == len(reference) == len(fp32)
    if exact_steps:
        assert_close(actual[:exact_steps], reference[:exact_steps], FP32_PARITY_TOL)
    distance, worst = 0.0, 0.0
    for step, (a, b, exact) in enumerate(zip(actual, reference, fp32, strict=True), start=1):
        distance = max(distance, abs(b - exact))
        bound = max(FP32_PARITY_TOL, 2 * distance)
        worst = max(worst, abs(a - b) / bound)
        assert abs(a - b) <= bound, (f"step {step}: |diff| {abs(a - b):.3g} > {bound:.3g}: "
                                     f"{actual} vs {reference} (fp32 {fp32})")
    print(f"largest |diff| / bound {worst:.3g}: {actual} vs {reference} (fp32 {fp32})")
