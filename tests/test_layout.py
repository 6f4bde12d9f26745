"""The package's rooms: no folder-level import cycle, and the layers below the engine import
nothing above them (autospec/__init__.py draws the order)."""
import ast
import re
from pathlib import Path

import pytest

from conftest import REPO_ROOT

LAYERS = ["models", "drafters", "controller", "engine"]  # each imports only those before it


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
