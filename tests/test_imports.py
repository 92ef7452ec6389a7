"""No import circle in the house: the modules of common/, comparison/ and models/ (and the scripts
that import them) form a graph without a cycle, so each module can be read after the ones it
imports. Every import counts, wherever it stands: at the top, inside a function (an import deferred
to dodge a circle is still one) or under `if TYPE_CHECKING:` (a type that needs its module is a
dependency on it)."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

HOUSE = ("common", "comparison", "models")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def house_modules(root: Path) -> dict[str, Path]:
    """Every module of the house's packages, and every other Python file outside tests/ (the
    scripts)."""
    files = [path for path in root.rglob("*.py")
             if not {"tests", ".git"} & set(path.relative_to(root).parts)]
    return {module_name(path, root): path for path in files}


def imports_of(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that the file `path` (module `name`) imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [f"{module}.{alias.name}" for alias in node.names]  # a name may be a module
            targets = [module, *names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import common.loop` depends on common.loop
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = house_modules(root)
    return {name: imports_of(path, name, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import each other (a strongly connected
    component of more than one module), as the path a -> b -> ... -> a."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(cycle_in(set(group), graph))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def cycle_in(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A path from the group's first module back to itself, through the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        module = frontier.pop(0)
        for other in sorted(graph[module] & group):
            if other == start:
                return paths[module] + [start]
            if other not in paths:
                paths[other] = paths[module] + [other]
                frontier.append(other)
    raise AssertionError(f"no cycle through {sorted(group)}")


def test_the_house_has_no_import_circle():
    graph = import_graph(REPO)
    packages = {name.split(".")[0] for name in graph}
    assert set(HOUSE) <= packages and {"compare", "dist_parallel.train"} <= set(graph)
    assert "common.checkpoint" in graph["common.loop"]  # the graph holds the house's imports
    assert "common.config" in graph["common.data"]
    found = circles(graph)
    assert not found, "import circles: " + "; ".join(" -> ".join(cycle) for cycle in found)


def test_a_circle_is_found_wherever_its_imports_stand(tmp_path):
    """The check above can fail: a deferred import and a TYPE_CHECKING one close circles too."""
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "a.py").write_text("from common.b import B\n")
    (tmp_path / "common" / "b.py").write_text("def f():\n    from common import c\n")
    (tmp_path / "common" / "c.py").write_text("from typing import TYPE_CHECKING\n"
                                               "if TYPE_CHECKING:\n    import common.a\n")
    (tmp_path / "common" / "d.py").write_text("import common.a\n")  # outside the circle
    assert circles(import_graph(tmp_path)) == [["common.a", "common.b", "common.c", "common.a"]]
