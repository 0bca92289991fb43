"""The project's import graph, read from the source (no imports are executed)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Where each folder of the repository installs.
FOLDERS = {"duplex_agent": "duplex_agent", "agent": "duplex_agent.agent", "plugins": "duplex_agent.plugins",
           "webrtc": "duplex_agent.webrtc", "frontend": "duplex_agent.frontend",
           "livekit_agents": "duplex_agent.livekit_agents"}


def module_files() -> dict[str, Path]:
    """Every installed module name -> its file."""
    found: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "node_modules" in path.parts:
                continue
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_edges(include_type_checking: bool = True) -> dict[str, set[str]]:
    """module -> the project modules it imports (at any depth of its code)."""
    files = module_files()
    edges: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip: set[int] = set()
        if not include_type_checking:
            for node in ast.walk(tree):
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    skip.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(name, node, path.name == "__init__.py")
                targets = [f"{source}.{alias.name}" for alias in node.names] + [source]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("duplex_agent"):
                    edges[name].add(target)
    return edges


def package_of(module: str, files: dict[str, Path]) -> str:
    return module if files[module].name == "__init__.py" else module.rpartition(".")[0]


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as a list of nodes, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None
