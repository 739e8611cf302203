"""Turn a TOML file plus ``--section.key=value`` overrides into a validated ``JobConfig``.

Precedence, lowest first: dataclass defaults, the base files a TOML ``extends``, the TOML
itself, then the command line. Every mistake becomes one ``ConfigError`` that names the
section, key, value and what was expected, before any process group or model exists.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import itertools
import json
import os
import sys
import traceback
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from torchtitan_like.config.custom_sections import custom_sections, new_job_config
from torchtitan_like.config.errors import ConfigError, did_you_mean
from torchtitan_like.config.job_config import JobConfig
from torchtitan_like.config.paths import launch_dir, resolve_paths, user_imports, user_path
from torchtitan_like.config.ranges import out_of_range
from torchtitan_like.config.switches import PARENTS
from torchtitan_like.config.torchtitan_keys import torchtitan_hint, value_hint

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

EXTENDS_KEY = "extends"
"""Top-level TOML key naming the base file(s) a config builds on (paths relative to it)."""

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def sections() -> dict[str, type]:
    """Section name -> dataclass type, in declaration order, then the registered ones
    (config/custom_sections.py)."""
    hints = typing.get_type_hints(JobConfig)
    return {**{f.name: hints[f.name] for f in dataclasses.fields(JobConfig)},
            **custom_sections()}


@functools.cache
def field_docs(section_cls: type) -> dict[str, str]:
    """The docstring written under each field of a section dataclass."""
    tree = ast.parse(inspect.getsource(section_cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for stmt, nxt in itertools.pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return f"list[{type_name(typing.get_args(tp)[0])}]"
    if typing.get_origin(tp) is dict:
        value_tp = typing.get_args(tp)[1]
        return "table" if value_tp is Any else f"dict[str, {type_name(value_tp)}]"
    return tp.__name__


def _coerce(value: Any, tp: Any, where: str, from_cli: bool) -> Any:
    """Convert a TOML value (or a CLI string) to the field's type, or explain why not."""

    def fail() -> typing.NoReturn:
        raise ConfigError(f"{where}: got {value!r}, expected {type_name(tp)}")

    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(
                f"{where}: got {value!r}, expected one of {', '.join(map(repr, choices))}"
                + did_you_mean(str(value), map(str, choices))
            )
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if from_cli and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            fail()
        return [_coerce(v, item_tp, where, from_cli) for v in value]
    if origin is dict:  # a TOML inline table, or name=value,name=value on the command line
        _, value_tp = typing.get_args(tp)
        if from_cli and isinstance(value, str):
            pairs = [item.partition("=") for item in value.split(",") if item.strip()]
            if any(not eq for _, eq, _ in pairs):
                fail()
            value = {k.strip(): v.strip() for k, _, v in pairs}
        if not isinstance(value, dict):
            fail()
        if value_tp is Any:  # values checked by their consumer, e.g. [model] overrides
            return {str(k): v for k, v in value.items()}
        return {str(k): _coerce(v, value_tp, where, from_cli) for k, v in value.items()}
    if from_cli and isinstance(value, str) and tp is not str:
        text = value.strip().lower()
        if tp is bool:
            if text not in _TRUE | _FALSE:
                fail()
            return text in _TRUE
        try:
            return tp(text)
        except ValueError:
            fail()
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        fail()
    return value


def _read_toml(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """One TOML file parsed; every way it can fail is one ConfigError naming the file."""
    if not path.is_file():
        origin = f" (extended by {chain[-1]})" if chain else ""
        raise ConfigError(f"config file not found: {path}{origin}")
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: byte {raw[e.start]:#04x} is not UTF-8 (TOML files "
                          "are UTF-8 text)") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from None


def _toml_layers(path: Path, chain: tuple[Path, ...] = ()) -> list[tuple[str, dict[str, Any]]]:
    """A TOML file as override layers, lowest precedence first: the files it ``extends`` (in
    order, recursively), then itself; each layer keeps its own file's name, so a problem is
    reported against the file that holds it."""
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise ConfigError(f"config files extend each other in a cycle: {cycle}")
    data = _read_toml(path, chain)
    bases = data.pop(EXTENDS_KEY, [])
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(b, str) and b.strip() for b in bases):
        raise ConfigError(f"{path}: {EXTENDS_KEY} = {bases!r}: expected a file name or a list "
                          "of file names (relative to this file)")
    layers: list[tuple[str, dict[str, Any]]] = []
    for base in bases:
        layers += _toml_layers(path.parent / base, (*chain, path))
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(
                f"{path}: top-level key '{section}' is not a [section]; only '{EXTENDS_KEY}' "
                "may stand outside one"
            )
    layers.append((str(path), data))
    return layers


def _split_cli(argv: list[str]) -> list[tuple[str, str | None]]:
    """``--a.b=v``, ``--a.b v`` and bare boolean ``--a.b`` -> [(a.b, v or None)]."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}: overrides are --section.key=value")
        key, eq, value = arg[2:].partition("=")
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and not nxt.startswith("--"):
                value, i = nxt, i + 1
            else:
                value = None  # type: ignore[assignment]
        pairs.append((key, value))
        i += 1
    return pairs


def _unknown_section(section: str, values: dict[str, Any], origin: str,
                     known: typing.Iterable[str]) -> list[str]:
    """The problems of a section we do not have: a TorchTitan hint for it or its keys, else
    the closest section name."""
    if hint := torchtitan_hint(section):
        return [f"unknown config section [{section}] in {origin}: {hint}"]
    key_hints = [(key, torchtitan_hint(section, key)) for key in values]
    if any(hint for _, hint in key_hints):
        return [f"[{section}] {key} ({origin}): {hint or 'not a key here'}"
                for key, hint in key_hints]
    return [f"unknown config section [{section}] in {origin}{did_you_mean(section, known)}"]


def _unknown_key(section: str, key: str, origin: str, keys: typing.Iterable[str]) -> str:
    hint = torchtitan_hint(section, key)
    return (f"unknown key '{key}' in section [{section}] ({origin})"
            + (f": {hint}" if hint else did_you_mean(key, keys)))


def _build(layers: list[tuple[str, dict[str, dict[str, Any]], bool]]) -> JobConfig:
    """Apply override layers (origin, {section: {key: value}}, from_cli) onto the defaults.
    Every unknown key, wrong type and out-of-range number is collected into one error."""
    config = new_job_config()
    known = sections()
    problems: list[str] = []
    for origin, layer, from_cli in layers:
        for section, values in layer.items():
            if section not in known:
                problems += _unknown_section(section, values, origin, known)
                continue
            target = getattr(config, section)
            hints = typing.get_type_hints(known[section])
            for key, value in values.items():
                table, dot, entry = key.partition(".")
                if dot and typing.get_origin(hints.get(table)) is dict:  # --model.overrides.x=1
                    try:
                        _set_entry(getattr(target, table), hints[table], entry, _coerce(
                            {entry: value}, hints[table], f"[{section}] {key} ({origin})",
                            from_cli)[entry])
                    except ConfigError as e:
                        problems.append(str(e))
                    continue
                if key not in hints:
                    problems.append(_unknown_key(section, key, origin, hints))
                    continue
                where = f"[{section}] {key} ({origin})"
                try:
                    if value is None:  # a bare --flag
                        if hints[key] is not bool:
                            raise ConfigError(
                                f"{where}: needs a value of type {type_name(hints[key])}")
                        value = True
                    setattr(target, key, _coerce(value, hints[key], where, from_cli))
                except ConfigError as e:
                    problems.append(str(e) + value_hint(section, key, value))
    problems += out_of_range(config)
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} problems:\n  " + "\n  ".join(problems))
    return config


def _set_entry(table: dict[str, Any], tp: Any, entry: str, value: Any) -> None:
    """One command-line entry of a table field. In a free-form table (``dict[str, Any]``, e.g.
    [model] overrides) a dotted entry names nested tables as a dotted TOML key does:
    ``--model.overrides.moe.top_k=2`` sets ``overrides["moe"]["top_k"]``, beside what the TOML
    set in ``moe``. Keys of a typed table (``dict[str, float]``) are taken whole."""
    *parents, leaf = entry.split(".") if typing.get_args(tp)[1] is Any else [entry]
    for name in parents:
        if not isinstance(table.get(name), dict):
            table[name] = {}
        table = table[name]
    table[leaf] = value


class _ExitDuringImport(Exception):
    """os._exit called by a module while it was being imported."""


@contextlib.contextmanager
def _exits_refused() -> Iterator[None]:
    """``os._exit`` raises instead of ending the process while the block runs: a user module
    that calls it at import time would otherwise end the job with its status (0: "success",
    nothing trained), skipping every ``finally`` and atexit handler. Restored on the way out."""
    real_exit = os._exit

    def refuse(status: int) -> typing.NoReturn:
        raise _ExitDuringImport(f"called os._exit({status})")

    os._exit = refuse
    try:
        yield
    finally:
        os._exit = real_exit


def _import_one(name: str) -> types.ModuleType:
    if not name.endswith(".py"):
        return importlib.import_module(name)
    path = Path(name).resolve()
    loaded = sys.modules.get(path.stem)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded  # already imported (e.g. by an earlier job in the same process)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise FileNotFoundError(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path.stem]  # half a module: a later import runs it afresh
        raise
    return module


def import_custom_modules(names: list[str]) -> None:
    """Import user modules (dotted names or .py paths) so that they can register models.
    A module that fails, or that tries to end the process (``sys.exit``, ``os._exit``), is a
    ConfigError naming it: a job must not end while reading its config."""
    for name in names:
        import_user_module(name, "[job] custom_import")


def import_user_module(name: str, where: str) -> types.ModuleType:
    """The module ``name`` (a dotted name, or a .py path imported under its file's stem, once
    per process); ConfigError naming ``where`` (the field) if it cannot be imported, fails, or
    tries to end the process (``sys.exit``, ``os._exit``): a job must not end while reading its
    config."""
    try:
        with _exits_refused():
            return _import_one(name)
    except (ImportError, FileNotFoundError) as e:
        raise ConfigError(f"{where}: cannot import {name!r}: {e}") from e
    except (SystemExit, _ExitDuringImport) as e:
        how = f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) else str(e)
        raise ConfigError(f"{where}: {name!r} {how} while being imported; a module named there "
                          "must define (and register), not end the job") from None
    except Exception as e:  # the module's own code failed: name the file and line
        raise ConfigError(f"{where}: {name!r} failed at {_failing_line(e)}: "
                          f"{type(e).__name__}: {e}") from e


def _failing_line(error: BaseException) -> str:
    """``file:line`` of a SyntaxError, else of the innermost frame of the traceback."""
    if isinstance(error, SyntaxError):
        return f"{error.filename}:{error.lineno}"
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return f"{frame.filename}:{frame.lineno}"


def build_job_config(argv: list[str]) -> JobConfig:
    """``--job.config_file`` (with what it extends) + overrides -> JobConfig, type-checked but
    not validated against a world size: what tools that plan for another machine read. Path
    fields come out absolute, read from where the user stands (config/paths.py)."""
    cli: dict[str, dict[str, Any]] = {}
    for key, value in _split_cli(argv):
        section, dot, name = key.partition(".")
        if not dot or not name:
            raise ConfigError(f"override --{key}: expected --section.key=value")
        cli.setdefault(section, {})[name] = value

    base = launch_dir()
    layers: list[tuple[str, dict[str, dict[str, Any]], bool]] = []
    config_file = cli.get("job", {}).get("config_file")
    if config_file:
        layers += [(origin, data, False)
                   for origin, data in _toml_layers(Path(user_path(config_file, base)))]
    layers.append(("command line", cli, True))
    imports = [_coerce(layer["job"]["custom_import"], list[str], f"[job] custom_import ({origin})",
                      from_cli) for origin, layer, from_cli in layers
               if "custom_import" in layer.get("job", {})]
    if imports:  # first: they may register config sections (config/custom_sections.py)
        import_custom_modules(user_imports(imports[-1], base))
    config = _build(layers)
    resolve_paths(config, base)
    return config


coerce = _coerce
"""The same conversion for values checked outside the config's dataclasses (model overrides)."""


def _toml_key(key: str) -> str:
    """A bare TOML key when it may be one, else a quoted one."""
    bare = bool(key) and all(c.isascii() and (c.isalnum() or c in "_-") for c in key)
    return key if bare else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # JSON's string escapes are all TOML basic-string escapes
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    return repr(value)


def to_dict(config: JobConfig) -> dict[str, dict[str, Any]]:
    """Every section (registered ones included) as ``{section: {key: value}}``: the merged
    config trackers record as a run's config."""
    return {section: {f.name: getattr(getattr(config, section), f.name)
                      for f in dataclasses.fields(getattr(config, section))}
            for section in sections()}


def to_toml(config: JobConfig) -> str:
    """The full config as TOML, every field included: what --print_config shows and
    ``{dump_folder}/config.toml`` holds (``--job.config_file`` of it runs the same job)."""
    out = []
    for section, values in to_dict(config).items():
        out.append(f"[{section}]")
        out += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        out.append("")
    return "\n".join(out)


def documented(section: str, name: str, doc: str) -> str:
    """A field's doc, with the parent switch it acts under (config/switches.py)."""
    parent = PARENTS.get((section, name))
    return doc if parent is None else f"{doc} Acts only with {parent.label}."


def help_text() -> str:
    """Every field with its type, default and doc, grouped by section."""
    lines = [
        "usage: run_train.sh [--section.key=value ...]  (or python -m torchtitan_like.train)",
        "",
        "  --job.config_file PATH   TOML file to read; it may name base files with "
        f"top-level `{EXTENDS_KEY} = \"base.toml\"`",
        "  --print_config           print the merged, validated config as TOML and exit",
        "  -h, --help               this text",
        "",
        "Booleans take true/false; lists are comma-separated. The command line wins over the TOML.",
    ]
    defaults = new_job_config()
    for section, cls in sections().items():
        lines += ["", f"[{section}]"]
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = _toml_value(getattr(getattr(defaults, section), f.name))
            lines.append(f"  --{section}.{f.name}  ({type_name(hints[f.name])}, default {default})")
            lines.append(f"      {documented(section, f.name, docs.get(f.name, ''))}")
    return "\n".join(lines)


def reference_markdown() -> str:
    """The config reference page (docs/config_reference.md): one table per built-in section,
    generated from the dataclasses (sections a custom_import registers are its fork's)."""
    out = []
    defaults = new_job_config()
    for section, cls in sections().items():
        if section in custom_sections():
            continue
        docs, hints = field_docs(cls), typing.get_type_hints(cls)
        out += [f"## [{section}]", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            default = _toml_value(getattr(getattr(defaults, section), f.name))
            kind = type_name(hints[f.name]).replace("|", "\\|")
            meaning = documented(section, f.name, docs.get(f.name, "")).replace("|", "\\|")
            out.append(f"| `{f.name}` | {kind} | `{default}` | {meaning} |")
        out.append("")
    return "\n".join(out)


__all__ = [
    "ConfigError",
    "build_job_config",
    "coerce",
    "did_you_mean",
    "field_docs",
    "help_text",
    "import_custom_modules",
    "import_user_module",
    "reference_markdown",
    "sections",
    "to_dict",
    "to_toml",
]
