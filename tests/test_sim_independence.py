"""The simulator is an independent oracle: app/sim imports nothing from the gateway's side.

Every "predicted == engine" check in the suite compares the gateway's prediction with the
simulator's answer. If the simulator rendered, converted, dumped tools or hashed blocks with the
gateway's own code, the two would agree by construction and a shared mistake would pass
(docs/testing-oracles.md). This test walks app/sim's imports (the AST of every module, imports
inside functions and `import_module("...")` calls included) transitively through app/, and fails
on any module of the gateway's prediction and request path.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("app.prefix", "app.hygiene", "app.proxy", "app.api", "app.pipeline", "app.routing", "app.state")


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(root: Path, path: Path) -> set[str]:
    """Every module `path` imports, by absolute dotted name (`from a import b` yields a and a.b)."""
    name = _module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            out.add(node.args[0].value)
    return out


def forbidden_imports(root: Path, start: str = "app.sim") -> list[str]:
    """`importer -> imported` for each forbidden module reached from `start`'s modules."""
    start_dir = root.joinpath(*start.split("."))
    queue = sorted(start_dir.rglob("*.py"))
    seen = {p.resolve() for p in queue}
    problems: list[str] = []
    while queue:
        path = queue.pop()
        for module in sorted(imported_modules(root, path)):
            if not (module == "app" or module.startswith("app.")):
                continue
            if any(module == f or module.startswith(f + ".") for f in FORBIDDEN):
                problems.append(f"{_module_name(root, path)} -> {module}")
                continue
            target = _module_file(root, module)
            if target is not None and target.resolve() not in seen:
                seen.add(target.resolve())
                queue.append(target)
    unique = set(problems)  # `from a.b import c` reaches a.b and a.b.c: name the module once
    return sorted(p for p in unique if not any(p.startswith(q + ".") for q in unique))


def test_app_sim_imports_nothing_from_the_gateway_side() -> None:
    assert forbidden_imports(ROOT) == []


def test_the_walk_finds_direct_relative_nested_dynamic_and_transitive_imports(tmp_path: Path) -> None:
    def write(rel: str, text: str) -> None:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    for package in ("app", "app/sim", "app/prefix", "app/util", "app/proxy", "app/hygiene", "app/state"):
        write(f"{package}/__init__.py", "")
    write("app/prefix/template.py", "")
    write("app/sim/a.py", "from app.prefix.template import render\n")
    write("app/sim/b.py", "def f():\n    from ..proxy import forward\n")
    write("app/sim/c.py", "import importlib\nm = importlib.import_module('app.hygiene.scan')\n")
    write("app/sim/d.py", "from app import util\n")
    write("app/util/__init__.py", "from app.state import store\n")
    write("app/sim/e.py", "from app.prefixes_like_name import x\nimport json\n")  # not app.prefix
    assert forbidden_imports(tmp_path) == [
        "app.sim.a -> app.prefix.template", "app.sim.b -> app.proxy", "app.sim.c -> app.hygiene.scan",
        "app.util -> app.state",
    ]
