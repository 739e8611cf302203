"""The package's import graph: no circles, and every import points down the layers.

``LAYERS`` is the layer table (docs/design.md, "Layers"), bottom to top: a module may import
its own layer and those below it, never one above. Inside a layer any import is allowed as long
as it closes no circle.

Every module of ``torchtitan_like`` is parsed (not imported) with ``ast``, and every import
statement counts, including those inside functions (a lazy import is still a dependency; it only
hides a circle until the function runs). Imports under ``if TYPE_CHECKING:`` are left out: they
never execute, and with ``from __future__ import annotations`` they only name types. So are
imports under ``if __name__ == "__main__":``: that block runs only when the file is the program
(``python -m``), as a module ``__main__`` apart from the package's own copy of it, so it is the
top of the stack, above every layer, and closes no circle (``python -m torchtitan_like.train``
runs entry.py's ``main``). The implicit
edge from a submodule to its parent package's ``__init__`` is left out too: Python registers the
package before running its ``__init__``, so reaching a sibling through the package is no circle.

One import is also run: the trainer's and preflight's, which must not load ``torch._dynamo``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import torchtitan_like

PACKAGE = "torchtitan_like"
ROOT = Path(torchtitan_like.__file__).parent

LAYERS = (
    ("config", "logging", "exit_codes"),
    ("protocols",),
    ("distributed",),
    ("models",),
    ("components",),
    ("validate", "train", "failure_report"),
    ("entry",),
    ("preflight", "launch", "tools"),
)
"""Bottom to top: the first part of a module's name below the package gives its layer."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_main_block(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and (_is_type_checking(node) or _is_main_block(node)):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _targets(node: ast.Import | ast.ImportFrom, this: str, is_package: bool,
             modules: set[str]) -> set[str]:
    """The package modules one import statement loads (``from a import b`` loads ``a.b`` when
    ``b`` is a submodule, else ``a``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = this.split(".")
            anchor = anchor if is_package else anchor[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
    found = set()
    for name in names:
        while name and name not in modules:  # `import a.b.c` of a non-module attribute
            name = name.rpartition(".")[0]
        if name.startswith(PACKAGE) and name != this:
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(files)
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[name] = set().union(*(_targets(node, name, is_package, modules)
                                    for node in _runtime_imports(tree)))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path ``a -> b -> ... -> a``, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_graph_sees_lazy_imports():
    graph = import_graph()
    assert "torchtitan_like.config.manager" in graph["torchtitan_like.validate"]
    assert graph["torchtitan_like.train"], "the trainer imports the package"


def test_a_main_block_is_the_program_not_an_import():
    """train.py's ``__main__`` block runs entry.py (a layer above), the module that imports
    it: the block is left out, every other import of the file counts."""
    tree = ast.parse('import a\nif __name__ == "__main__":\n    import b\n')
    assert [n.names[0].name for n in _runtime_imports(tree)] == ["a"]
    graph = import_graph()
    assert "torchtitan_like.entry" not in graph["torchtitan_like.train"]
    assert "torchtitan_like.train" in graph["torchtitan_like.entry"]


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def layer_of(module: str) -> int | None:
    """The index in ``LAYERS`` of a package module; None for the package itself."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return next((i for i, layer in enumerate(LAYERS) if parts[1] in layer), -1)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every runtime import of a module in a higher layer, as ``a -> b``."""
    return [f"{module} -> {target}" for module, targets in sorted(graph.items())
            for target in sorted(targets)
            if (here := layer_of(module)) is not None and (there := layer_of(target)) is not None
            and there > here]


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in import_graph() if layer_of(m) == -1)
    assert not unplaced, f"modules outside the layer table (LAYERS): {unplaced}"


def test_no_import_points_up_the_layers():
    upward = upward_imports(import_graph())
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_upward_imports_are_seen():
    graph = {f"{PACKAGE}.models.a": {f"{PACKAGE}.components.b", f"{PACKAGE}.distributed.c"},
             f"{PACKAGE}.components.b": set(), f"{PACKAGE}.distributed.c": set()}
    assert upward_imports(graph) == [f"{PACKAGE}.models.a -> {PACKAGE}.components.b"]


def test_config_imports_only_itself():
    graph = import_graph()
    outside = {
        module: sorted(t for t in targets if not t.startswith(f"{PACKAGE}.config"))
        for module, targets in graph.items() if module.startswith(f"{PACKAGE}.config")
    }
    assert not any(outside.values()), f"config/ imports above itself: {outside}"


def test_find_cycle_reports_the_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_job_without_pp_or_compile_does_not_import_dynamo():
    """The trainer and preflight load neither ``torch._dynamo`` nor inductor (0.3 s of every
    process's start): torch's pipelining, which imports them, is imported by a PP job only
    (distributed/pipeline_schedule.py), compile by a job that compiles."""
    code = ("import sys, torchtitan_like.train, torchtitan_like.preflight; "
            "print(sorted(m for m in ('torch._dynamo', 'torch._inductor', "
            "'torch.distributed.pipelining') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True, cwd=ROOT.parent)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
