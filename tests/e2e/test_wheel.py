"""The package works as an installed wheel, from any directory, without a checkout.

The wheel is built from a copy of the sources (so the checkout gains no build folders) and
installed into a fresh virtual environment. That environment reuses this one's dependencies
(torch, torchao, ...) through a ``.pth`` line naming this environment's site-packages, written
after the install so that pip never sees (or touches) this environment's own copy of the
package; a directory named in a ``.pth`` file is only appended to ``sys.path``, its own ``.pth``
files (the editable install's finder) do not run, so the wheel's copy is the one imported. The
console entry points then run from an empty directory with no PYTHONPATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import torch
from harness import ROOT


def _run(args: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _build_wheel(tmp: Path) -> Path:
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "torchtitan_like", source / "torchtitan_like",
                    ignore=shutil.ignore_patterns("__pycache__"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "--no-index", "-w", str(tmp / "dist"), str(source)], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("torchtitan_like-*.whl")
    return wheel


def _fresh_env(tmp: Path, wheel: Path) -> Path:
    """A venv holding only the wheel, then given this environment's dependencies."""
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
          "--no-index", str(wheel)], cwd=tmp)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     cwd=tmp).strip())
    (site / "_reuse_dependencies.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    return env_dir


def test_wheel_installs_and_runs_both_tools_from_another_directory(tmp_path: Path):
    env_dir = _fresh_env(tmp_path, _build_wheel(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bin_dir = env_dir / "bin"

    where = _run([str(bin_dir / "python"), "-c",
                  "import torchtitan_like; print(torchtitan_like.__file__)"], cwd=elsewhere)
    assert Path(where.strip()).is_relative_to(env_dir), where

    assert "--num_gpus" in _run([str(bin_dir / "ttl-plan"), "--help"], cwd=elsewhere)
    plan = _run([str(bin_dir / "ttl-plan"), "--flavor", "8B", "--gpu", "H100",
                 "--num_gpus", "8"], cwd=elsewhere)
    assert "Model: llama3 8B" in plan and "Verdict: FITS" in plan

    assert "usage: ttl-ablate" in _run([str(bin_dir / "ttl-ablate"), "--help"], cwd=elsewhere)
    shutil.copy(ROOT / "train_configs/debug_model.toml", elsewhere / "base.toml")
    (elsewhere / "sweep.toml").write_text(
        '[sweep]\nbase_config = "base.toml"\nnproc = 2\n'
        '[[variants]]\nname = "FSDP 2"\n[[variants]]\nname = "TP 2"\n'
        'overrides = ["--parallelism.tensor_parallel_degree=2"]\n')
    dry = _run([str(bin_dir / "ttl-ablate"), "sweep.toml", "--dry_run"], cwd=elsewhere)
    lines = dry.strip().splitlines()
    assert len(lines) == 2 and lines[1].endswith("--parallelism.tensor_parallel_degree=2")
    launcher = f"{bin_dir / 'python'} -m torchtitan_like.launch --standalone --nproc_per_node=2"
    assert all(line.startswith(launcher) for line in lines), dry
    assert all(f"-m torchtitan_like.train --job.config_file {elsewhere / 'base.toml'}" in line
               for line in lines), dry
