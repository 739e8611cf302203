"""scripts/ensure_env.sh's install marker: the README's two commands share ./.venv without
reinstalling each other's extras (run_tests.sh needs every extra, run_train.sh only dev).

The script runs on a copy of itself beside a pyproject.toml in a temporary checkout whose
.venv/bin/python is a fake that records its command lines: no pip, no network."""

import os
import re
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_TESTS_EXTRAS = re.search(r'TT_EXTRAS="\$\{TT_EXTRAS:-([^}]*)\}"',
                             (ROOT / "run_tests.sh").read_text()).group(1)
ALL = ",".join(sorted(RUN_TESTS_EXTRAS.split(",")))


def checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/ensure_env.sh").write_text((ROOT / "scripts/ensure_env.sh").read_text())
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    python = tmp_path / ".venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def ensure(root: Path, extras: str | None) -> tuple[list[str], str]:
    """Source the script as the commands do; the pip installs it ran and what it said."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "TT_EXTRAS")}
    if extras is not None:
        env["TT_EXTRAS"] = extras
    calls = root / "calls"
    calls.unlink(missing_ok=True)
    proc = subprocess.run(["bash", "-c", 'source scripts/ensure_env.sh && echo "$PYTHON"'],
                          cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(root / ".venv/bin/python")
    installs = [c for c in calls.read_text().splitlines() if "install -q -e" in c] \
        if calls.exists() else []
    return installs, proc.stderr


def test_run_train_after_run_tests_installs_nothing(tmp_path):
    root = checkout(tmp_path)
    installs, said = ensure(root, RUN_TESTS_EXTRAS)
    assert installs == [f"-m pip install -q -e {root}[{ALL}]"], installs
    assert "no marker of this pyproject.toml" in said  # a .venv without one
    assert ensure(root, None) == ([], "")  # run_train.sh: dev is there
    assert ensure(root, RUN_TESTS_EXTRAS) == ([], "")  # run_tests.sh again


def test_run_tests_after_run_train_adds_the_missing_extras_only_once(tmp_path):
    root = checkout(tmp_path)
    assert ensure(root, None)[0] == [f"-m pip install -q -e {root}[dev]"]
    installs, said = ensure(root, ALL)
    assert installs == [f"-m pip install -q -e {root}[{ALL}]"]
    assert "extras ft,hf,mlflow,parquet,plot,wandb not installed yet" in said, said
    assert ensure(root, None) == ([], "") and ensure(root, ALL) == ([], "")


def test_a_changed_pyproject_reinstalls_every_extra_installed_before(tmp_path):
    root = checkout(tmp_path)
    ensure(root, ALL)
    (root / "pyproject.toml").write_text("[project]\nname = 'y'\n")
    installs, said = ensure(root, None)  # run_train.sh: keeps the tests' extras installed
    assert installs == [f"-m pip install -q -e {root}[{ALL}]"]
    assert "no marker of this pyproject.toml" in said
    assert ensure(root, ALL) == ([], "")
    assert len(list((root / ".venv").glob(".installed-*"))) == 1


def test_a_python_that_does_not_run_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(["bash", "-c", "source scripts/ensure_env.sh"], cwd=ROOT,
                          env={**os.environ, "PYTHON": str(tmp_path / "no/python")},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"config error: PYTHON={tmp_path}/no/python is not an interpreter that can be run; "
        "unset PYTHON to use ./.venv"]
