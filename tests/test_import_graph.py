"""The import graph of app/: no cycle, and imports point down the layers of docs/pipeline.md.

Every import counts, type-only (`if TYPE_CHECKING:`) and function-local ones included: a knot a
type checker needs is still a knot a newcomer has to untie. The graph is read from the source
(ast), the same way the repository's before-stop hook reads it, so nothing is imported here.
"""

from __future__ import annotations

import ast
import pathlib

APP = pathlib.Path(__file__).resolve().parent.parent / "app"

# Layers, lowest first (docs/pipeline.md, "Layers"). A module belongs to the longest prefix listed;
# it may import its own layer and the ones below. Cycles are refused inside a layer too.
LAYERS: list[tuple[str, ...]] = [
    # 0 foundation: settings, metrics, the one error type, task, thread and server helpers
    ("app", "app.config", "app.errors", "app.tasks", "app.offloop", "app.telemetry", "app.serving", "app.assets"),
    # 1 pure cores: prompt -> blocks, hygiene findings and rewrites (no I/O of the request path)
    ("app.prefix", "app.hygiene"),
    # 2 state: the Store protocol and its implementations
    ("app.state",),
    # 3 routing: replicas, residency, scorers, routers, the load owner
    ("app.routing",),
    # 4 engines: scraping and KV events of the replicas (feed routing)
    ("app.engines",),
    # 5 admission: limits and the gateway queue (a policy over replicas, like routing)
    ("app.admission",),
    # 6 proxy: the request context and the transport (forward, relay, stream shapes, record), and
    # the client APIs' dialects (parse, prompt, hygiene hooks, stream and error shapes)
    ("app.proxy", "app.dialects"),
    # 7 pipeline: the stages and the step order
    ("app.pipeline",),
    # 8 the shared-parts record the adapters are handed
    ("app.services",),
    # 9 adapters: the ASGI hot path and control plane, the EPP's ext_proc exchange, the UI pages
    ("app.api", "app.epp", "app.ui"),
    # 10 wiring and commands: what builds the parts and what a CLI command runs
    ("app.server", "app.serve", "app.workers", "app.cli", "app.__main__", "app.demo", "app.benchcmd",
     "app.doctor", "app.sim", "app.epp.server", "app.prefix.lint", "app.routing.components"),
]

# The only imports that run upward, each with why it stays (at most 4).
UPWARD: dict[tuple[str, str], str] = {
    # config's memory budget default is the prefix core's (one number, defined beside the caps it
    # is split into); config is otherwise below everything
    ("app.config", "app.prefix.budget"): "the memory budget's default lives with its split",
    # the Store keeps the recent-share counts fleet-wide (memory and Redis alike); their decay
    # arithmetic stays beside the router that reads them (app/routing/recent.py)
    ("app.state.memory", "app.routing.recent"): "the stores keep routing's recent-share counts",
    ("app.state.redis", "app.routing.recent"): "the stores keep routing's recent-share counts",
}


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for f in APP.rglob("*.py"):
        parts = list(f.relative_to(APP.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the app modules it imports (anywhere in its source)."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("app"):
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                         for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("app")]
            for name in names:
                target = resolve(name)
                if target and target != module:
                    deps.add(target)
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for nxt in children:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def layer_of(module: str) -> int:
    best, layer = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), i
    assert layer >= 0, f"{module} is in no layer: add it to LAYERS and docs/pipeline.md"
    return layer


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(m, d) for m, deps in graph.items() for d in deps if layer_of(d) > layer_of(m)}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_app_has_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles in app/ (type-only imports count too): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_every_module_has_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_imports_run_down_the_layers_but_for_the_explained_few() -> None:
    assert len(UPWARD) <= 4
    found = upward(import_graph())
    unexplained = sorted(found - set(UPWARD))
    assert not unexplained, "imports that run up the layers (docs/pipeline.md, 'Layers'): " + ", ".join(
        f"{m} -> {d}" for m, d in unexplained)
    assert found == set(UPWARD), f"no longer upward, drop from UPWARD: {sorted(set(UPWARD) - found)}"
