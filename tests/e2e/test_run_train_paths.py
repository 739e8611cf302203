"""run_train.sh from another directory: relative paths on the command line, in environment
variables and inside the TOML mean paths from there (scripts/user_paths.sh,
torchtitan_like/config/paths.py), the file of ``--job.trainer`` too, and the log prints them
absolute."""

import json
import shutil
import subprocess
import sys

from harness import ROOT, env, read_metrics


def test_relative_paths_resolve_against_the_users_directory(tmp_path, corpus):
    (tmp_path / "models").mkdir()
    shutil.copy(ROOT / "tests/parallel/zloss_llama.py", tmp_path / "models/zloss.py")
    shutil.copy(ROOT / "tests/plugins/custom_trainer.py", tmp_path / "models/my_train.py")
    shutil.copy(corpus, tmp_path / "corpus.jsonl")
    (tmp_path / "job.toml").write_text(
        '[model]\nname = "llama3_zloss"\nflavor = "tiny"\n\n'
        '[training]\nsteps = 2\nseq_len = 32\nlocal_batch_size = 2\n'
        'dataset = "local"\ndataset_path = "corpus.jsonl"\n\n'
        '[validation]\nenable = false\n\n[metrics]\npeak_tflops = 1.0\n')
    proc = subprocess.run(
        [str(ROOT / "run_train.sh"), "--job.dump_folder=out",
         "--job.custom_import", "models/zloss.py",  # dataset_path: the TOML's, relative
         "--job.trainer=models/my_train.py:CountingTrainer"],
        cwd=tmp_path, env={**env(), "CONFIG_FILE": "job.toml", "NPROC": "1",
                           "PYTHON": sys.executable},
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = read_metrics(tmp_path / "out")
    assert [r["step"] for r in records] == [1, 2]
    assert "aux_loss/z" in records[0]  # the model file given relative to this directory
    assert json.loads((tmp_path / "out/trainer.json").read_text())["class"] == "CountingTrainer"
    assert not (ROOT / "out").exists()
    log = proc.stdout + proc.stderr
    assert f"data: {tmp_path / 'corpus.jsonl'} (1 file(s)" in log, log[-3000:]
    assert f"writing to {tmp_path / 'out'}" in log
