"""No two modules of the package know each other, not even for their annotations.

test_import_graph.py leaves the imports under ``if TYPE_CHECKING:`` out: they never execute,
so they close no circle at run time. They are still a dependency for a reader and a type
checker: two modules that name each other's types are one module split in two, and which of
them to read first has no answer. Here those imports count too: every import of the run-time
graph plus every one under ``TYPE_CHECKING``, and the graph must have no circle. A type both
sides need lives in a third module both import.
"""

from __future__ import annotations

import ast

from test_import_graph import (
    ROOT,
    _is_type_checking,
    _targets,
    find_cycle,
    import_graph,
    module_name,
)


def type_checking_graph() -> dict[str, set[str]]:
    """Every module -> the package modules it imports under ``if TYPE_CHECKING:``."""
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        blocks = [node for node in ast.walk(tree)
                  if isinstance(node, ast.If) and _is_type_checking(node)]
        imports = [node for block in blocks for statement in block.body
                   for node in ast.walk(statement) if isinstance(node, ast.Import | ast.ImportFrom)]
        graph[name] = set().union(*(_targets(node, name, path.name == "__init__.py", modules)
                                    for node in imports))
    return graph


def full_graph() -> dict[str, set[str]]:
    """The run-time graph (test_import_graph.py) with the type-only imports added."""
    graph, typed = import_graph(), type_checking_graph()
    return {module: targets | typed.get(module, set()) for module, targets in graph.items()}


def test_type_only_imports_are_seen():
    """llama3's args name JobConfig in annotations only: an edge here, none at run time."""
    args, job_config = "torchtitan_like.models.llama3.args", "torchtitan_like.config.job_config"
    assert job_config in type_checking_graph()[args]
    assert job_config not in import_graph()[args] and job_config in full_graph()[args]


def test_no_circles_counting_type_only_imports():
    cycle = find_cycle(full_graph())
    assert cycle is None, ("modules that know each other (imports under TYPE_CHECKING "
                           "included): " + " -> ".join(cycle or []))
