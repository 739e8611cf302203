"""What the README (and the pages it was split into), the migration guide and the TorchTitan
hints name exists: every path and file, every ``[section] key`` and ``--section.key``, and
every command answers ``--help``.

The texts are parsed, not a list kept beside them: a path is a token under one of the
checkout's top-level folders (or a relative markdown link), a bare file name (``tiny_gpt.py``)
must be the name of a tracked file (names starting with ``my`` are the reader's own files, by
the docs' convention), and a command is ``./run_train.sh`` / ``./run_tests.sh``, a ``ttl-*``
entry point, ``python -m MODULE`` or ``python SCRIPT.py``. The Python commands answer
``--help`` in this process; the two shell scripts in one subprocess each.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import runpy
import subprocess
import sys

import pytest
from harness import ROOT, env

from torchtitan_like.config import torchtitan_keys
from torchtitan_like.config.manager import help_text, sections, tomllib

DOCS = ["README.md", "docs/migrating-from-torchtitan.md", "docs/running.md", "docs/models.md",
        "docs/code-map.md", "docs/proven-layouts.md"]
HINTS = "\n".join([*torchtitan_keys.RENAMED.values(), *torchtitan_keys.UNSUPPORTED.values(),
                   *torchtitan_keys._VALUES.values()])
TOP_LEVEL = sorted({p.split("/")[0] for p in subprocess.run(
    ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    if "/" in p})
TRACKED_NAMES = {p.rsplit("/", 1)[-1] for p in subprocess.run(
    ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()}
WRITTEN_BY_A_RUN = {"config.toml"}  # the merged config a run writes into its dump folder
ENTRY_POINTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _texts() -> dict[str, str]:
    return {**{name: (ROOT / name).read_text() for name in DOCS}, "the TorchTitan hints": HINTS}


def _code(text: str) -> list[str]:
    """Inline code spans and the lines of fenced blocks."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    return [line for block in blocks for line in block.splitlines()] + re.findall(
        r"`([^`\n]+)`", rest)


def _paths(name: str, text: str) -> set[str]:
    """Paths relative to the checkout that ``text`` names."""
    folders = "|".join(map(re.escape, TOP_LEVEL))
    found = {m.rstrip(".,:;") for m in re.findall(
        rf"(?<![\w/.-])(?:\.\./)*((?:{folders})/[\w./-]*[\w/])", text)}
    base = (ROOT / name).parent if name in DOCS else ROOT
    for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not re.match(r"\w+://", link):
            found.add(str((base / link).resolve().relative_to(ROOT)))
    return found


def _bare_names(text: str) -> set[str]:
    names = set()
    for snippet in _code(text):
        for token in re.split(r"[\s,()+=`\"']+", snippet):
            token = token.strip(".:;")
            if re.fullmatch(r"[\w.-]+\.(py|toml|sh|slurm|md)", token) and not token.startswith(
                    "my"):
                names.add(token)
    return names


def _commands(text: str) -> set[tuple[str, str]]:
    """(kind, name) of every command ``text`` names."""
    found = {("shell", m) for m in re.findall(r"(?<![\w/])\.?/?((?:run_train|run_tests)\.sh)",
                                               text)}
    found |= {("entry", m) for m in re.findall(r"(?<![\w-])(ttl-[\w-]+)", text)}
    found |= {("module", m) for m in re.findall(r"python3? -m ([\w.]+)", text)}
    found |= {("script", m) for m in re.findall(r"python3? ((?:[\w.-]+/)*[\w.-]+\.py)\b", text)}
    return found


def _config_keys(text: str) -> set[tuple[str, str]]:
    """``[section] key`` and ``--section.key`` references (``section`` itself is the docs'
    placeholder, as in ``--section.key=value``)."""
    keys = set(re.findall(r"(?<!TorchTitan's )\[(\w+)\] (\w+)", text))
    keys |= set(re.findall(r"--(\w+)\.(\w+)", text))
    return {(s, k) for s, k in keys if s != "section"}


ALL = _texts()


@pytest.mark.parametrize("doc", ALL)
def test_every_path_and_file_named_exists(doc):
    text = ALL[doc]
    missing = sorted(p for p in _paths(doc, text) if not (ROOT / p).exists())
    missing += sorted(n for n in _bare_names(text) if n not in TRACKED_NAMES | WRITTEN_BY_A_RUN)
    assert not missing, f"{doc} names what does not exist: {missing}"


@pytest.mark.parametrize("doc", ["README.md", "docs/running.md", "docs/models.md",
                                 "the TorchTitan hints"])
def test_every_config_key_named_exists(doc):
    known = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in sections().items()}
    unknown = sorted(f"[{s}] {k}" for s, k in _config_keys(ALL[doc])
                     if s not in known or k not in known[s])
    assert not unknown, f"{doc} names config keys that do not exist: {unknown}"
    flags = set(re.findall(r"(?<![\w.-])(--[a-z_]+)\b(?!\.)", ALL[doc])) & {
        "--print_config", "--help"}
    assert all(flag in help_text() for flag in flags)


def test_no_hint_is_for_a_key_that_exists_here():
    """A hint shows only for an unknown key: one for a real key (EP's once) is never seen."""
    known = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in sections().items()}
    real = [name for name in [*torchtitan_keys.RENAMED, *torchtitan_keys.UNSUPPORTED]
            if (parts := name.split("."))[0] in known
            and (len(parts) == 1 or parts[1] in known[parts[0]])]
    assert not real, f"hints for keys that exist: {real}"


def _answers_help(kind: str, name: str) -> None:
    saved = sys.argv
    sys.argv = [name, "--help"]
    try:
        with pytest.raises(SystemExit) as exit_:
            if kind == "module":
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            elif kind == "script":
                runpy.run_path(str(ROOT / name), run_name="__main__")
            else:
                module, function = ENTRY_POINTS[name].split(":")
                getattr(importlib.import_module(module), function)(["--help"])
    finally:
        sys.argv = saved
    assert exit_.value.code in (0, None), f"{kind} {name} --help exited {exit_.value.code}"


COMMANDS = sorted({c for text in ALL.values() for c in _commands(text)})


@pytest.mark.parametrize(("kind", "name"), COMMANDS)
def test_every_command_named_answers_help(kind, name, capsys, monkeypatch):
    from torchtitan_like.distributed import lifecycle

    # The trainer's main ends its process (os._exit, distributed/lifecycle.py): here it raises.
    monkeypatch.setattr(lifecycle, "exit_process", lambda code: sys.exit(code))
    if kind == "shell":
        proc = subprocess.run([str(ROOT / name), "--help"], cwd=ROOT, capture_output=True,
                              text=True, env={**env(), "PYTHON": sys.executable}, timeout=300)
        assert proc.returncode == 0 and "usage" in proc.stdout.lower(), proc.stderr[-2000:]
        return
    if kind == "entry":
        assert name in ENTRY_POINTS, f"{name} is not an entry point of pyproject.toml"
    _answers_help(kind, name)
    assert "usage" in capsys.readouterr().out.lower()


def test_every_shipped_config_and_model_is_in_the_readme():
    readme = ALL["README.md"]
    configs = [str(p.relative_to(ROOT / "train_configs"))
               for p in sorted((ROOT / "train_configs").rglob("*.toml"))]
    assert not [c for c in configs if f"`{c}`" not in readme], "shipped configs missing"
    built_in = subprocess.run(  # a fresh process: not the models other tests registered here
        [sys.executable, "-c", "from torchtitan_like.models.registry import registered_models;"
         " print(*(m.name for m in registered_models()))"],
        cwd=ROOT, env=env(), capture_output=True, text=True, check=True).stdout.split()
    assert len(built_in) >= 3 and not [m for m in built_in if f"`{m}`" not in readme]


def test_the_parsers_find_what_they_look_for():
    """A guard against a parser that silently finds nothing."""
    readme, running = ALL["README.md"], ALL["docs/running.md"]
    assert {"train_configs/debug_model.toml", "docs/design.md"} <= _paths("README.md", readme)
    assert {("shell", "run_train.sh"), ("shell", "run_tests.sh")} <= _commands(readme)
    assert {("entry", "ttl-plan"), ("module", "torchtitan_like.train")} <= _commands(running)
    assert "debug_model.toml" in _bare_names(readme)
    assert ("training", "steps") in _config_keys(readme)


DIMENSIONS = ("converters", "PP", "TP", "loss parallel", "EP", "AC", "compile", "FSDP", "CP")


def _dimension_table() -> str:
    text = (ROOT / "docs/design.md").read_text()
    return text.split("## Where each dimension is applied", 1)[1].split("\n## ", 1)[0]


def test_design_dimension_table_names_real_functions():
    """Every ``file.py: name`` of docs/design.md's dimension table imports, and every parallel
    dimension has a row."""
    table = _dimension_table()
    cells = [line.split("|")[2].strip() for line in table.splitlines()
             if line.startswith("| ") and "---" not in line]
    missing = [dim for dim in DIMENSIONS if not any(cell.startswith(dim) for cell in cells)]
    assert not missing, f"dimensions without a row: {missing}"
    named = re.findall(r"`([\w/]+)\.py: ([\w.]+)`", table)
    assert len(named) >= len(DIMENSIONS)
    for path, name in named:
        target: object = importlib.import_module("torchtitan_like." + path.replace("/", "."))
        for part in name.split("."):
            target = getattr(target, part)
        assert callable(target), f"{path}.py: {name}"


def test_design_dimension_table_names_one_file_per_dimension():
    """Each dimension is applied for every model in one place: a row's "applied by" names the
    functions of one file (what they use is listed under the table)."""
    rows = [line.split("|") for line in _dimension_table().splitlines()
            if line.startswith("| ") and "---" not in line][1:]
    spread = {row[2].strip(): files for row in rows
              if len(files := set(re.findall(r"`([\w/]+\.py): [\w.]+`", row[3]))) != 1}
    assert not spread, f"rows whose 'applied by' does not name exactly one file: {spread}"
