"""The package's rooms: no folder-level import cycle, no module-level one either (counting the
imports inside functions), the layers below the engine import nothing above them
(autospec/__init__.py draws the order), and no module over MAX_LINES lines."""
import ast
import re
from pathlib import Path

import pytest

from conftest import REPO_ROOT

LAYERS = ["models", "drafters", "controller", "engine"]  # each imports only those before it
# the package's folders: autospec/, and those pyproject.toml's package-dir maps into it
PACKAGE_DIRS = {"autospec": "autospec", "autospec.store": "store", "autospec.kernels": "kernels",
                "autospec.configs": "configs"}
MAX_LINES = 400  # a module longer than this is split (each part a module of its own)


def module_level(tree: ast.AST):
    """The nodes that run on import: all but function bodies."""
    for child in ast.iter_child_nodes(tree):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield child
            yield from module_level(child)


def room_graph(lazy: bool = True) -> dict[str, set[str]]:
    """room -> rooms it imports (module-level `import autospec.X...`, and function-level ones
    too when `lazy`). A room is a folder of autospec/ or a top-level module; cli/ (the top) and
    training/ are left out."""
    edges: dict[str, set[str]] = {}
    for path in (REPO_ROOT / "autospec").rglob("*.py"):
        parts = path.relative_to(REPO_ROOT / "autospec").with_suffix("").parts
        room = parts[0]
        if room in ("cli", "training", "__init__", "__main__"):
            continue
        tree = ast.parse(path.read_text())
        for node in (ast.walk(tree) if lazy else module_level(tree)):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                target = name.split(".")
                if target[0] == "autospec" and len(target) > 1 and target[1] not in (room, "cli"):
                    edges.setdefault(room, set()).add(target[1])
    return edges


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one room."""
    def reach(a):
        seen, todo = set(), [a]
        while todo:
            for b in edges.get(todo.pop(), ()):
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen
    rooms = set(edges) | {b for bs in edges.values() for b in bs}
    reachable = {r: reach(r) for r in rooms}
    found = []
    for r in sorted(rooms):
        comp = {r} | {s for s in reachable[r] if r in reachable[s]}
        if len(comp) > 1 and comp not in found:
            found.append(comp)
    return found


def test_no_folder_level_import_cycle():
    assert cycles(room_graph(lazy=False)) == []
    assert cycles(room_graph()) == []


def package_modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package's __init__.py by the
    package's), cli/ and training/ included."""
    modules = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in (REPO_ROOT / folder).rglob("*.py"):
            parts = path.relative_to(REPO_ROOT / folder).with_suffix("").parts
            if package == "autospec" and ".".join((package, parts[0])) in PACKAGE_DIRS:
                continue
            name = ".".join((package, *parts))
            modules[name.removesuffix(".__init__")] = path
    return modules


def module_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: the import's line}, counting every import in the file:
    at the top, inside functions, under TYPE_CHECKING. `from P import n` imports P.n where that
    is a module, else P; a relative import is resolved against the importer's package."""
    modules = package_modules()

    def known(name: str) -> str | None:  # the module `name` is, or the nearest one holding it
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [known(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(filter(None, [package.rsplit(".", node.level - 1)[0]
                                                  if node.level > 1 else package, base]))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules
                           else known(base) for alias in node.names]
            else:
                continue
            for target in targets:
                if target is not None and target != module:
                    graph.setdefault(module, {}).setdefault(target, node.lineno)
    return graph


def shortest_circle(graph: dict[str, dict[str, int]], start: str) -> list[str]:
    """The shortest circle of imports from `start` back to it: [start, ..., start]."""
    came_from: dict[str, str] = {}
    todo = [start]
    while todo:
        module = todo.pop(0)
        for target in sorted(graph.get(module, ())):
            if target == start:
                path = [module]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target not in came_from:
                came_from[target] = module
                todo.append(target)
    return []


def test_no_module_level_import_circle():
    """No two modules import each other, directly or around a circle, not even through an
    import inside a function: the shared piece lives in a module both import, or in the lower
    one."""
    graph = module_graph()
    circles = [shortest_circle(graph, min(component))
               for component in cycles({a: set(b) for a, b in graph.items()})]
    assert not circles, "import circles (module -> module it imports, at that line):\n" + "\n".join(
        " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(circle, circle[1:]))
        + f" -> {circle[-1]}" for circle in circles)


def test_every_module_is_at_most_max_lines_long():
    long = {str(path.relative_to(REPO_ROOT)): lines for path in package_modules().values()
            if (lines := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def test_the_lower_layers_import_only_layers_below_them():
    for i, layer in enumerate(LAYERS):
        upward = graph_of(layer) & set(LAYERS[i + 1:])
        assert not upward, f"{layer} imports a layer above it: {upward}"


BLOCKED_IMPORT = """
import importlib, pkgutil, sys
layer, blocked = sys.argv[1], sys.argv[2:]

class Above:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ImportError(f"{name} is above autospec.{layer}")

sys.meta_path.insert(0, Above())
package = importlib.import_module(f"autospec.{layer}")
for module in pkgutil.iter_modules(package.__path__):
    importlib.import_module(f"autospec.{layer}.{module.name}")
"""


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_a_lower_layer_imports_with_the_layers_above_it_blocked(layer):
    """The static check above, for real: every module of the layer, in a fresh interpreter."""
    import subprocess
    import sys
    above = [f"autospec.{name}" for name in LAYERS[LAYERS.index(layer) + 1:]]
    run = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT, layer, *above],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_controller_room_is_the_fast_path_only():
    """controller/ imports no store, daemon, bench, serve or tune: the per-step path does no I/O."""
    assert not graph_of("controller") & {"store", "daemon", "bench", "serve", "tune"}


def graph_of(room: str, lazy: bool = True) -> set[str]:
    return room_graph(lazy).get(room, set())


def test_per_user_locations_are_declared_only_in_paths():
    """autospec/paths.py owns every per-user location: elsewhere no `~`, no home directory."""
    pattern = re.compile(r"expanduser|Path\.home\(|~/")
    found = [f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
             for folder in ("autospec", "store", "kernels")
             for path in (REPO_ROOT / folder).rglob("*.py")
             if path != REPO_ROOT / "autospec" / "paths.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, "use autospec.paths instead:\n" + "\n".join(found)
