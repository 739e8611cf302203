"""A full disk under each file the job writes: one ``storage error:`` (or ``checkpoint error:``)
line naming the file, exit code 4 (final: the launcher does not restart it), no traceback.

Each job is the tiny model for 2 steps, run in this process by the trainer's job function
(``train.run``: parse, lock, build, train, report) with the disk made full under one file by
tests/full_disk.py. tests/e2e/test_full_disk.py runs the same on 2 processes through the
launcher; components/storage.py says which errors are final.
"""

import importlib.util

import pytest
from full_disk import install
from harness import job_args, run_in_process

from torchtitan_like.components.storage import StorageError, full_storage, storage_failure
from torchtitan_like.exit_codes import FINAL, ExitCode

FULL = "no space left on the device (the disk is full)"
TWO_STEPS = ["--training.steps", "2", "--validation.enable", "false"]
PATHS = {  # what the disk is full under -> the overrides that write it, the line expected
    "job.lock": ([], "storage error: writing the dump folder's lock record ({dump}/job.lock) "
                     f"failed: {FULL}"),
    "metrics.jsonl": ([], f"storage error: writing metrics.jsonl ({{dump}}/metrics.jsonl) "
                          f"failed: {FULL}"),
    "config.toml": ([], f"storage error: writing the config copy ({{dump}}/config.toml) "
                        f"failed: {FULL}"),
    "tfevents": (["--metrics.enable_tensorboard", "true"],
                 f"storage error: writing TensorBoard events ({{dump}}/tb) failed: {FULL}"),
    "mlruns": (["--metrics.enable_mlflow", "true"],
               "storage error: writing the MLflow run (file://{dump}/mlruns) failed: " + FULL),
    ".distcp": (["--checkpoint.enable", "true"],
                "checkpoint error: step 2: the save failed on rank 0: " + FULL),
    "safetensors": (["--checkpoint.enable", "true", "--checkpoint.last_save_in_hf", "true"],
                    "storage error: writing the HuggingFace export ({dump}/checkpoint/step-2-hf) "
                    "failed: " + FULL),
}


@pytest.mark.parametrize("path", PATHS)
def test_a_full_disk_under_each_written_file_is_one_line_and_exit_4(
        path, corpus, tmp_path, monkeypatch, capfd):
    overrides, expected = PATHS[path]
    if path == "mlruns" and importlib.util.find_spec("mlflow") is None:
        pytest.skip("the mlflow extra is not installed")
    if path == "safetensors" and importlib.util.find_spec("tokenizers") is None:
        pytest.skip("the hf extra is not installed (last_save_in_hf writes tokenizer files)")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    dump = (tmp_path / "job").resolve()
    install(path, patch=monkeypatch.setattr)
    assert run_in_process(job_args([*TWO_STEPS, *overrides], dump, corpus)) == ExitCode.CHECKPOINT
    said = capfd.readouterr().err
    errors = [line for line in said.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, said[-3000:]
    assert errors[0].split(" ", 1)[1].startswith(expected.format(dump=dump)), errors[0]
    assert "Traceback" not in said and "Exception in thread" not in said, said[-3000:]
    assert ExitCode.CHECKPOINT in FINAL  # so the launcher does not restart the job


def test_which_causes_are_final():
    """A full disk, a quota, a read-only file system, a refused permission repeat on a restart;
    a missing file or an I/O error may not. Rust-backed libraries name the error in words."""
    import errno
    import os

    def oserror(number):
        return OSError(number, os.strerror(number), "/x/metrics.jsonl")

    for number in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
        assert isinstance(storage_failure(oserror(number), "metrics.jsonl"), StorageError)
    assert storage_failure(oserror(errno.EIO), "metrics.jsonl") is None
    wrapped = RuntimeError("tracker failed")
    wrapped.__cause__ = oserror(errno.ENOSPC)
    assert "no space left" in str(storage_failure(wrapped, "the MLflow run"))
    rust = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert str(full_storage(rust)) == f"a write failed: {FULL}"
    assert full_storage(oserror(errno.EACCES)) is None  # only a full disk, wherever it strikes
