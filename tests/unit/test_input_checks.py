"""Every bad input a new user might give is refused before it costs anything: in-process
``python -m torchtitan_like.preflight`` (what run_train.sh runs before torchrun) exits 2 with
one ``config error:`` line, and an earlier run's metrics.jsonl and checkpoint folder are
byte-identical afterwards. One case per (bad input, expected line): prepared datasets against
their manifest, local data, the paths a job writes, model hyper-parameters, the config loader.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from torchtitan_like import preflight
from torchtitan_like.components.data.prepare import prepare

EARLIER_RUN = json.dumps({"step": 2, "loss": 1.0}) + "\n"
DOCUMENTS = [f"document {i}: " + "some text " * (i % 5 + 1) for i in range(12)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A prepared folder (byte tokenizer, every 3rd document held out) each case copies."""
    root = tmp_path_factory.mktemp("prepared")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCUMENTS))
    prepare([corpus], "", root / "web", holdout_every=3, workers=1, progress=None)
    return root / "web"


@pytest.fixture
def job(tmp_path) -> Path:
    """The dump folder of an earlier run: its metrics and a (fake) checkpoint."""
    dump = tmp_path / "job"
    (dump / "checkpoint" / "step-2").mkdir(parents=True)
    (dump / "metrics.jsonl").write_text(EARLIER_RUN)
    (dump / "checkpoint" / "step-2" / "checkpoint.json").write_text('{"step": 2}')
    return dump


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(folder.rglob("*"))}


def tokenized(folder: Path, *more: str) -> list[str]:
    return ["--training.dataset=tokenized", f"--training.dataset_path={folder}",
            "--training.holdout_every=3", *more]


def local(path: Path, *more: str) -> list[str]:
    return ["--training.dataset=local", f"--training.dataset_path={path}", *more]


def damaged(prepared: Path, tmp: Path, damage: Callable[[Path], None]) -> Path:
    folder = tmp / "data" / "web"
    shutil.copytree(prepared, folder)
    damage(folder)
    return folder


def _edit_manifest(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        manifest = json.loads((folder / "manifest.json").read_text())
        edit(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return damage


def _truncate(folder: Path) -> None:
    data = (folder / "train.bin").read_bytes()
    (folder / "train.bin").write_bytes(data[: len(data) // 2])


def _id_beyond_vocab(folder: Path) -> None:
    ids = np.fromfile(folder / "train.bin", dtype=np.uint16)
    ids[5] = 300  # the byte tokenizer has 258 ids
    ids.tofile(folder / "train.bin")


def _bad_index(folder: Path) -> None:
    index = np.load(folder / "train.idx.npy")
    index[1], index[2] = index[2], index[1]
    np.save(folder / "train.idx.npy", index)


PREPARED_CASES = {
    "truncated train.bin": (_truncate, [], "train.bin is"),
    "missing train.bin": (lambda f: (f / "train.bin").unlink(), [], "train.bin is missing"),
    "manifest without splits": (_edit_manifest(lambda m: m.pop("splits")), [],
                                "is not a complete manifest (no 'splits.train.documents'"),
    "manifest cut short": (lambda f: (f / "manifest.json").write_text('{"format": 1, "to'), [],
                           "is unreadable or cut short"),
    "id beyond the vocabulary": (_id_beyond_vocab, [],
                                 "id 300 at offset 5 is beyond the vocabulary of 258 tokens"),
    "recorded id beyond the vocabulary": (
        _edit_manifest(lambda m: m["splits"]["train"].update(max_id=1000)), [],
        "its manifest records ids up to 1000, beyond the vocabulary of 258 tokens"),
    "decreasing document index": (_bad_index, [], "the document index decreases somewhere"),
    "empty held-out split": (
        _edit_manifest(lambda m: m["splits"]["validation"].update(documents=0, tokens=0)),
        ["--validation.enable"], "[validation] enable: the held-out split of"),
}


@pytest.mark.parametrize("name", PREPARED_CASES)
def test_a_prepared_dataset_is_checked_against_its_manifest(name, prepared, job, tmp_path,
                                                            capsys):
    damage, more, expected = PREPARED_CASES[name]
    folder = damaged(prepared, tmp_path, damage)
    assert_refused(tokenized(folder, *more), expected, job, capsys)


def test_an_intact_prepared_dataset_passes(prepared, tmp_path):
    assert preflight.main(tokenized(prepared, "--validation.enable",
                                    f"--job.dump_folder={tmp_path / 'fresh'}")) == 0


FILES: dict[str, bytes] = {
    "base.toml": b"[training]\nstepz = 3\n",
    "child.toml": b"extends = 'base.toml'\n[training]\nsteps = 3\n",
    "extends_number.toml": b"extends = 5\n",
    "extends_mixed.toml": b"extends = [1, 'x.toml']\n",
    "broken.toml": b"[training\nsteps = 3\n",
    "huge_steps.toml": b"[training]\nsteps = 100000000000000000000000\n",
    "mixture_table.toml": b"[training]\nmixture = 5\n",
    "latin1.toml": b"[job]\ndescription = 'caf\xe9'\n",
    "exits.py": b"import sys\nsys.exit(0)\n",
    "hard_exit.py": b"import os\nos._exit(0)\n",
    "a_file": b"x",
    "docs/bad.txt": b"fine\nbad \xe9 byte\n",
    "bad.jsonl": json.dumps({"text": "ok"}).encode() + b"\n\xff\n",
}
"""The inputs the cases below name, written under each test's tmp_path."""


def _cases(tmp: Path, prepared: Path, job: Path) -> dict[str, tuple[list[str], str]]:
    """(arguments, the expected part of the one line) of every case but the prepared ones."""
    base, a_file, latin1 = tmp / "base.toml", tmp / "a_file", tmp / "latin1.toml"
    module_exit, hard_exit = tmp / "exits.py", tmp / "hard_exit.py"
    txt, jsonl = tmp / "docs/bad.txt", tmp / "bad.jsonl"
    toml = {name: tmp / f"{name}.toml" for name in (
        "extends_number", "extends_mixed", "child", "broken", "huge_steps", "mixture_table")}
    ckpt = ["--checkpoint.enable"]
    return {
        # local data
        "txt not UTF-8": (local(txt), "bad.txt:2: byte 0xe9 at column 5 is not UTF-8"),
        "jsonl not UTF-8 in line 2": (local(jsonl, "--validation.enable",
                                            "--training.holdout_every=2"),
                                      "bad.jsonl:2: byte 0xff at column 1 is not UTF-8"),
        "mixture source outside dataset_path": (
            tokenized(prepared.parent, "--training.mixture=../web=1"),
            "source name '../web' must be the name of a folder directly under"),
        "mixture weight inf": (tokenized(prepared.parent, "--training.mixture=a=inf,b=1"),
                               "[training] mixture = {'a': inf, 'b': 1.0}: must be a finite"),
        "mixture not a table": ([f"--job.config_file={toml['mixture_table']}"],
                                "got 5, expected dict[str, float]"),
        # outputs
        "dump folder is a file": ([f"--job.dump_folder={a_file}"],
                                  f"[job] dump_folder: {a_file} is a file, not a folder"),
        "dump folder below a file": ([f"--job.dump_folder={a_file}/run"],
                                     f"{a_file} is a file, not a folder, so"),
        "checkpoint folder is metrics.jsonl": (
            [*ckpt, "--checkpoint.folder=metrics.jsonl"],
            f"[checkpoint] folder: {job / 'metrics.jsonl'} is a file, not a folder"),
        "checkpoint folder is the dump folder": (
            [*ckpt, "--checkpoint.folder=."], "lies inside [checkpoint] folder"),
        "tensorboard inside the checkpoints": (
            [*ckpt, "--metrics.enable_tensorboard", "--metrics.save_tb_folder=checkpoint/tb"],
            "[metrics] save_tb_folder (" + str(job / "checkpoint/tb") + ") lies inside "
            "[checkpoint] folder"),
        "tensorboard is the checkpoint folder": (
            [*ckpt, "--metrics.enable_tensorboard", "--metrics.save_tb_folder=checkpoint"],
            "are the same path"),
        # model hyper-parameters, flavors and overrides alike
        **{f"llama3 {o}": ([f"--model.overrides.{o}"], f"[model] flavor debugmodel: {m}")
           for o, m in [("n_heads=0", "n_heads = 0: must be > 0"),
                        ("dim=-4", "dim = -4: must be > 0"),
                        ("n_kv_heads=0", "n_kv_heads = 0: must be > 0"),
                        ("n_layers=0", "n_layers = 0: must be > 0"),
                        ("multiple_of=0", "multiple_of = 0: must be > 0"),
                        ("ffn_dim_multiplier=-1", "ffn_dim_multiplier = -1.0: must be > 0"),
                        ("norm_eps=nan", "norm_eps = nan: must be a finite number"),
                        ("rope_theta=-1", "rope_theta = -1.0: must be > 0"),
                        ("n_kv_heads=5", "n_heads 16 must be a multiple of n_kv_heads 5")]},
        "qwen3 head_dim=0": (["--model.name=qwen3", "--model.overrides.head_dim=0"],
                             "head_dim = 0: must be > 0"),
        "deepseek kv_lora_rank=0": (["--model.name=deepseek_v3",
                                     "--model.overrides.kv_lora_rank=0"],
                                    "kv_lora_rank = 0: must be > 0"),
        "moe route_scale=0": (["--model.name=deepseek_v3",
                               "--model.overrides.moe.route_scale=0"],
                              "route_scale = 0.0 must be a finite number > 0"),
        # the config loader
        "extends a number": ([f"--job.config_file={toml['extends_number']}"],
                             "extends = 5: expected a file name or a list of file names"),
        "extends a mixed list": ([f"--job.config_file={toml['extends_mixed']}"],
                                 "extends = [1, 'x.toml']: expected a file name"),
        "unknown key of an extended base": ([f"--job.config_file={toml['child']}"],
                                            f"unknown key 'stepz' in section [training] ({base})"),
        "TOML not UTF-8": ([f"--job.config_file={latin1}"],
                           f"{latin1}:2: byte 0xe9 is not UTF-8"),
        "TOML syntax": ([f"--job.config_file={toml['broken']}"], "is not valid TOML"),
        "steps beyond 64 bits": ([f"--job.config_file={toml['huge_steps']}"],
                                 "must fit in a 64-bit integer"),
        "steps beyond any run": (["--training.steps=10000000000"],
                                 "steps = 10000000000: must be >= 1 and <= 1000000000"),
        "custom_import calls sys.exit": ([f"--job.custom_import={module_exit}"],
                                         "called sys.exit(0) while being imported"),
        "custom_import calls os._exit": ([f"--job.custom_import={hard_exit}"],
                                         "called os._exit(0) while being imported"),
    }


CASE_NAMES = list(_cases(Path("/x"), Path("/x/web"), Path("/x/job")))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_bad_input_is_one_line_and_touches_nothing(name, prepared, job, tmp_path, capsys):
    for relative, data in FILES.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(data)
    argv, expected = _cases(tmp_path, prepared, job)[name]
    assert_refused(argv, expected, job, capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_dump_folder_is_refused(job, capsys):
    job.chmod(0o555)
    try:
        assert_refused([], "is not writable by this user", job, capsys)
    finally:
        job.chmod(0o755)


def assert_refused(argv: list[str], expected: str, job: Path, capsys) -> None:
    """Exit code 2, one line (the timestamp, then ``config error: ...expected...``), and the
    earlier run's files as they were."""
    before = tree(job)
    dump = [] if any(a.startswith("--job.dump_folder") for a in argv) else [
        f"--job.dump_folder={job}"]
    assert preflight.main([*argv, *dump]) == 2
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert len(lines) == 1, lines
    assert " config error: " in lines[0] and expected in lines[0], lines[0]
    assert tree(job) == before
