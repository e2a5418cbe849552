"""The package's rooms: no module imports itself back through others (an import circle), whether at load time,
inside a function or for type checking only, and the host side never reaches into the gateware it talks to."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("frontend", "quant", "rtl", "sim", "boards", "host", "examples")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("hardwire", *parts[:-1])) if parts[-1] == "__init__" else ".".join(("hardwire", *parts))


def _imports(path: Path) -> set[str]:
    """hardwire modules a file imports anywhere in it (`from . import x` counts x when x is a module)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("hardwire")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("hardwire"):
                target = node.module
            else:
                continue
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    files = [ROOT / name for name in ("cli.py", "demo.py", "progress.py", "__init__.py")]
    files += [path for package in PACKAGES for path in sorted((ROOT / package).glob("*.py"))]
    modules = {_module_name(path): path for path in files}
    return {name: {dep for dep in _imports(path) if dep in modules and dep != name} for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the modules around it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep):], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_itself_back() -> None:
    graph = _graph()
    assert len(graph) > 60  # every room was read
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_circle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_host_programs_do_not_import_gateware_tops() -> None:
    """The host talks to a board over its protocol: it may model the board's link (boards.host_link's buffer
    depth) but never builds a board top or runs the FPGA flow."""
    graph = _graph()
    for name, deps in graph.items():
        if name.startswith("hardwire.host."):
            assert not deps & {"hardwire.boards.top", "hardwire.boards.fpga", "hardwire.boards.core"}, (name, deps)
