"""The package's rooms: no folder-level import cycle beyond the one still open (engine, drafters
and models share primitives: sampling, KV plumbing, weight sizes); none may be added."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KNOWN_CYCLES = [{"drafters", "engine", "models"}]  # to be split, not to grow


def room_graph() -> dict[str, set[str]]:
    """room -> rooms it imports (module- or function-level `import autospec.X...`). A room is a
    folder of autospec/ or a top-level module; cli/ (the top) and training/ are left out, and
    deprecated shims import lazily (importlib), so they add no edge."""
    edges: dict[str, set[str]] = {}
    for path in (ROOT / "autospec").rglob("*.py"):
        parts = path.relative_to(ROOT / "autospec").with_suffix("").parts
        room = parts[0]
        if room in ("cli", "training", "__init__", "__main__"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
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


def test_no_new_folder_level_import_cycle():
    assert cycles(room_graph()) == KNOWN_CYCLES


@pytest.mark.parametrize("module", ["controller.learned", "controller.trace", "controller.policies",
                                    "daemon.client"])
def test_moved_modules_keep_their_old_import_path(module):
    import importlib
    old = importlib.import_module(f"autospec.{module}")
    name = {"controller.learned": "Learner", "controller.trace": "replay",
            "controller.policies": "make_policy", "daemon.client": "DaemonClient"}[module]
    assert callable(getattr(old, name))


def test_the_controller_room_is_the_fast_path_only():
    """controller/ imports no store, daemon, bench, serve or tune: the per-step path does no I/O."""
    assert not graph_of("controller") & {"store", "daemon", "bench", "serve", "tune"}


def graph_of(room: str) -> set[str]:
    return room_graph().get(room, set())


def test_per_user_locations_are_declared_only_in_paths():
    """autospec/paths.py owns every per-user location: elsewhere no `~`, no home directory."""
    pattern = re.compile(r"expanduser|Path\.home\(|~/")
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for folder in ("autospec", "store", "kernels") for path in (ROOT / folder).rglob("*.py")
             if path != ROOT / "autospec" / "paths.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, "use autospec.paths instead:\n" + "\n".join(found)
