"""Failures a restart would meet again, on 2 processes through the launcher with
``--max-restarts=2``: each ends with one line, the launcher's repeat of the failing rank's line
last (after rank 0's own, when the launcher did not stop it first: ``assert_one_final_line``),
exit code 4, no restart, no traceback and none of torch's banners.

- A full disk (tests/full_disk.py, installed in the workers by ``[job] custom_import``) under
  each file the job writes: the dump folder's lock record, metrics.jsonl (at step 4, while the
  async save of step 4 is in flight: the case that used to die with an OSError traceback and
  restart twice into job.lock), the config copy, TensorBoard's events, MLflow's file store,
  rank 1's checkpoint file, and the HuggingFace export of the last save.
- Bit rot: one flipped bit inside a stored weight of a ``.distcp`` file (resume), and inside a
  tensor of a HuggingFace ``model.safetensors`` (``initial_load_in_hf``): one line naming the
  step or folder, the file and the damaged bytes. The fallback that ``[checkpoint]
  fallback_on_damage`` allows is in test_resume.py (it joins that file's launch).

One launch per job: a job that fails ends its launch. Tiny model, 4 steps at most.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import torch
from harness import ROOT, env, job_args, torchrun_argv

FULL = "no space left on the device (the disk is full)"
TINY = ["--training.steps", "4", "--validation.enable", "false",
        f"--job.custom_import={ROOT / 'tests' / 'full_disk.py'}"]
ASYNC = ["--checkpoint.enable", "true", "--checkpoint.interval", "2",
         "--checkpoint.async_mode", "async"]
CASES = {  # name -> (TTL_FULL_DISK, its rank or "", overrides, the line's start)
    "lock": ("job.lock", "", [], "storage error: writing the dump folder's lock record"),
    "metrics": ("metrics.jsonl:3", "", ASYNC, f"storage error: writing metrics.jsonl ({{dump}}/"
                                              f"metrics.jsonl) failed: {FULL}"),
    "config": ("config.toml", "", [], "storage error: writing the config copy"),
    "tensorboard": ("tfevents", "", ["--metrics.enable_tensorboard", "true"],
                    "storage error: writing TensorBoard events"),
    "mlflow": ("mlruns", "", ["--metrics.enable_mlflow", "true"],
               "storage error: writing the MLflow run"),
    "checkpoint": (".distcp", "1", ["--checkpoint.enable", "true", "--checkpoint.interval", "2"],
                   f"checkpoint error: step 2: the save failed on rank 1: {FULL}"),
    "hf_export": ("safetensors", "", ["--checkpoint.enable", "true",
                                      "--checkpoint.last_save_in_hf", "true"],
                  "storage error: writing the HuggingFace export"),
}
NEEDS = {"mlflow": "mlflow", "hf_export": "tokenizers"}


def launch(dump: Path, corpus: Path, overrides: list[str], extra_env: dict[str, str]
           ) -> tuple[int, str]:
    argv = torchrun_argv(2, "--local-ranks-filter=0", "--role=rank", "--tee=3", "-m",
                         "torchtitan_like.train", *job_args(overrides, dump, corpus),
                         max_restarts=2, launcher="torchtitan_like.launch")
    proc = subprocess.run(argv, cwd=ROOT, env={**env(), "MLFLOW_ALLOW_FILE_STORE": "true",
                                               **extra_env},
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def assert_one_final_line(code: int, out: str, start: str) -> str:
    """Exit code 4, not restarted, no traceback or banner; the shown rank's line, then the
    launcher's repeat of it last. Returns the line.

    The console shows rank 0 (``--local-ranks-filter=0``). When the launcher names rank 0, its
    line was logged before its record was written, so both lines are there. When it names rank
    1 (a save or load failure that DCP gathers to every rank: rank 0 raises the same error a
    moment later), the launcher stops rank 0 as soon as rank 1 exits, which may be before rank
    0 logged: then the launcher's line is the only one, and still says it all."""
    assert code == 4, out[-4000:]
    for noise in ("Traceback", "restarting", "exitcode", "OMP_NUM_THREADS", "closing signal",
                  "unexpected pos", "Exception in thread"):
        assert noise not in out, (noise, out[-4000:])
    errors = [line for line in out.splitlines() if " error: " in f" {line}"]
    assert errors, out[-4000:]
    *logged, last = errors
    assert out.rstrip().endswith(last), out[-2000:]
    assert last.startswith(start), last
    assert last.endswith("exit code 4; not restarted: a restart would fail the same way)"), last
    names_rank_0 = " (rank 0, exit code" in last
    assert (len(logged) == 1) if names_rank_0 else (len(logged) <= 1), out[-4000:]
    for line in logged:
        assert line.split(" ", 1)[1] == last.rsplit(" (rank ", 1)[0], (line, last)
    return last


@pytest.mark.parametrize("case", CASES)
def test_a_full_disk_under_each_write_is_one_final_line(case, corpus, tmp_path):
    pattern, rank, overrides, start = CASES[case]
    if case in NEEDS and importlib.util.find_spec(NEEDS[case]) is None:
        pytest.skip(f"the {NEEDS[case]} package is not installed")
    dump = tmp_path / case
    code, out = launch(dump, corpus, [*TINY, *overrides],
                       {"TTL_FULL_DISK": pattern, "TTL_FULL_DISK_RANK": rank})
    assert_one_final_line(code, out, start.format(dump=dump))
    if case == "metrics":  # the save in flight did not make a checkpoint of step 4
        assert sorted(p.name for p in (dump / "checkpoint").iterdir()) == [
            "step-2", "step-4.partial"]


def flip_bit(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(data)


def test_bit_rot_in_a_distcp_file_or_a_safetensors_file_is_one_final_line(corpus, tmp_path):
    from torchtitan_like.components.hf_checkpoint import save_hf
    from torchtitan_like.models.llama3 import Transformer, llama3_flavors
    from torchtitan_like.models.llama3.hf_adapter import Llama3HFAdapter

    dump, ckpt = tmp_path / "job", ["--checkpoint.enable", "true", "--checkpoint.interval", "2"]
    code, out = launch(dump, corpus, [*TINY, *ckpt, "--training.steps", "2"], {})
    assert code == 0, out[-3000:]
    step = dump / "checkpoint" / "step-2"
    items = json.loads((step / "checksums.json").read_text())["items"]["__1_0.distcp"]
    offset, length = next((o, n) for o, n, _, name in items if name.startswith("model.layers.1"))
    flip_bit(step / "__1_0.distcp", offset + length // 2)
    code, out = launch(dump, corpus, [*TINY, *ckpt], {})
    line = assert_one_final_line(code, out, f"checkpoint error: step 2 ({step}) is damaged: "
                                            f"__1_0.distcp bytes {offset}-{offset + length} "
                                            "(model.layers.1.")
    assert "fallback_on_damage = true" in line and "found by rank 1" in line

    hf = tmp_path / "hf"
    adapter = Llama3HFAdapter(llama3_flavors["tiny"])
    save_hf(Transformer(llama3_flavors["tiny"]).state_dict(), adapter, hf, dtype=torch.float32)
    flip_bit(hf / "model.safetensors", (hf / "model.safetensors").stat().st_size // 2)
    code, out = launch(tmp_path / "from_hf", corpus, [
        *TINY, "--checkpoint.initial_load_path", str(hf), "--checkpoint.initial_load_in_hf",
        "true"], {})
    assert_one_final_line(code, out, f"checkpoint error: HuggingFace weights {hf} are damaged: "
                                     "model.safetensors bytes ")
